// repeat autograd: repeat is linear, its gradient the tile sum baracuda::repeat_backward;
// repeat_backward is linear too, its gradient repeat (so repeat is differentiable twice and more).
#include "function.h"

namespace baracuda::autograd {
namespace {

using RepeatSig = at::Tensor(const at::Tensor&, c10::SymIntArrayRef);
using RepeatBackwardSig = at::Tensor(const at::Tensor&, c10::SymIntArrayRef, c10::SymIntArrayRef);

const c10::TypedOperatorHandle<RepeatSig>& repeat_op() {
  static const auto op = op_handle<RepeatSig>("repeat");
  return op;
}

const c10::TypedOperatorHandle<RepeatBackwardSig>& repeat_backward_op() {
  static const auto op = op_handle<RepeatBackwardSig>("repeat_backward");
  return op;
}

class RepeatFunction : public torch::autograd::Function<RepeatFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& self, c10::SymIntArrayRef repeats) {
    no_zero_grads(ctx);
    ctx->saved_data["repeats"] = repeats;
    ctx->saved_data["input_shape"] = self.sym_sizes();
    return {call_below_autograd(repeat_op(), self, repeats)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    at::Tensor grad_input;
    if (grads[0].defined()) {
      grad_input = repeat_backward_op().call(grads[0], ctx->saved_data["repeats"].toSymIntVector(),
                                             ctx->saved_data["input_shape"].toSymIntVector());
    }
    return {grad_input, at::Tensor()};
  }
};

class RepeatBackwardFunction : public torch::autograd::Function<RepeatBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad, c10::SymIntArrayRef repeats,
                               c10::SymIntArrayRef input_shape) {
    no_zero_grads(ctx);
    ctx->saved_data["repeats"] = repeats;
    return {call_below_autograd(repeat_backward_op(), grad, repeats, input_shape)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    at::Tensor grad_grad;
    if (grads[0].defined()) grad_grad = repeat_op().call(grads[0], ctx->saved_data["repeats"].toSymIntVector());
    return {grad_grad, at::Tensor(), at::Tensor()};
  }
};

at::Tensor repeat_autograd(const at::Tensor& self, c10::SymIntArrayRef repeats) {
  if (!needs_node(self)) return call_below_autograd(repeat_op(), self, repeats);
  return RepeatFunction::apply(self, repeats)[0];
}

at::Tensor repeat_backward_autograd(const at::Tensor& grad, c10::SymIntArrayRef repeats,
                                    c10::SymIntArrayRef input_shape) {
  if (!needs_node(grad)) return call_below_autograd(repeat_backward_op(), grad, repeats, input_shape);
  return RepeatBackwardFunction::apply(grad, repeats, input_shape)[0];
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("repeat", &baracuda::autograd::repeat_autograd);
  m.impl("repeat_backward", &baracuda::autograd::repeat_backward_autograd);
}
