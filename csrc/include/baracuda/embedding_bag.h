// embedding_bag family: argument checks and bag geometry shared by the CPU and
// CUDA kernels.
//
// Forward, for bag b with positions [begin_b, end_b) of the flattened indices:
//   sum:  out[b] = sum_{i in bag, idx_i != pad} w_i * weight[idx_i]   (w_i = per_sample_weights[i] or 1)
//   mean: out[b] = (sum_{i in bag, idx_i != pad} weight[idx_i]) / count_b,  0 when count_b == 0
//   max:  out[b, d] = max_{i in bag, idx_i != pad} weight[idx_i, d] (the first element initialises,
//         later ones replace it only when strictly greater), 0 when count_b == 0
// The aux outputs are what the backward needs:
//   offset2bag [N] int64: the bag of each position, -1 for positions in no bag;
//   bag_size [B] int64:   count_b (non-padding entries); -1 marks a bag flagged invalid on CUDA;
//   max_positions [B, D] int64 (max mode, else [0]): the position i that gave out[b, d], -1 if none.
// Bags: 2-D indices [B, L] give begin_b = b L, end_b = begin_b + L. 1-D indices with offsets give
// begin_b = offsets[b], end_b = offsets[b + 1] (or N for the last bag unless include_last_offset,
// where B = len(offsets) - 1 and the last bag ends at offsets[B]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

#include "baracuda/checks.h"

namespace baracuda {

constexpr const char* kEmbeddingBagOp = "baracuda::embedding_bag";
constexpr const char* kEmbeddingBagBackwardOp = "baracuda::embedding_bag_backward";
constexpr const char* kEmbeddingBagPswBackwardOp = "baracuda::embedding_bag_per_sample_weights_backward";

constexpr int64_t kModeSum = 0;
constexpr int64_t kModeMean = 1;
constexpr int64_t kModeMax = 2;

inline const char* mode_name(int64_t mode) {
  return mode == kModeSum ? "sum" : mode == kModeMean ? "mean" : mode == kModeMax ? "max" : "invalid";
}

inline void check_mode(const char* op, int64_t mode) {
  BARACUDA_CHECK_VALUE(mode == kModeSum || mode == kModeMean || mode == kModeMax, op,
                    ": mode must be 0 (sum), 1 (mean) or 2 (max), got ", mode);
}

inline void check_index_dtype(const char* op, const char* name, const at::Tensor& t) {
  BARACUDA_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
                   " must be int32 or int64, got ", t.scalar_type());
}

inline void check_padding_idx(const char* op, int64_t padding_idx, int64_t num_weights) {
  BARACUDA_CHECK_VALUE(padding_idx == -1 || (padding_idx >= 0 && padding_idx < num_weights), op,
                    ": padding_idx must be -1 (none) or in [0, ", num_weights, "), got ", padding_idx);
}

