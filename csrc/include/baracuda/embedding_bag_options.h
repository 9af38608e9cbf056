// baracuda::embedding_bag_weight_backward (F.embedding_bag's scale_grad_by_freq and sparse
// weight gradients): the pieces its CPU and CUDA kernels share.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "baracuda/embedding_bag.h"

namespace baracuda {

constexpr const char* kEmbeddingBagWeightBackwardOp = "baracuda::embedding_bag_weight_backward";

inline void check_weight_backward_options(const char* op, int64_t mode, bool scale_grad_by_freq, bool sparse) {
  check_mode(op, mode);
  TORCH_CHECK_NOT_IMPLEMENTED(!(sparse && scale_grad_by_freq), op,
                              ": scale_grad_by_freq is not supported with sparse gradients (nor by PyTorch)");
  TORCH_CHECK_VALUE(!(mode == kModeMax && (sparse || scale_grad_by_freq)), op,
                    ": max mode supports neither sparse gradients nor scale_grad_by_freq, got sparse=", sparse,
                    ", scale_grad_by_freq=", scale_grad_by_freq);
}

// The uncoalesced COO gradient [num_weights, D] of rows [1, N] (int64) and values [N, D]; with
// no rows (num_weights == 0) every position is out of range and the gradient has no entry.
inline at::Tensor sparse_gradient(const at::Tensor& rows, const at::Tensor& values, int64_t num_weights) {
  const int64_t dim = values.size(1);
  if (num_weights == 0) return at::_sparse_coo_tensor_unsafe(rows.narrow(1, 0, 0), values.narrow(0, 0, 0), {0, dim});
  return at::_sparse_coo_tensor_unsafe(rows, values, {num_weights, dim});
}

}  // namespace baracuda
