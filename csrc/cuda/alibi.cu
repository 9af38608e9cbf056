// alibi family, CUDA kernels.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

#include "baracuda/alibi.h"
#include "baracuda/alibi_policy.h"
#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

// The choice of kernel and its launch shape: alibi_forward_config and
// alibi_backward_config (baracuda/alibi_policy.h), with the device's facts.
constexpr int kThreads = kAlibiThreads;
constexpr int kUnroll = kAlibiUnroll;

// Index math: element e of the contiguous [B, H, Q, K] tensor has j = e mod K,
// i = (e / K) mod Q, h = (e / (K Q)) mod H. Diff holds j - i (signed).
template <typename IndexT>
using DiffT = std::conditional_t<sizeof(IndexT) == 4, int32_t, int64_t>;

// ---------------------------------------------------------------------------
// Forward: y[e] = x[e] + slopes[h] * (j - i), computed in AccT and rounded once
// to T. Block b owns the kThreads * Vpt vectors from b * kThreads * Vpt (no
// grid-stride loop): thread t loads its vectors t, t + kThreads, ... first, then
// computes and stores them. Each vector of V elements lies in one row
// because K is a multiple of V. Streaming cache hints: every element is read
// once and written once. x may equal y (the in-place op): each element is read
// and then written by the same thread only.

template <typename T, typename S, typename AccT, int V, typename IndexT, int Vpt>
__global__ void __launch_bounds__(kThreads)
    alibi_forward_kernel(const T* x, const S* __restrict__ slopes, T* y, IndexT num_vectors,
                         IntDivider<IndexT> keys, IntDivider<IndexT> queries, IntDivider<IndexT> heads) {
  const IndexT first = IndexT(blockIdx.x) * (kThreads * Vpt) + threadIdx.x;
  cuda::Vec<T, V> v[Vpt];
#pragma unroll
  for (int u = 0; u < Vpt; ++u) {
    const IndexT q = first + u * kThreads;
    if (q < num_vectors) v[u] = cuda::load_vec_streaming<T, V>(x + q * V);
  }
#pragma unroll
  for (int u = 0; u < Vpt; ++u) {
    const IndexT q = first + u * kThreads;
    if (q < num_vectors) {
      const auto jr = keys.divmod(q * V);
      const auto iq = queries.divmod(jr.div);
      const AccT m = static_cast<AccT>(slopes[heads.mod(iq.div)]);
      const AccT d = static_cast<AccT>(static_cast<DiffT<IndexT>>(jr.mod) - static_cast<DiffT<IndexT>>(iq.mod));
      cuda::Vec<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(static_cast<AccT>(v[u].v[k]) + m * (d + AccT(k)));
      cuda::store_vec_streaming<T, V>(y + q * V, out);
    }
  }
}

