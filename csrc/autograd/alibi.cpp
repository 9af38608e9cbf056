// alibi autograd: y = scores + slopes[h] * (j - i). d scores = dy, passed on as it is (no
// copy); d slopes[h] = sum_{b,i,j} dy * (j - i) from baracuda::alibi_backward with
// output_mask [False, True]. alibi_backward is linear in grad: its gradient is
// d grad = gg_scores + gg_slopes[h] * (j - i) = alibi(gg_scores, gg_slopes), none for slopes.
// alibi_inplace has alibi's gradients.
#include <ATen/ops/zeros.h>

#include <array>
#include <tuple>

#include "function.h"

namespace baracuda::autograd {
namespace {

using AlibiSig = at::Tensor(const at::Tensor&, const at::Tensor&);
using AlibiInplaceSig = void(const at::Tensor&, const at::Tensor&);
using AlibiBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                            std::array<bool, 2>);

const c10::TypedOperatorHandle<AlibiSig>& alibi_op() {
  static const auto op = op_handle<AlibiSig>("alibi");
  return op;
}

const c10::TypedOperatorHandle<AlibiBackwardSig>& alibi_backward_op() {
  static const auto op = op_handle<AlibiBackwardSig>("alibi_backward");
  return op;
}

const c10::TypedOperatorHandle<AlibiInplaceSig>& alibi_inplace_op() {
  static const auto op = op_handle<AlibiInplaceSig>("alibi_inplace");
  return op;
}

class AlibiFunction : public torch::autograd::Function<AlibiFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores, const at::Tensor& slopes) {
    no_zero_grads(ctx);
    if (slopes.requires_grad()) ctx->save_for_backward({slopes});
    return {call_below_autograd(alibi_op(), scores, slopes)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const at::Tensor& grad = grads[0];
    at::Tensor grad_scores, grad_slopes;
    if (grad.defined()) {
      if (ctx->needs_input_grad(0)) grad_scores = grad;
      if (ctx->needs_input_grad(1)) {
        grad_slopes = std::get<1>(alibi_backward_op().call(grad, ctx->get_saved_variables()[0], {false, true}));
      }
    }
    return {grad_scores, grad_slopes};
  }
};

class AlibiBackwardFunction : public torch::autograd::Function<AlibiBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& slopes,
                               std::array<bool, 2> output_mask) {
    no_zero_grads(ctx);
    ctx->saved_data["grad_shape"] = grad.sym_sizes();
    ctx->saved_data["grad_dtype"] = grad.scalar_type();
    ctx->saved_data["output_mask"] = c10::List<bool>({output_mask[0], output_mask[1]});
    auto [grad_scores, grad_slopes] = call_below_autograd(alibi_backward_op(), grad, slopes, output_mask);
    // A Function's outputs are defined tensors: the ones output_mask asks for (alibi_backward_autograd).
    variable_list outputs;
    for (const at::Tensor& t : {grad_scores, grad_slopes}) {
      if (t.defined()) outputs.push_back(t);
    }
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto mask = ctx->saved_data["output_mask"].toBoolList();
    at::Tensor gg_scores = mask[0] ? grads[0] : at::Tensor();
    const at::Tensor gg_slopes = mask[1] ? grads[mask[0] ? 1 : 0] : at::Tensor();
    if (gg_slopes.defined()) {
      if (!gg_scores.defined()) {
        gg_scores = at::zeros_symint(ctx->saved_data["grad_shape"].toSymIntVector(),
                                     gg_slopes.options().dtype(ctx->saved_data["grad_dtype"].toScalarType()));
      }
      gg_scores = alibi_op().call(gg_scores, gg_slopes);
    }
    return {gg_scores, at::Tensor(), at::Tensor()};
  }
};

// alibi_inplace: the gradients of alibi, scores marked dirty (its history rebased onto this node).
class AlibiInplaceFunction : public torch::autograd::Function<AlibiInplaceFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores, const at::Tensor& slopes) {
    no_zero_grads(ctx);
    call_below_autograd(alibi_inplace_op(), scores, slopes);
    ctx->mark_dirty({scores});
    if (slopes.requires_grad()) ctx->save_for_backward({slopes});
    return {scores};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    return AlibiFunction::backward(ctx, grads);
  }
};

at::Tensor alibi_autograd(const at::Tensor& scores, const at::Tensor& slopes) {
  if (!needs_node(scores, slopes)) return call_below_autograd(alibi_op(), scores, slopes);
  return AlibiFunction::apply(scores, slopes)[0];
}

std::tuple<at::Tensor, at::Tensor> alibi_backward_autograd(const at::Tensor& grad, const at::Tensor& slopes,
                                                           std::array<bool, 2> output_mask) {
  if (!needs_node(grad, slopes)) return call_below_autograd(alibi_backward_op(), grad, slopes, output_mask);
  auto out = AlibiBackwardFunction::apply(grad, slopes, output_mask);
  size_t k = 0;
  at::Tensor grad_scores = output_mask[0] ? std::move(out[k++]) : at::Tensor();
  at::Tensor grad_slopes = output_mask[1] ? std::move(out[k++]) : at::Tensor();
  return {std::move(grad_scores), std::move(grad_slopes)};
}

void alibi_inplace_autograd(const at::Tensor& scores, const at::Tensor& slopes) {
  if (needs_node(scores, slopes)) {
    AlibiInplaceFunction::apply(scores, slopes);
    return;
  }
  call_below_autograd(alibi_inplace_op(), scores, slopes);
  torch::autograd::impl::bump_version(scores);  // (ADInplaceOrView, skipped below autograd, would)
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("alibi", &baracuda::autograd::alibi_autograd);
  m.impl("alibi_backward", &baracuda::autograd::alibi_backward_autograd);
  m.impl("alibi_inplace", &baracuda::autograd::alibi_inplace_autograd);
}
