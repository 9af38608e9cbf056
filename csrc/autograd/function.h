// Shared pieces of the C++ autograd kernels (TORCH_LIBRARY_IMPL(baracuda, Autograd, m)):
// each forward op's gradient is a torch::autograd::Function whose forward runs the op below
// autograd and whose backward calls the family's backward op through the dispatcher (so a
// backward op with a gradient of its own is differentiated again under create_graph).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

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

// Setup every Function shares: outputs that take no gradient are never expanded to zeros.
inline void no_zero_grads(AutogradContext* ctx) { ctx->set_materialize_grads(false); }

}  // namespace baracuda::autograd