inline void check_int64_aux(const char* op, const char* name, const at::Tensor& t, c10::IntArrayRef shape) {
  BARACUDA_CHECK_TYPE(t.scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", t.scalar_type());
  check_shape(op, name, t, shape);
}

// The problem a forward call describes, after its arguments are checked.
struct BagGeometry {
  int64_t num_weights = 0;   // V
  int64_t dim = 0;           // D
  int64_t num_indices = 0;   // N (indices flattened)
  int64_t num_bags = 0;      // B
  int64_t fixed_len = -1;    // L for 2-D indices, -1 with offsets
  int64_t num_offsets = 0;   // len(offsets)
  int64_t mode = kModeSum;
  int64_t padding_idx = -1;
};

// Shapes, dtypes and devices of a forward call (not the index values).
inline BagGeometry check_embedding_bag(const at::Tensor& weight, const at::Tensor& indices,
                                       const c10::optional<at::Tensor>& offsets, int64_t mode,
                                       const c10::optional<at::Tensor>& per_sample_weights,
                                       bool include_last_offset, int64_t padding_idx) {
  const char* op = kEmbeddingBagOp;
  check_mode(op, mode);
  check_floating(op, "weight", weight);
  BARACUDA_CHECK_VALUE(weight.dim() == 2, op, ": weight must be 2-D [num_embeddings, embedding_dim], got shape ",
                    shape_str(weight.sizes()));
  check_index_dtype(op, "indices", indices);
  check_same_device(op, "weight", weight, "indices", indices);
  BagGeometry g;
  g.num_weights = weight.size(0);
  g.dim = weight.size(1);
  g.num_indices = indices.numel();
  g.mode = mode;
  g.padding_idx = padding_idx;
  check_padding_idx(op, padding_idx, g.num_weights);
  if (indices.dim() == 2) {
    BARACUDA_CHECK_VALUE(!offsets.has_value(), op, ": offsets must be None when indices is 2-D (fixed-size bags), got "
                      "offsets of shape ", shape_str(offsets->sizes()));
    g.num_bags = indices.size(0);
    g.fixed_len = indices.size(1);
  } else {
    BARACUDA_CHECK_VALUE(indices.dim() == 1, op,
                      ": indices must be 1-D (with offsets) or 2-D (fixed-size bags), got shape ", shape_str(indices.sizes()));
    BARACUDA_CHECK_VALUE(offsets.has_value(), op, ": offsets are required when indices is 1-D");
    check_index_dtype(op, "offsets", *offsets);
    check_same_device(op, "weight", weight, "offsets", *offsets);
    BARACUDA_CHECK_VALUE(offsets->dim() == 1, op, ": offsets must be 1-D, got shape ", shape_str(offsets->sizes()));
    g.num_offsets = offsets->size(0);
    BARACUDA_CHECK_VALUE(!include_last_offset || g.num_offsets >= 1, op,
                      ": include_last_offset needs at least 1 offset, got 0");
    g.num_bags = include_last_offset ? g.num_offsets - 1 : g.num_offsets;
  }
  if (per_sample_weights.has_value()) {
    BARACUDA_CHECK_NOT_IMPLEMENTED(mode == kModeSum, op, ": per_sample_weights is only supported with mode 0 (sum), got mode ",
                      mode, " (", mode_name(mode), ")");
    check_same_dtype(op, "weight", weight, "per_sample_weights", *per_sample_weights);
    check_same_device(op, "weight", weight, "per_sample_weights", *per_sample_weights);
    BARACUDA_CHECK_VALUE(per_sample_weights->sizes() == indices.sizes(), op, ": per_sample_weights shape ",
                      shape_str(per_sample_weights->sizes()), " != indices shape ", shape_str(indices.sizes()));
  }
  return g;
}

inline std::vector<int64_t> max_positions_shape(const BagGeometry& g) {
  return g.mode == kModeMax ? std::vector<int64_t>{g.num_bags, g.dim} : std::vector<int64_t>{0};
}

// The out-variant's arguments: check_embedding_bag's, then its four outputs (shape,
// dtype, device, contiguity), then check_output(output) (a backend's own demand on
// the output's memory), then that no output overlaps another tensor of the call.
template <typename CheckOutput>
BagGeometry check_embedding_bag_out(const at::Tensor& weight, const at::Tensor& indices,
                                    const c10::optional<at::Tensor>& offsets, int64_t mode,
                                    const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                                    int64_t padding_idx, const at::Tensor& output, const at::Tensor& offset2bag,
                                    const at::Tensor& bag_size, const at::Tensor& max_positions,
                                    CheckOutput&& check_output) {
  const char* op = kEmbeddingBagOp;
  const auto g =
      check_embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx);
  check_out(op, "output", output, {g.num_bags, g.dim}, weight.scalar_type(), weight.device());
  check_out(op, "offset2bag", offset2bag, {g.num_indices}, at::kLong, weight.device());
  check_out(op, "bag_size", bag_size, {g.num_bags}, at::kLong, weight.device());
  check_out(op, "max_positions", max_positions, max_positions_shape(g), at::kLong, weight.device());
  for (const at::Tensor* t : {&output, &offset2bag, &bag_size, &max_positions}) {
    BARACUDA_CHECK_VALUE(t->is_contiguous(), op, ": outputs must be contiguous");
  }
  check_output(output);
  check_no_overlap(op,
                   {{"output", output}, {"offset2bag", offset2bag}, {"bag_size", bag_size},
                    {"max_positions", max_positions}},
                   {{"weight", weight}, {"indices", indices}, {"offsets", if_present(offsets)},
                    {"per_sample_weights", if_present(per_sample_weights)}});
  return g;
}

// Indices and offsets of different integer types are both used as int64, as
// torch.nn.functional.embedding_bag does.
inline void promote_indices_and_offsets(at::Tensor& indices, c10::optional<at::Tensor>& offsets) {
  if (offsets.has_value() && offsets->scalar_type() != indices.scalar_type()) {
    indices = indices.to(at::kLong);
    offsets = offsets->to(at::kLong);
  }
}

