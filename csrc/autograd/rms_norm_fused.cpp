// rms_norm_fused autograd: y = h * rstd * (w + offset), h = input + residual (or the input);
// the gradients from baracuda::rms_norm_fused_backward (dh = rstd * g - h * rstd^3 * mean(g * h)
// + d(residual_out) with g = dy * (w + offset), dw = sum over rows of dy * x_hat), output_mask set
// from the inputs autograd needs. When the residual has the input's dtype, dh is one tensor
// returned for both. rms_norm_fused_backward has no gradient.
#include <ATen/ops/zeros.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

#include "function.h"

namespace baracuda::autograd {
namespace {

using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using FusedSig = Tensor3(const at::Tensor&, const std::optional<at::Tensor>&, c10::SymIntArrayRef,
                         const std::optional<at::Tensor>&, std::optional<double>, double, c10::string_view);
using FusedBackwardSig = Tensor3(const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
                                 c10::SymIntArrayRef, const at::Tensor&, const std::optional<at::Tensor>&, double,
                                 c10::string_view, at::ScalarType, std::array<bool, 3>);

const c10::TypedOperatorHandle<FusedSig>& forward_op() {
  static const auto op = op_handle<FusedSig>("rms_norm_fused");
  return op;
}

const c10::TypedOperatorHandle<FusedBackwardSig>& backward_op() {
  static const auto op = op_handle<FusedBackwardSig>("rms_norm_fused_backward");
  return op;
}

class RMSNormFusedFunction : public torch::autograd::Function<RMSNormFusedFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const std::optional<at::Tensor>& residual, c10::SymIntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, std::optional<double> eps,
                               double weight_offset, c10::string_view casting) {
    auto [output, h, rstd] =
        call_below_autograd(forward_op(), input, residual, normalized_shape, weight, eps, weight_offset, casting);
    no_zero_grads(ctx);
    const bool has_residual = residual.has_value() && residual->defined();
    if (has_residual) {
      ctx->mark_non_differentiable({rstd});
    } else {
      ctx->mark_non_differentiable({h, rstd});  // h is the empty [0] placeholder
    }
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->saved_data["weight_offset"] = weight_offset;
    ctx->saved_data["casting"] = std::string(casting);
    ctx->saved_data["input_dtype"] = input.scalar_type();
    ctx->saved_data["output_dtype"] = output.scalar_type();
    ctx->saved_data["has_residual"] = has_residual;
    ctx->saved_data["same_dtype"] = has_residual && residual->scalar_type() == input.scalar_type();
    ctx->save_for_backward({has_residual ? h : input, weight.value_or(at::Tensor()), rstd});
    return {output, h, rstd};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const bool has_residual = ctx->saved_data["has_residual"].toBool();
    const bool same_dtype = ctx->saved_data["same_dtype"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& weight = saved[1];
    // Autograd's inputs (edges): input, residual when given, weight when given.
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_r = has_residual && ctx->needs_input_grad(1);
    const bool need_w = weight.defined() && ctx->needs_input_grad(has_residual ? 2 : 1);
    const std::array<bool, 3> mask{need_x || (same_dtype && need_r), !same_dtype && need_r, need_w};
    const at::Tensor grad_h = has_residual ? grads[1] : at::Tensor();
    at::Tensor grad_input, grad_residual, grad_weight;
    if ((grads[0].defined() || grad_h.defined()) && (mask[0] || mask[1] || mask[2])) {
      const at::Tensor grad_y = grads[0].defined()
                                    ? grads[0]
                                    : at::zeros_symint(h.sym_sizes(), h.options().dtype(
                                                                          ctx->saved_data["output_dtype"].toScalarType()));
      std::tie(grad_input, grad_residual, grad_weight) = backward_op().call(
          grad_y, given(grad_h), h, ctx->saved_data["normalized_shape"].toSymIntVector(), saved[2], given(weight),
          ctx->saved_data["weight_offset"].toDouble(), ctx->saved_data["casting"].toStringRef(),
          ctx->saved_data["input_dtype"].toScalarType(), mask);
      if (same_dtype) grad_residual = grad_input;
    }
    return {need_x ? grad_input : at::Tensor(), need_r ? grad_residual : at::Tensor(), at::Tensor(), grad_weight,
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class RMSNormFusedBackwardFunction : public torch::autograd::Function<RMSNormFusedBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_out,
                               const std::optional<at::Tensor>& grad_residual_out, const at::Tensor& h,
                               c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                               const std::optional<at::Tensor>& weight, double weight_offset,
                               c10::string_view casting, at::ScalarType input_dtype,
                               std::array<bool, 3> output_mask) {
    auto [grad_input, grad_residual, grad_weight] =
        call_below_autograd(backward_op(), grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                            weight_offset, casting, input_dtype, output_mask);
    // A Function's outputs are defined tensors: the ones output_mask asks for (fused_backward_autograd).
    variable_list outputs;
    for (const at::Tensor& t : {grad_input, grad_residual, grad_weight}) {
      if (t.defined()) outputs.push_back(t);
    }
    return outputs;
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "baracuda::rms_norm_fused_backward: double backward (the gradient of "
                                "rms_norm_fused's gradient) is not supported");
  }
};

Tensor3 fused_autograd(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                       c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                       std::optional<double> eps, double weight_offset, c10::string_view casting) {
  if (!needs_node(input, residual, weight)) {
    return call_below_autograd(forward_op(), input, residual, normalized_shape, weight, eps, weight_offset, casting);
  }
  auto out = RMSNormFusedFunction::apply(input, residual, normalized_shape, weight, eps, weight_offset, casting);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

Tensor3 fused_backward_autograd(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out,
                                const at::Tensor& h, c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                                const std::optional<at::Tensor>& weight, double weight_offset,
                                c10::string_view casting, at::ScalarType input_dtype,
                                std::array<bool, 3> output_mask) {
  if (!needs_node(grad_out, grad_residual_out, h, rstd, weight)) {
    return call_below_autograd(backward_op(), grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                               weight_offset, casting, input_dtype, output_mask);
  }
  auto out = RMSNormFusedBackwardFunction::apply(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                 weight_offset, casting, input_dtype, output_mask);
  const bool has_weight = weight.has_value() && weight->defined();
  const std::array<bool, 3> present{output_mask[0], output_mask[1], output_mask[2] && has_weight};
  std::array<at::Tensor, 3> grads;
  size_t k = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (present[i]) grads[i] = std::move(out[k++]);
  }
  return {std::move(grads[0]), std::move(grads[1]), std::move(grads[2])};
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("rms_norm_fused", &baracuda::autograd::fused_autograd);
  m.impl("rms_norm_fused_backward", &baracuda::autograd::fused_backward_autograd);
}
