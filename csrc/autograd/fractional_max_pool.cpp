// fractional_max_pool2d / 3d autograd. The pool's gradient scatters dy to the argmax,
// dx[e] = sum over o with idx[o] == e of dy[o] (baracuda::fractional_max_pool<D>d_backward);
// that is linear in dy, and its gradient reads gg at the argmax: gg.flatten(-D)[..., idx[o]]
// (a gather, which autograd differentiates further).
#include <tuple>

#include "function.h"

namespace baracuda::autograd {
namespace {

using PoolSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::IntArrayRef, c10::SymIntArrayRef,
                                                   const at::Tensor&);
using PoolBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, c10::SymIntArrayRef,
                                   const at::Tensor&);

template <int Dims>
const char* pool_name() {
  return Dims == 2 ? "fractional_max_pool2d" : "fractional_max_pool3d";
}

template <int Dims>
const c10::TypedOperatorHandle<PoolBackwardSig>& backward_op() {
  static const auto op = op_handle<PoolBackwardSig>(Dims == 2 ? "fractional_max_pool2d_backward"
                                                              : "fractional_max_pool3d_backward");
  return op;
}

template <int Dims>
const c10::TypedOperatorHandle<PoolSig>& forward_op() {
  static const auto op = op_handle<PoolSig>(pool_name<Dims>());
  return op;
}

template <int Dims>
class PoolFunction : public torch::autograd::Function<PoolFunction<Dims>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& self, c10::IntArrayRef kernel_size,
                               c10::SymIntArrayRef output_size, const at::Tensor& random_samples) {
    auto [output, indices] = call_below_autograd(forward_op<Dims>(), self, kernel_size, output_size, random_samples);
    no_zero_grads(ctx);
    ctx->mark_non_differentiable({indices});
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["output_size"] = output_size;
    // The backward op reads only self's shape, dtype and device; self is saved as aten's pool
    // saves it (a stand-in built in backward would cost two more ops per call).
    ctx->save_for_backward({indices, self});
    return {output, indices};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    at::Tensor grad_input;
    if (grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      grad_input = backward_op<Dims>().call(grads[0], saved[1], ctx->saved_data["kernel_size"].toIntVector(),
                                            ctx->saved_data["output_size"].toSymIntVector(), saved[0]);
    }
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <int Dims>
class PoolBackwardFunction : public torch::autograd::Function<PoolBackwardFunction<Dims>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_output, const at::Tensor& self,
                               c10::IntArrayRef kernel_size, c10::SymIntArrayRef output_size,
                               const at::Tensor& indices) {
    no_zero_grads(ctx);
    ctx->save_for_backward({indices});
    return {call_below_autograd(backward_op<Dims>(), grad_output, self, kernel_size, output_size, indices)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    at::Tensor grad_grad_output;
    if (grads[0].defined()) {
      const at::Tensor indices = ctx->get_saved_variables()[0];
      grad_grad_output =
          grads[0].flatten(-Dims).gather(-1, indices.flatten(-Dims)).view_symint(indices.sym_sizes());
    }
    return {grad_grad_output, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <int Dims>
std::tuple<at::Tensor, at::Tensor> pool_autograd(const at::Tensor& self, c10::IntArrayRef kernel_size,
                                                 c10::SymIntArrayRef output_size, const at::Tensor& random_samples) {
  if (!needs_node(self)) return call_below_autograd(forward_op<Dims>(), self, kernel_size, output_size, random_samples);
  auto out = PoolFunction<Dims>::apply(self, kernel_size, output_size, random_samples);
  return {std::move(out[0]), std::move(out[1])};
}

template <int Dims>
at::Tensor pool_backward_autograd(const at::Tensor& grad_output, const at::Tensor& self,
                                  c10::IntArrayRef kernel_size, c10::SymIntArrayRef output_size,
                                  const at::Tensor& indices) {
  if (!needs_node(grad_output, self)) {
    return call_below_autograd(backward_op<Dims>(), grad_output, self, kernel_size, output_size, indices);
  }
  return PoolBackwardFunction<Dims>::apply(grad_output, self, kernel_size, output_size, indices)[0];
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("fractional_max_pool2d", &baracuda::autograd::pool_autograd<2>);
  m.impl("fractional_max_pool2d_backward", &baracuda::autograd::pool_backward_autograd<2>);
  m.impl("fractional_max_pool3d", &baracuda::autograd::pool_autograd<3>);
  m.impl("fractional_max_pool3d_backward", &baracuda::autograd::pool_backward_autograd<3>);
}
