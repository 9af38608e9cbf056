// embedding_bag autograd: the output is linear in weight and in per_sample_weights.
// d weight from baracuda::embedding_bag_backward (dense, deterministic; every mode), d
// per_sample_weights from baracuda::embedding_bag_per_sample_weights_backward (sum mode).
// baracuda::embedding_bag_with_options is the same forward whose weight gradient follows
// F.embedding_bag's sparse / scale_grad_by_freq: baracuda::embedding_bag_weight_backward (a COO
// gradient, or the dense one with rows divided by their counts). No backward op has a gradient.
// baracuda::embedding_bag_forward_only is the output alone, for calls that want no gradient:
// it refuses inputs that need one.
#include <optional>
#include <tuple>

#include "function.h"

namespace baracuda::autograd {
namespace {

using Bag4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using EmbeddingBagSig = Bag4(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
                             const std::optional<at::Tensor>&, bool, int64_t);
using ForwardOnlySig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
                                  const std::optional<at::Tensor>&, bool, int64_t);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, c10::SymInt, int64_t, const std::optional<at::Tensor>&, int64_t);
using PswBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  int64_t, int64_t);
using WeightBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, c10::SymInt, int64_t, const std::optional<at::Tensor>&,
                                     int64_t, bool, bool);

const c10::TypedOperatorHandle<EmbeddingBagSig>& forward_op() {
  static const auto op = op_handle<EmbeddingBagSig>("embedding_bag");
  return op;
}

const c10::TypedOperatorHandle<ForwardOnlySig>& forward_only_op() {
  static const auto op = op_handle<ForwardOnlySig>("embedding_bag_forward_only");
  return op;
}

const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op = op_handle<BackwardSig>("embedding_bag_backward");
  return op;
}

const c10::TypedOperatorHandle<PswBackwardSig>& psw_backward_op() {
  static const auto op = op_handle<PswBackwardSig>("embedding_bag_per_sample_weights_backward");
  return op;
}

class EmbeddingBagFunction : public torch::autograd::Function<EmbeddingBagFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                               const std::optional<at::Tensor>& offsets, int64_t bag_mode,
                               const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                               int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
    auto [output, offset2bag, bag_size, max_positions] =
        call_below_autograd(forward_op(), weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                            padding_idx);
    no_zero_grads(ctx);
    ctx->mark_non_differentiable({offset2bag, bag_size, max_positions});
    const at::Tensor psw = per_sample_weights.value_or(at::Tensor());
    const bool psw_grad = psw.defined() && psw.requires_grad();
    // Autograd's inputs (edges): weight, indices, offsets when given, per_sample_weights when given.
    ctx->saved_data["psw_edge"] = (psw_grad ? int64_t(2 + (offsets.has_value() && offsets->defined())) : int64_t(-1));
    ctx->saved_data["num_weights"] = weight.sym_size(0);
    ctx->saved_data["bag_mode"] = bag_mode;
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["scale_grad_by_freq"] = scale_grad_by_freq;
    ctx->saved_data["sparse"] = sparse;
    ctx->save_for_backward({indices, offset2bag, bag_size, max_positions, psw, psw_grad ? weight : at::Tensor()});
    return {output, offset2bag, bag_size, max_positions};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const at::Tensor& grad = grads[0];
    at::Tensor grad_weight, grad_psw;
    const int64_t psw_edge = ctx->saved_data["psw_edge"].toInt();
    const bool want_weight = ctx->needs_input_grad(0), want_psw = psw_edge >= 0 && ctx->needs_input_grad(psw_edge);
    if (grad.defined() && (want_weight || want_psw)) {
      const auto saved = ctx->get_saved_variables();
      const int64_t mode = ctx->saved_data["bag_mode"].toInt(), padding_idx = ctx->saved_data["padding_idx"].toInt();
      const bool scale = ctx->saved_data["scale_grad_by_freq"].toBool(), sparse = ctx->saved_data["sparse"].toBool();
      if (want_weight && (scale || sparse)) {
        static const auto weight_backward_op = op_handle<WeightBackwardSig>("embedding_bag_weight_backward");
        grad_weight = weight_backward_op.call(grad, saved[0], saved[1], saved[2], saved[3],
                                              ctx->saved_data["num_weights"].toSymInt(), mode, given(saved[4]),
                                              padding_idx, scale, sparse);
      } else if (want_weight) {
        grad_weight = backward_op().call(grad, saved[0], saved[1], saved[2], saved[3],
                                         ctx->saved_data["num_weights"].toSymInt(), mode, given(saved[4]),
                                         padding_idx);
      }
      if (want_psw) grad_psw = psw_backward_op().call(grad, saved[5], saved[0], saved[1], mode, padding_idx);
    }
    return {grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), grad_psw,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A backward op's Function: its forward runs the op, its gradient is not supported.
template <class Op>
class NoGradFunction : public torch::autograd::Function<NoGradFunction<Op>> {
 public:
  template <class... Args>
  static variable_list forward(AutogradContext*, Args&&... args) {
    static const auto op = op_handle<typename Op::Signature>(Op::name);
    return {call_below_autograd(op, std::forward<Args>(args)...)};
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "baracuda::", Op::name, ": double backward of embedding_bag is not supported");
  }
};

