// Shared pieces of the C++ autograd kernels (TORCH_LIBRARY_IMPL(baracuda, Autograd, m)):
// each forward op's gradient is a torch::autograd::Function whose forward runs the op below
// autograd and whose backward calls the family's backward op through the dispatcher (so a
// backward op with a gradient of its own is differentiated again under create_graph).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <optional>
#include <string>
#include <utility>

namespace baracuda::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The typed handle of `baracuda::<name>` (default overload); callers keep it in a static.
template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow((std::string("baracuda::") + name).c_str(), "")
      .typed<Signature>();
}

// The op's kernels below autograd (CPU, CUDA, fake, functorch's layers): a Function's forward.
template <class Signature, class... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(std::forward<Args>(args)...);
}

// A saved optional tensor (saved as undefined when absent) as the op's optional argument again.
inline std::optional<at::Tensor> given(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// Whether a call needs the Function's node: grad mode on and an input that requires grad, or an
// input carrying a forward-mode tangent (which the Function refuses with its message). Every
// other call (no_grad, inputs without grad, the backward ops inside backward) runs the op below
// autograd directly: no node and no saved state are built for it.
inline bool records(const at::Tensor& t, bool grad_mode) {
  return t.defined() && ((grad_mode && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
}
inline bool records(const std::optional<at::Tensor>& t, bool grad_mode) {
  return t.has_value() && records(*t, grad_mode);
}
template <class T>
bool records(const T&, bool) {
  return false;
}
template <class... Args>
bool needs_node(const Args&... args) {
  const bool grad_mode = at::GradMode::is_enabled();
  return (records(args, grad_mode) || ...);
}

// Setup every Function shares: outputs that take no gradient are never expanded to zeros.
inline void no_zero_grads(AutogradContext* ctx) { ctx->set_materialize_grads(false); }

}  // namespace baracuda::autograd
