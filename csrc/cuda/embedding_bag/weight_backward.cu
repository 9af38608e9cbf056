// embedding_bag family, CUDA: F.embedding_bag's scale_grad_by_freq and sparse weight gradients.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>

#include "baracuda/embedding_bag_options.h"
#include "common.cuh"

namespace baracuda {
namespace {

// embedding_bag_weight_backward: F.embedding_bag's scale_grad_by_freq and sparse weight
// gradients (the math and the entries of the sparse gradient: csrc/cpu/embedding_bag.cpp).
// The counts are integer atomics (exact in any order); the row division reads each count once
// per element; a sparse entry is one element of [N, D] values (the thread of column 0 also
// writes the entry's row).

constexpr int64_t kGridCap = int64_t(1) << 16;  // grid-stride loops: blocks launched at most

int64_t grid_for(int64_t elements) { return std::min(ceil_div(elements, int64_t(kThreads)), kGridCap); }

template <typename IndexT>
__global__ void __launch_bounds__(kThreads)
    count_rows_kernel(const IndexT* __restrict__ indices, int64_t n, int64_t num_weights,
                      unsigned long long* __restrict__ counts) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row >= 0 && row < num_weights) atomicAdd(counts + row, 1ull);
  }
}

template <typename T, typename AccT>
__global__ void __launch_bounds__(kThreads)
    divide_rows_kernel(T* __restrict__ grad_weight, const unsigned long long* __restrict__ counts, int64_t total,
                       int64_t dim) {
  for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < total; k += int64_t(gridDim.x) * kThreads) {
    const unsigned long long c = counts[k / dim];
    if (c > 1) grad_weight[k] = static_cast<T>(static_cast<AccT>(grad_weight[k]) / static_cast<AccT>(c));
  }
}

template <typename T, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    sparse_entries_kernel(const T* __restrict__ grad, const IndexT* __restrict__ indices,
                          const int64_t* __restrict__ offset2bag, const int64_t* __restrict__ bag_size,
                          const T* __restrict__ psw, int64_t mode, int64_t padding_idx, int64_t num_weights,
                          int64_t num_bags, int64_t dim, int64_t n, int64_t* __restrict__ rows,
                          T* __restrict__ values) {
  const int64_t width = dim > 0 ? dim : 1;  // with dim 0 a thread per position still writes its row
  for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < n * width; k += int64_t(gridDim.x) * kThreads) {
    const int64_t i = k / width, d = k - i * width;
    const int64_t row = static_cast<int64_t>(indices[i]), bag = offset2bag[i];
    const bool in_range = row >= 0 && row < num_weights;
    if (d == 0) rows[i] = in_range ? row : 0;
    if (d >= dim) continue;
    const bool used = in_range && row != padding_idx && bag >= 0 && bag < num_bags &&
                      (mode != kModeMean || bag_size[bag] > 0);
    T value = T(0);
    if (used) {
      const T coef = mode == kModeMean ? T(1) / static_cast<T>(bag_size[bag]) : (psw != nullptr ? psw[i] : T(1));
      value = grad[bag * dim + d] * coef;
    }
    values[i * dim + d] = value;
  }
}

at::Tensor embedding_bag_weight_backward_cuda(const at::Tensor& grad_in, const at::Tensor& indices_in,
                                              const at::Tensor& offset2bag_in, const at::Tensor& bag_size_in,
                                              const at::Tensor& max_positions, int64_t num_weights, int64_t mode,
                                              const c10::optional<at::Tensor>& per_sample_weights,
                                              int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
  check_weight_backward_options(kEmbeddingBagWeightBackwardOp, mode, scale_grad_by_freq, sparse);
  if (!sparse) {
    at::Tensor grad_weight = embedding_bag_backward_cuda(grad_in, indices_in, offset2bag_in, bag_size_in,
                                                         max_positions, num_weights, mode, per_sample_weights,
                                                         padding_idx);
    const int64_t n = indices_in.numel(), total = grad_weight.numel();
    if (scale_grad_by_freq && n > 0 && total > 0) {
      const c10::cuda::CUDAGuard guard(grad_in.device());
      const auto stream = c10::cuda::getCurrentCUDAStream();
      const auto indices = indices_in.contiguous();
      const auto counts = at::zeros({num_weights}, indices.options().dtype(at::kLong));
      auto* count_ptr = reinterpret_cast<unsigned long long*>(counts.mutable_data_ptr<int64_t>());
      AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_weight_backward_cuda", [&] {
        count_rows_kernel<index_t><<<grid_for(n), kThreads, 0, stream>>>(indices.const_data_ptr<index_t>(), n,
                                                                         num_weights, count_ptr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      BARACUDA_DISPATCH_FLOATING(grad_weight.scalar_type(), "embedding_bag_weight_backward_cuda", [&] {
        divide_rows_kernel<scalar_t, acc_t><<<grid_for(total), kThreads, 0, stream>>>(
            grad_weight.mutable_data_ptr<scalar_t>(), count_ptr, total, grad_weight.size(1));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    }
    return grad_weight;
  }
  check_embedding_bag_backward(grad_in, indices_in, offset2bag_in, bag_size_in, max_positions, num_weights, mode,
                               per_sample_weights, padding_idx);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const int64_t dim = grad_in.size(1), n = indices_in.numel(), num_bags = grad_in.size(0);
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto bag_size = bag_size_in.contiguous();
  const auto grad = grad_in.contiguous();
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  auto rows = at::empty({1, n}, indices.options().dtype(at::kLong));
  auto values = at::empty({n, dim}, grad.options());
  if (n > 0) {
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_weight_backward_cuda", [&] {
      BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_weight_backward_cuda", [&] {
        sparse_entries_kernel<scalar_t, index_t><<<grid_for(n * std::max<int64_t>(dim, 1)), kThreads, 0,
                                                   c10::cuda::getCurrentCUDAStream()>>>(
            grad.const_data_ptr<scalar_t>(), indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(),
            bag_size.const_data_ptr<int64_t>(), psw.defined() ? psw.const_data_ptr<scalar_t>() : nullptr, mode,
            padding_idx, num_weights, num_bags, dim, n, rows.mutable_data_ptr<int64_t>(),
            values.mutable_data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  return sparse_gradient(rows, values, num_weights);
}



}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("embedding_bag_weight_backward", &baracuda::embedding_bag_weight_backward_cuda);
}