template <typename T, typename S, typename AccT, int V, typename IndexT>
void launch_alibi_forward(const T* x, const S* slopes, T* y, const AlibiShape& s, const AlibiLaunchConfig& c) {
  const IndexT num_vectors = static_cast<IndexT>(s.numel() / V);
  BARACUDA_CHECK_NOT_IMPLEMENTED(c.blocks <= std::numeric_limits<int32_t>::max(), kAlibiOp, ": ", s.numel(),
                              " elements need more than 2^31 - 1 blocks");
  auto* kernel = c.vectors_per_thread == 4 ? alibi_forward_kernel<T, S, AccT, V, IndexT, 4>
                                           : alibi_forward_kernel<T, S, AccT, V, IndexT, 1>;
  kernel<<<c.blocks, c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x, slopes, y, num_vectors, IntDivider<IndexT>(static_cast<IndexT>(s.keys)),
      IntDivider<IndexT>(static_cast<IndexT>(s.queries)), IntDivider<IndexT>(static_cast<IndexT>(s.heads)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// x and y contiguous [B, H, Q, K], 16-byte aligned; slopes contiguous [H]; numel > 0.
void alibi_forward_cuda(const at::Tensor& x, const at::Tensor& slopes, const at::Tensor& y) {
  const auto s = alibi_shape(x);
  const auto c = alibi_forward_config(s, x.scalar_type(), cuda::device_facts());
  BARACUDA_DISPATCH_FLOATING(x.scalar_type(), "alibi_cuda", [&] {
    with_slope_type<scalar_t>(slopes, [&](auto* tag) {
      using slope_t = std::remove_pointer_t<decltype(tag)>;
      constexpr int kV = 16 / sizeof(scalar_t);
      const auto* xp = x.const_data_ptr<scalar_t>();
      const auto* sp = slopes.const_data_ptr<slope_t>();
      auto* yp = y.mutable_data_ptr<scalar_t>();
      const bool vec = c.vec_bytes == 16;
      if (c.index32) {
        vec ? launch_alibi_forward<scalar_t, slope_t, acc_t, kV, uint32_t>(xp, sp, yp, s, c)
            : launch_alibi_forward<scalar_t, slope_t, acc_t, 1, uint32_t>(xp, sp, yp, s, c);
      } else {
        vec ? launch_alibi_forward<scalar_t, slope_t, acc_t, kV, uint64_t>(xp, sp, yp, s, c)
            : launch_alibi_forward<scalar_t, slope_t, acc_t, 1, uint64_t>(xp, sp, yp, s, c);
      }
    });
  });
}

void alibi_out_cuda(const at::Tensor& scores, const at::Tensor& slopes, const at::Tensor& out) {
  check_alibi_args(kAlibiOp, "scores", scores, slopes);
  check_out(kAlibiOp, "out", out, scores.sizes(), scores.scalar_type(), scores.device());
  BARACUDA_CHECK_VALUE(out.numel() == 0 || cuda::is_aligned_contiguous(out), kAlibiOp,
                    ": out must be contiguous and 16-byte aligned on CUDA");
  check_alibi_out_overlap(scores, slopes, out);
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(scores.device());
  cuda::check_device_arch(kAlibiOp);
  alibi_forward_cuda(cuda::aligned_contiguous(scores), slopes.contiguous(), out);
}

at::Tensor alibi_cuda(const at::Tensor& scores, const at::Tensor& slopes) {
  check_alibi_args(kAlibiOp, "scores", scores, slopes);
  auto out = at::empty(scores.sizes(), scores.options().memory_format(at::MemoryFormat::Contiguous));
  alibi_out_cuda(scores, slopes, out);
  return out;
}

// In place on a contiguous, aligned tensor; any other layout goes through a
// contiguous result copied back.
void alibi_inplace_cuda(const at::Tensor& scores, const at::Tensor& slopes) {
  check_alibi_args(kAlibiInplaceOp, "scores", scores, slopes);
  check_no_overlap(kAlibiInplaceOp, {{"scores", scores}}, {{"slopes", slopes}});
  if (scores.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(scores.device());
  cuda::check_device_arch(kAlibiInplaceOp);
  if (cuda::is_aligned_contiguous(scores)) {
    alibi_forward_cuda(scores, slopes.contiguous(), scores);
  } else {
    scores.copy_(alibi_cuda(scores, slopes));
  }
}

// ---------------------------------------------------------------------------
// Slope gradient: grad_slopes[h] = sum_{b,i,j} grad[b,h,i,j] * (j - i).
// Head h's work is a list of items t = r * 2^L + seg over its rows r = b * Q + i
// (each of K/V vectors, cut into 2^L segments). Block (h, c) takes chunk c of
// that list; its warp w takes items begin + w, begin + w + 8, ...: the row's
// base and i come from one division per item, and the lanes stride the
// segment's vectors, kUnroll streaming loads in flight (grad is read once),
// accumulating in order in AccT.
// The block then adds the thread sums with the fixed-order block_sum. With one
// chunk the block writes grad_slopes[h]; otherwise it writes partials[h][c],
// and alibi_slope_combine_kernel, launched early, adds those in chunk order. No
// atomics: the result is bit-identical run to run.

template <typename T, typename S, typename AccT, int V, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    alibi_slope_grad_kernel(const T* __restrict__ grad, AccT* __restrict__ partials, S* __restrict__ grad_slopes,
                            IndexT items_per_head, IndexT items_per_chunk, int segments_log2, IndexT segment_len,
                            IndexT row_vectors, IntDivider<IndexT> queries, IndexT heads) {
  cuda::start_next_grid();  // alibi_slope_combine_kernel may take free slots now
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const IndexT h = blockIdx.x, chunk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const IndexT begin = chunk * items_per_chunk;
  const IndexT end = begin + items_per_chunk < items_per_head ? begin + items_per_chunk : items_per_head;

  AccT acc = 0;
  for (IndexT item = begin + warp; item < end; item += kThreads / 32) {
    const IndexT seg = item & ((IndexT(1) << segments_log2) - 1);
    const auto bi = queries.divmod(item >> segments_log2);  // b, i
    const T* row = grad + ((bi.div * heads + h) * queries.divisor + bi.mod) * row_vectors * V;
    const IndexT v_begin = seg * segment_len;
    const IndexT v_end = v_begin + segment_len < row_vectors ? v_begin + segment_len : row_vectors;
    for (IndexT first = v_begin + lane; first < v_end; first += 32 * kUnroll) {
      cuda::Vec<T, V> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (first + 32 * u < v_end) v[u] = cuda::load_vec_streaming<T, V>(row + (first + 32 * u) * V);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (first + 32 * u < v_end) {
          const AccT d = static_cast<AccT>(static_cast<DiffT<IndexT>>((first + 32 * u) * V) -
                                           static_cast<DiffT<IndexT>>(bi.mod));
#pragma unroll
          for (int k = 0; k < V; ++k) acc += static_cast<AccT>(v[u].v[k]) * (d + AccT(k));
        }
      }
    }
  }
  const AccT total = cuda::block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    if (partials == nullptr) {
      grad_slopes[h] = static_cast<S>(total);
    } else {
      partials[h * gridDim.y + chunk] = total;
    }
  }
}

// grad_slopes[h] = sum_{c = 0..chunks-1} partials[h][c]: one warp per head,
// lane l adding chunks l, l + 32, ... in order, then the fixed-order warp_sum.
// Launched early: it waits here for alibi_slope_grad_kernel to end.
template <typename S, typename AccT>
__global__ void __launch_bounds__(kThreads)
    alibi_slope_combine_kernel(const AccT* __restrict__ partials, S* __restrict__ grad_slopes, int64_t heads,
                               int chunks) {
  cuda::wait_for_previous_grid();
  const int64_t h = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (h >= heads) return;  // whole warps leave together: kThreads is a multiple of 32
  AccT acc = 0;
  for (int c = lane; c < chunks; c += 32) acc += partials[h * chunks + c];
  acc = cuda::warp_sum(acc);
  if (lane == 0) grad_slopes[h] = static_cast<S>(acc);
}

template <typename T, typename S, typename AccT, int V, typename IndexT>
void launch_alibi_slope_grad(const T* grad, S* grad_slopes, AccT* partials, const AlibiShape& s,
                             const AlibiLaunchConfig& c) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t row_vectors = s.keys / V;
  const int64_t items_per_head = (s.batch * s.queries) << c.segments_log2;
  const int64_t items_per_chunk = ceil_div(items_per_head, c.chunks);
  const dim3 grid(static_cast<unsigned>(s.heads), static_cast<unsigned>(c.chunks));  // chunks <= 65535
  alibi_slope_grad_kernel<T, S, AccT, V, IndexT><<<grid, kThreads, 0, stream>>>(
      grad, c.chunks > 1 ? partials : nullptr, grad_slopes, static_cast<IndexT>(items_per_head),
      static_cast<IndexT>(items_per_chunk), c.segments_log2,
      static_cast<IndexT>(ceil_div<int64_t>(row_vectors, int64_t(1) << c.segments_log2)),
      static_cast<IndexT>(row_vectors), IntDivider<IndexT>(static_cast<IndexT>(s.queries)),
      static_cast<IndexT>(s.heads));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (c.chunks > 1) {
    const int64_t blocks = ceil_div<int64_t>(s.heads * 32, kThreads);
    cuda::launch(alibi_slope_combine_kernel<S, AccT>, {.grid = dim3(blocks), .block = dim3(kThreads), .early = true},
                 partials, grad_slopes, s.heads, static_cast<int>(c.chunks));
  }
}

