// embedding_bag family, CUDA kernels: what the files of this folder share. forward.cu
// (the bag gather), backward.cu (the sorted segment sums of the weight gradient),
// per_sample_weights_backward.cu (the position dots) and weight_backward.cu
// (scale_grad_by_freq and sparse weight gradients).
//
// Bad index values on CUDA never raise (that would need a host sync) and never
// touch memory out of bounds: a bag that holds an out-of-range index (other
// than padding_idx), or whose offsets break the rules (offsets[0] == 0,
// non-decreasing, <= N), is computed from its valid part only, then its whole
// output row is set to NaN and its bag_size to -1. The backward and the
// per_sample_weights backward skip out-of-range entries.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/embedding_bag.h"
#include "baracuda/embedding_bag_policy.h"

namespace baracuda {

// The dense weight gradient (backward.cu), which the weight backward scales.
at::Tensor embedding_bag_backward_cuda(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                       const at::Tensor& bag_size, const at::Tensor& max_positions,
                                       int64_t num_weights, int64_t mode,
                                       const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx);

namespace {

using cuda::ceil_div;

// The choice of kernel and its launch shape: embedding_bag_forward_config,
// embedding_bag_backward_config and embedding_bag_psw_backward_config
// (baracuda/embedding_bag_policy.h), with the device's facts.
constexpr int kThreads = kBagThreads;

}  // namespace
}  // namespace baracuda
