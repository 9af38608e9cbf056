// embedding_bag family, CUDA: the per_sample_weights gradient (a dot product per position).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "baracuda/variant.h"
#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// d per_sample_weights[i] = <grad[bag_i], weight[indices[i]]>, 0 for padding,
// positions in no bag and out-of-range indices. One team (<= 32 threads, in one
// warp) per position: each thread sums its columns in order, then a fixed
// xor-butterfly adds the team's partial sums.

template <typename T, typename AccT, typename IndexT, int V>
__global__ void __launch_bounds__(kThreads)
    position_dot_kernel(const T* __restrict__ grad, const T* __restrict__ weight, const IndexT* __restrict__ indices,
                        const int64_t* __restrict__ offset2bag, int64_t n, int64_t num_weights, int64_t num_bags,
                        int64_t dim, int64_t padding_idx, T* __restrict__ out, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t i = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  AccT acc = 0;
  if (i < n) {
    const int64_t idx = static_cast<int64_t>(indices[i]);
    const int64_t bag = offset2bag[i];
    if (idx >= 0 && idx < num_weights && idx != padding_idx && bag >= 0 && bag < num_bags) {
      for (int64_t col = int64_t(lane) * V; col < dim; col += int64_t(team) * V) {
        const auto gv = cuda::load_vec<T, V>(grad + bag * dim + col);
        const auto wv = cuda::load_vec<T, V>(weight + idx * dim + col);
#pragma unroll
        for (int k = 0; k < V; ++k) acc += static_cast<AccT>(gv.v[k]) * static_cast<AccT>(wv.v[k]);
      }
    }
  }
  // Every thread of the block reaches the shuffles (no early return above).
  for (int offset = team / 2; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset, team);
  if (i < n && lane == 0) out[i] = static_cast<T>(acc);
}

void per_sample_weights_backward_out_cuda(const at::Tensor& grad_in, const at::Tensor& weight_in,
                                          const at::Tensor& indices_in, const at::Tensor& offset2bag_in,
                                          int64_t mode, int64_t padding_idx,
                                          const at::Tensor& grad_per_sample_weights) {
  const char* op = kEmbeddingBagPswBackwardOp;
  check_per_sample_weights_backward(grad_in, weight_in, indices_in, offset2bag_in, mode, padding_idx);
  check_out(op, "grad_per_sample_weights", grad_per_sample_weights, indices_in.sizes(), weight_in.scalar_type(),
            weight_in.device());
  BARACUDA_CHECK_VALUE(grad_per_sample_weights.is_contiguous(), op, ": grad_per_sample_weights must be contiguous");
  check_no_overlap(op, {{"grad_per_sample_weights", grad_per_sample_weights}},
                   {{"grad", grad_in}, {"weight", weight_in}, {"indices", indices_in}, {"offset2bag", offset2bag_in}});
  const int64_t N = indices_in.numel();
  if (N == 0) return;
  const c10::cuda::CUDAGuard guard(grad_in.device());
  cuda::check_device_arch(op);
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto grad = cuda::aligned_contiguous(grad_in);
  const auto weight = cuda::aligned_contiguous(weight_in);
  const int64_t D = weight.size(1);
  const auto c = embedding_bag_psw_backward_config({weight.size(0), D, N, grad.size(0), mode, true},
                                                   weight.scalar_type(), cuda::device_facts());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_psw_backward_cuda", [&] {
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_psw_backward_cuda", [&] {
      constexpr int kV = 16 / sizeof(scalar_t);
      auto* kernel = c.vec == kV ? position_dot_kernel<scalar_t, acc_t, index_t, kV>
                                 : position_dot_kernel<scalar_t, acc_t, index_t, 1>;
      kernel<<<c.blocks, c.threads, 0, stream>>>(grad.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                                             indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(),
                                             N, weight.size(0), grad.size(0), D, padding_idx,
                                             grad_per_sample_weights.mutable_data_ptr<scalar_t>(), c.team);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

at::Tensor per_sample_weights_backward_cuda(const at::Tensor& grad, const at::Tensor& weight,
                                            const at::Tensor& indices, const at::Tensor& offset2bag, int64_t mode,
                                            int64_t padding_idx) {
  check_per_sample_weights_backward(grad, weight, indices, offset2bag, mode, padding_idx);
  auto out = at::empty(indices.sizes(), weight.options());
  per_sample_weights_backward_out_cuda(grad, weight, indices, offset2bag, mode, padding_idx, out);
  return out;
}

// The Plan's variant: the launch config, described.
KernelChoice per_sample_weights_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = embedding_bag_psw_backward_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("embedding_bag_per_sample_weights_backward", c10::DeviceType::CUDA,
                          per_sample_weights_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("embedding_bag_per_sample_weights_backward", &baracuda::per_sample_weights_backward_cuda);
  m.impl("embedding_bag_per_sample_weights_backward.out", &baracuda::per_sample_weights_backward_out_cuda);
}
