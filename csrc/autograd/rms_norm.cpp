// rms_norm autograd: y = x * rstd * w; the gradients from baracuda::rms_norm_backward
// (dx = rstd * (dy * w) - x * rstd^3 * mean(dy * w * x), dw = sum over rows of dy * x * rstd),
// with output_mask set from the inputs autograd needs. rms_norm_backward has no gradient.
#include <array>
#include <optional>
#include <tuple>

#include "function.h"

namespace baracuda::autograd {
namespace {

using RMSNormSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::SymIntArrayRef,
                                                      const std::optional<at::Tensor>&, std::optional<double>);
using RMSNormBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                              c10::SymIntArrayRef, const at::Tensor&,
                                                              const std::optional<at::Tensor>&, std::array<bool, 2>);

const c10::TypedOperatorHandle<RMSNormSig>& forward_op() {
  static const auto op = op_handle<RMSNormSig>("rms_norm");
  return op;
}

const c10::TypedOperatorHandle<RMSNormBackwardSig>& backward_op() {
  static const auto op = op_handle<RMSNormBackwardSig>("rms_norm_backward");
  return op;
}

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    auto [output, rstd] = call_below_autograd(forward_op(), input, normalized_shape, weight, eps);
    no_zero_grads(ctx);
    ctx->mark_non_differentiable({rstd});
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->save_for_backward({input, weight.value_or(at::Tensor()), rstd});
    return {output, rstd};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[1];
    // Autograd's inputs (edges): input, then weight when given.
    const std::array<bool, 2> mask{ctx->needs_input_grad(0), weight.defined() && ctx->needs_input_grad(1)};
    at::Tensor grad_input, grad_weight;
    if (grads[0].defined() && (mask[0] || mask[1])) {
      std::tie(grad_input, grad_weight) =
          backward_op().call(grads[0], saved[0], ctx->saved_data["normalized_shape"].toSymIntVector(), saved[2],
                             weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, mask);
    }
    return {grad_input, at::Tensor(), grad_weight, at::Tensor()};
  }
};

class RMSNormBackwardFunction : public torch::autograd::Function<RMSNormBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& input,
                               c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                               const std::optional<at::Tensor>& weight, std::array<bool, 2> output_mask) {
    auto [grad_input, grad_weight] =
        call_below_autograd(backward_op(), grad_out, input, normalized_shape, rstd, weight, output_mask);
    // A Function's outputs are defined tensors: the ones output_mask asks for (rms_norm_backward_autograd).
    variable_list outputs;
    for (const at::Tensor& t : {grad_input, grad_weight}) {
      if (t.defined()) outputs.push_back(t);
    }
    return outputs;
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "baracuda::rms_norm_backward: double backward (the gradient of rms_norm's "
                                "gradient) is not supported");
  }
};

std::tuple<at::Tensor, at::Tensor> rms_norm_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                                                     const std::optional<at::Tensor>& weight,
                                                     std::optional<double> eps) {
  if (!needs_node(input, weight)) return call_below_autograd(forward_op(), input, normalized_shape, weight, eps);
  auto out = RMSNormFunction::apply(input, normalized_shape, weight, eps);
  return {std::move(out[0]), std::move(out[1])};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_autograd(const at::Tensor& grad_out, const at::Tensor& input,
                                                              c10::SymIntArrayRef normalized_shape,
                                                              const at::Tensor& rstd,
                                                              const std::optional<at::Tensor>& weight,
                                                              std::array<bool, 2> output_mask) {
  if (!needs_node(grad_out, input, rstd, weight)) {
    return call_below_autograd(backward_op(), grad_out, input, normalized_shape, rstd, weight, output_mask);
  }
  auto out = RMSNormBackwardFunction::apply(grad_out, input, normalized_shape, rstd, weight, output_mask);
  const bool computes_weight = output_mask[1] && weight.has_value() && weight->defined();
  size_t k = 0;
  at::Tensor grad_input = output_mask[0] ? std::move(out[k++]) : at::Tensor();
  at::Tensor grad_weight = computes_weight ? std::move(out[k++]) : at::Tensor();
  return {std::move(grad_input), std::move(grad_weight)};
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("rms_norm", &baracuda::autograd::rms_norm_autograd);
  m.impl("rms_norm_backward", &baracuda::autograd::rms_norm_backward_autograd);
}