// Bag b's position range, clamped into [0, N]. `bad` reports offsets that
// break the rules (offsets[0] == 0, non-decreasing, <= N); the CPU path checks
// them up front, the CUDA path flags the bag.
template <typename OffsetT>
C10_HOST_DEVICE inline void bag_range(const OffsetT* offsets, int64_t b, int64_t num_offsets, int64_t fixed_len,
                                      int64_t num_indices, int64_t& begin, int64_t& end, bool& bad) {
  if (fixed_len >= 0) {
    begin = b * fixed_len;
    end = begin + fixed_len;
    bad = false;
    return;
  }
  const int64_t raw_begin = static_cast<int64_t>(offsets[b]);
  const int64_t raw_end = b + 1 < num_offsets ? static_cast<int64_t>(offsets[b + 1]) : num_indices;
  bad = raw_begin < 0 || raw_begin > raw_end || raw_end > num_indices || (b == 0 && raw_begin != 0);
  begin = raw_begin < 0 ? 0 : (raw_begin > num_indices ? num_indices : raw_begin);
  end = raw_end < begin ? begin : (raw_end > num_indices ? num_indices : raw_end);
}

// Shapes, dtypes and devices of a backward call.
inline void check_embedding_bag_backward(const at::Tensor& grad, const at::Tensor& indices,
                                         const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                         const at::Tensor& max_positions, int64_t num_weights, int64_t mode,
                                         const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  const char* op = kEmbeddingBagBackwardOp;
  check_mode(op, mode);
  check_floating(op, "grad", grad);
  BARACUDA_CHECK_VALUE(grad.dim() == 2, op, ": grad must be 2-D [num_bags, embedding_dim], got shape ", shape_str(grad.sizes()));
  checked_nonneg(op, "num_weights", num_weights);
  check_padding_idx(op, padding_idx, num_weights);
  check_index_dtype(op, "indices", indices);
  const int64_t B = grad.size(0), D = grad.size(1);
  checked_numel(op, "grad_weight [num_weights, embedding_dim]", {num_weights, D});
  check_int64_aux(op, "offset2bag", offset2bag, {indices.numel()});
  check_int64_aux(op, "bag_size", bag_size, {B});
  if (mode == kModeMax) check_int64_aux(op, "max_positions", max_positions, {B, D});
  for (const at::Tensor* t : {&indices, &offset2bag, &bag_size, &max_positions}) {
    check_same_device(op, "grad", grad, "index tensors", *t);
  }
  if (per_sample_weights.has_value()) {
    BARACUDA_CHECK_NOT_IMPLEMENTED(mode == kModeSum, op, ": per_sample_weights is only supported with mode 0 (sum), got mode ",
                      mode, " (", mode_name(mode), ")");
    check_same_dtype(op, "grad", grad, "per_sample_weights", *per_sample_weights);
    check_same_device(op, "grad", grad, "per_sample_weights", *per_sample_weights);
    BARACUDA_CHECK_VALUE(per_sample_weights->sizes() == indices.sizes(), op, ": per_sample_weights shape ",
                      shape_str(per_sample_weights->sizes()), " != indices shape ", shape_str(indices.sizes()));
  }
}

inline void check_embedding_bag_backward_overlap(const at::Tensor& grad, const at::Tensor& indices,
                                                 const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                                 const at::Tensor& max_positions,
                                                 const c10::optional<at::Tensor>& per_sample_weights,
                                                 const at::Tensor& grad_weight) {
  check_no_overlap(kEmbeddingBagBackwardOp, {{"grad_weight", grad_weight}},
                   {{"grad", grad},
                    {"indices", indices},
                    {"offset2bag", offset2bag},
                    {"bag_size", bag_size},
                    {"max_positions", max_positions},
                    {"per_sample_weights", if_present(per_sample_weights)}});
}

inline void check_per_sample_weights_backward(const at::Tensor& grad, const at::Tensor& weight,
                                              const at::Tensor& indices, const at::Tensor& offset2bag, int64_t mode,
                                              int64_t padding_idx) {
  const char* op = kEmbeddingBagPswBackwardOp;
  check_mode(op, mode);
  BARACUDA_CHECK_VALUE(mode == kModeSum, op, ": per_sample_weights only have a gradient in mode 0 (sum), got mode ",
                    mode, " (", mode_name(mode), ")");
  check_floating(op, "grad", grad);
  check_same_dtype(op, "grad", grad, "weight", weight);
  BARACUDA_CHECK_VALUE(weight.dim() == 2, op, ": weight must be 2-D [num_embeddings, embedding_dim], got shape ",
                    shape_str(weight.sizes()));
  BARACUDA_CHECK_VALUE(grad.dim() == 2 && grad.size(1) == weight.size(1), op, ": grad shape ", shape_str(grad.sizes()),
                    " != expected [num_bags, ", weight.size(1), "]");
  check_padding_idx(op, padding_idx, weight.size(0));
  check_index_dtype(op, "indices", indices);
  check_int64_aux(op, "offset2bag", offset2bag, {indices.numel()});
  for (const at::Tensor* t : {&weight, &indices, &offset2bag}) check_same_device(op, "grad", grad, "inputs", *t);
}

}  // namespace baracuda