void alibi_backward_out_cuda(const at::Tensor& grad, const at::Tensor& slopes, std::array<bool, 2> output_mask,
                             const at::Tensor& grad_scores, const at::Tensor& grad_slopes,
                             const at::Tensor& workspace) {
  check_alibi_args(kAlibiBackwardOp, "grad", grad, slopes);
  if (output_mask[0]) {
    check_out(kAlibiBackwardOp, "grad_scores", grad_scores, grad.sizes(), grad.scalar_type(), grad.device());
  }
  if (output_mask[1]) {
    check_out(kAlibiBackwardOp, "grad_slopes", grad_slopes, slopes.sizes(), slopes.scalar_type(), slopes.device());
    BARACUDA_CHECK_VALUE(grad_slopes.is_contiguous(), kAlibiBackwardOp, ": grad_slopes must be contiguous");
  }
  check_alibi_backward_overlap(grad, slopes, output_mask, grad_scores, grad_slopes, at::Tensor());
  const c10::cuda::CUDAGuard guard(grad.device());
  cuda::check_device_arch(kAlibiBackwardOp);
  if (output_mask[0]) grad_scores.copy_(grad);
  if (!output_mask[1] || grad_slopes.numel() == 0) return;
  if (grad.numel() == 0) {
    grad_slopes.zero_();
    return;
  }
  const auto s = alibi_shape(grad);
  const auto c = alibi_backward_config(s, grad.scalar_type(), cuda::device_facts());
  const int64_t need = c.workspace_bytes;
  check_workspace(kAlibiBackwardOp, workspace, need, 16, grad.device(),
                  {{"grad", grad}, {"slopes", slopes}, {"grad_scores", if_used(output_mask[0], grad_scores)},
                   {"grad_slopes", grad_slopes}});
  const auto g = cuda::aligned_contiguous(grad);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "alibi_backward_cuda", [&] {
    with_slope_type<scalar_t>(slopes, [&](auto* tag) {
      using slope_t = std::remove_pointer_t<decltype(tag)>;
      constexpr int kV = 16 / sizeof(scalar_t);
      const auto* gp = g.const_data_ptr<scalar_t>();
      auto* out = grad_slopes.mutable_data_ptr<slope_t>();
      auto* partials = need > 0 ? static_cast<acc_t*>(workspace.mutable_data_ptr()) : nullptr;
      const bool vec = c.vec_bytes == 16;
      if (c.index32) {
        vec ? launch_alibi_slope_grad<scalar_t, slope_t, acc_t, kV, uint32_t>(gp, out, partials, s, c)
            : launch_alibi_slope_grad<scalar_t, slope_t, acc_t, 1, uint32_t>(gp, out, partials, s, c);
      } else {
        vec ? launch_alibi_slope_grad<scalar_t, slope_t, acc_t, kV, uint64_t>(gp, out, partials, s, c)
            : launch_alibi_slope_grad<scalar_t, slope_t, acc_t, 1, uint64_t>(gp, out, partials, s, c);
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor> alibi_backward_cuda(const at::Tensor& grad, const at::Tensor& slopes,
                                                       std::array<bool, 2> output_mask) {
  check_alibi_args(kAlibiBackwardOp, "grad", grad, slopes);
  at::Tensor grad_scores, grad_slopes;
  if (output_mask[0]) grad_scores = at::empty(grad.sizes(), grad.options());
  if (output_mask[1]) grad_slopes = at::empty(slopes.sizes(), slopes.options());
  int64_t need = 0;
  if (output_mask[1] && grad.numel() > 0 && slopes.numel() > 0) {
    const c10::cuda::CUDAGuard guard(grad.device());
    const auto s = alibi_shape(grad);
    need = alibi_backward_config(s, grad.scalar_type(), cuda::device_facts()).workspace_bytes;
  }
  const auto workspace = at::empty({need}, grad.options().dtype(at::kByte));
  alibi_backward_out_cuda(grad, slopes, output_mask, grad_scores, grad_slopes, workspace);
  return {grad_scores, grad_slopes};
}

// The Plan's variant: the launch config, described.
KernelChoice alibi_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = alibi_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

KernelChoice alibi_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = alibi_backward_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("alibi", c10::DeviceType::CUDA, alibi_choice);
BARACUDA_REGISTER_VARIANT("alibi_backward", c10::DeviceType::CUDA, alibi_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("alibi", &baracuda::alibi_cuda);
  m.impl("alibi.out", &baracuda::alibi_out_cuda);
  m.impl("alibi_inplace", &baracuda::alibi_inplace_cuda);
  m.impl("alibi_backward", &baracuda::alibi_backward_cuda);
  m.impl("alibi_backward.out", &baracuda::alibi_backward_out_cuda);
}