struct DenseBackward {
  static constexpr const char* name = "embedding_bag_backward";
  using Signature = BackwardSig;
};

struct PswBackward {
  static constexpr const char* name = "embedding_bag_per_sample_weights_backward";
  using Signature = PswBackwardSig;
};

Bag4 embedding_bag_autograd(const at::Tensor& weight, const at::Tensor& indices,
                            const std::optional<at::Tensor>& offsets, int64_t bag_mode,
                            const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                            int64_t padding_idx) {
  if (!needs_node(weight, per_sample_weights)) {
    return call_below_autograd(forward_op(), weight, indices, offsets, bag_mode, per_sample_weights,
                               include_last_offset, padding_idx);
  }
  auto out = EmbeddingBagFunction::apply(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                                         padding_idx, false, false);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2]), std::move(out[3])};
}

Bag4 with_options_autograd(const at::Tensor& weight, const at::Tensor& indices,
                           const std::optional<at::Tensor>& offsets, int64_t bag_mode,
                           const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                           int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
  if (!needs_node(weight, per_sample_weights)) {
    return call_below_autograd(forward_op(), weight, indices, offsets, bag_mode, per_sample_weights,
                               include_last_offset, padding_idx);
  }
  auto out = EmbeddingBagFunction::apply(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                                         padding_idx, scale_grad_by_freq, sparse);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2]), std::move(out[3])};
}

// Every backend (CPU, CUDA, Meta) below autograd: the forward is embedding_bag's (the options
// act in backward, where embedding_bag_weight_backward refuses the combinations it does not take).
Bag4 with_options_forward(const at::Tensor& weight, const at::Tensor& indices, const std::optional<at::Tensor>& offsets,
                          int64_t bag_mode, const std::optional<at::Tensor>& per_sample_weights,
                          bool include_last_offset, int64_t padding_idx, bool, bool) {
  return forward_op().call(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset, padding_idx);
}

at::Tensor forward_only_autograd(const at::Tensor& weight, const at::Tensor& indices,
                                 const std::optional<at::Tensor>& offsets, int64_t bag_mode,
                                 const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                                 int64_t padding_idx) {
  TORCH_CHECK_NOT_IMPLEMENTED(!needs_node(weight, per_sample_weights),
                              "baracuda::embedding_bag_forward_only: no gradient flows through it, but weight or "
                              "per_sample_weights requires grad (baracuda::embedding_bag gives one)");
  return call_below_autograd(forward_only_op(), weight, indices, offsets, bag_mode, per_sample_weights,
                             include_last_offset, padding_idx);
}

// Every backend but CPU (which writes the output alone): embedding_bag's output.
at::Tensor forward_only_forward(const at::Tensor& weight, const at::Tensor& indices,
                                const std::optional<at::Tensor>& offsets, int64_t bag_mode,
                                const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                                int64_t padding_idx) {
  return std::get<0>(
      forward_op().call(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset, padding_idx));
}

at::Tensor backward_autograd(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                             const at::Tensor& bag_size, const at::Tensor& max_positions, c10::SymInt num_weights,
                             int64_t bag_mode, const std::optional<at::Tensor>& per_sample_weights,
                             int64_t padding_idx) {
  if (!needs_node(grad, per_sample_weights)) {
    return call_below_autograd(backward_op(), grad, indices, offset2bag, bag_size, max_positions,
                               std::move(num_weights), bag_mode, per_sample_weights, padding_idx);
  }
  return NoGradFunction<DenseBackward>::apply(grad, indices, offset2bag, bag_size, max_positions,
                                              std::move(num_weights), bag_mode, per_sample_weights, padding_idx)[0];
}

at::Tensor psw_backward_autograd(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices,
                                 const at::Tensor& offset2bag, int64_t bag_mode, int64_t padding_idx) {
  if (!needs_node(grad, weight)) {
    return call_below_autograd(psw_backward_op(), grad, weight, indices, offset2bag, bag_mode, padding_idx);
  }
  return NoGradFunction<PswBackward>::apply(grad, weight, indices, offset2bag, bag_mode, padding_idx)[0];
}

}  // namespace
}  // namespace baracuda::autograd

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("embedding_bag", &baracuda::autograd::embedding_bag_autograd);
  m.impl("embedding_bag_with_options", &baracuda::autograd::with_options_autograd);
  m.impl("embedding_bag_forward_only", &baracuda::autograd::forward_only_autograd);
  m.impl("embedding_bag_backward", &baracuda::autograd::backward_autograd);
  m.impl("embedding_bag_per_sample_weights_backward", &baracuda::autograd::psw_backward_autograd);
}

TORCH_LIBRARY_IMPL(baracuda, CompositeExplicitAutograd, m) {
  m.impl("embedding_bag_with_options", &baracuda::autograd::with_options_forward);
  m.impl("embedding_bag_forward_only", &baracuda::autograd::forward_only_forward);
}
