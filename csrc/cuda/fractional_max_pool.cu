// fractional_max_pool family (2d and 3d), CUDA kernels.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/fractional_max_pool.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kElemsPerThread = 4;                       // backward: input elements per thread
constexpr int64_t kTile = int64_t(kThreads) * kElemsPerThread;  // backward: input elements per block

// ---------------------------------------------------------------------------
// Choice of kernel: a pure function of the problem, used by the launchers and
// by the Plan API (through the variant registry).

constexpr int64_t kInt31 = int64_t(1) << 31;

struct FmpChoice {
  bool index32;       // 32-bit index math (fast division) when every dividend stays below 2^31
  int64_t tiles = 0;  // backward: blocks per plane (kTile input elements each)
};

FmpChoice choose_fmp(const FmpGeometry& g) {
  bool fits = g.planes() * g.in_plane() < kInt31 && g.planes() * g.out_plane() < kInt31;
  // Backward candidate ranges divide (x + 3) * (out + 1)-sized values.
  for (int a = 0; a < 3; ++a) fits = fits && (g.in[a] + 3) * (g.out[a] + 1) < kInt31;
  return {fits, ceil_div<int64_t>(g.in_plane(), kTile)};
}

// Claim counts, one int32 per backward block; none when nothing is launched.
int64_t fmp_backward_workspace_bytes(const FmpGeometry& g, const FmpChoice& c) {
  if (g.planes() == 0 || g.out_plane() == 0) return 0;
  return g.planes() * c.tiles * int64_t(sizeof(int32_t));
}

std::string fmp_variant(const FmpChoice& c) { return std::string("window_max<") + (c.index32 ? "i32" : "i64") + ">"; }

std::string fmp_backward_variant(const FmpChoice& c) {
  return std::string("owner_gather<") + (c.index32 ? "i32" : "i64") + ">+claim_check";
}

// ---------------------------------------------------------------------------
// Forward. One thread per output cell q = ((plane * outT + ot) * outH + oh) * outW + ow:
//   start_a = fmp_start<acc_t>(sample[plane][slot_a], o_a, in_a, out_a, k_a)  (PyTorch's CUDA formula)
//   y[q] = first max over the window of x[plane] (val > best || isnan(val), from -inf),
//   idx[q] = (t * inH + h) * inW + w of that element (window's first element if all are -inf).
// Writes are coalesced along ow; 64-bit indices are stored as PyTorch returns them.

template <typename IndexT>
struct FmpForwardParams {
  IndexT in[3], out[3], k[3];
  int sample_slot[3];
  int dims;  // samples per plane
  IntDivider<IndexT> out_w, out_h, out_plane;
  IndexT in_plane;
};

template <typename scalar_t, typename acc_t, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    fmp_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ samples,
                       scalar_t* __restrict__ y, int64_t* __restrict__ idx, FmpForwardParams<IndexT> p,
                       IndexT total) {
  const IndexT stride = IndexT(gridDim.x) * kThreads;
  for (IndexT q = IndexT(blockIdx.x) * kThreads + threadIdx.x; q < total; q += stride) {
    const auto pq = p.out_plane.divmod(q);
    const auto wq = p.out_w.divmod(pq.mod);
    const auto hq = p.out_h.divmod(wq.div);
    const IndexT plane = pq.div;
    const IndexT o[3] = {hq.div, hq.mod, wq.mod};
    IndexT start[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int slot = p.sample_slot[a];
      const acc_t u = slot < 0 ? acc_t(0) : static_cast<acc_t>(samples[int64_t(plane) * p.dims + slot]);
      start[a] = static_cast<IndexT>(fmp_start<acc_t>(u, int64_t(o[a]), p.in[a], p.out[a], p.k[a]));
    }
    const scalar_t* xp = x + int64_t(plane) * p.in_plane;
    acc_t best = -INFINITY;
    IndexT best_index = (start[0] * p.in[1] + start[1]) * p.in[2] + start[2];
    for (IndexT t = start[0]; t < start[0] + p.k[0]; ++t) {
      for (IndexT h = start[1]; h < start[1] + p.k[1]; ++h) {
        const IndexT row = (t * p.in[1] + h) * p.in[2];
        for (IndexT w = start[2]; w < start[2] + p.k[2]; ++w) {
          const acc_t v = static_cast<acc_t>(xp[row + w]);
          if (v > best || v != v) {
            best = v;
            best_index = row + w;
          }
        }
      }
    }
    y[q] = static_cast<scalar_t>(best);
    idx[q] = static_cast<int64_t>(best_index);
  }
}

template <typename scalar_t, typename IndexT>
void launch_fmp_forward(const FmpGeometry& g, const at::Tensor& x, const at::Tensor& samples,
                        const at::Tensor& output, const at::Tensor& indices) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpForwardParams<IndexT> p;
  for (int a = 0; a < 3; ++a) {
    p.in[a] = static_cast<IndexT>(g.in[a]);
    p.out[a] = static_cast<IndexT>(g.out[a]);
    p.k[a] = static_cast<IndexT>(g.k[a]);
    p.sample_slot[a] = g.sample_slot[a];
  }
  p.dims = g.dims;
  p.out_w = IntDivider<IndexT>(static_cast<IndexT>(g.out[2]));
  p.out_h = IntDivider<IndexT>(static_cast<IndexT>(g.out[1]));
  p.out_plane = IntDivider<IndexT>(static_cast<IndexT>(g.out_plane()));
  p.in_plane = static_cast<IndexT>(g.in_plane());
  const int64_t total = g.planes() * g.out_plane();
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(total, kThreads), int64_t(cuda::num_sms()) * 32);
  fmp_forward_kernel<scalar_t, acc_t, IndexT><<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(),
      indices.mutable_data_ptr<int64_t>(), p, static_cast<IndexT>(total));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int Dims>
void fmp_out_cuda(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef output_size,
                  const at::Tensor& random_samples, const at::Tensor& output, const at::Tensor& indices) {
  const auto g = check_fmp_forward(Dims, self, kernel_size, output_size, random_samples);
  check_fmp_forward_outs(Dims, self, output_size, output, indices);
  if (output.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  const auto c = choose_fmp(g);
  const auto x = self.contiguous();
  const auto s = random_samples.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_cuda", [&] {
    c.index32 ? launch_fmp_forward<scalar_t, uint32_t>(g, x, s, output, indices)
              : launch_fmp_forward<scalar_t, uint64_t>(g, x, s, output, indices);
  });
}

template <int Dims>
std::tuple<at::Tensor, at::Tensor> fmp_cuda(const at::Tensor& self, at::IntArrayRef kernel_size,
                                            at::IntArrayRef output_size, const at::Tensor& random_samples) {
  check_fmp_forward(Dims, self, kernel_size, output_size, random_samples);
  const auto shape = fmp_output_shape(Dims, self.sizes(), output_size);
  auto output = at::empty(shape, self.options());
  auto indices = at::empty(shape, self.options().dtype(at::kLong));
  fmp_out_cuda<Dims>(self, kernel_size, output_size, random_samples, output, indices);
  return {output, indices};
}

// ---------------------------------------------------------------------------
// Backward, owner-computes (no atomics). Every input element e = (t, h, w) of a
// plane sums, in increasing output order o, the grads of the output cells whose
// index equals e:  dx[e] = sum_{o : idx[o] == e} dy[o]  (acc_t, rounded once).
// Only output cells whose window can contain e are searched. Along one axis
// (A = in - k, B = out - 1), PyTorch's start for any sample is
// floor(o*A/B) or that + 1, and float/double rounding moves it by at most one
// more, so start(o) lies in [floor(o*A/B) - 1, floor(o*A/B) + 2] and the cells
// that can cover x are
//   o_lo = x >= k + 2 ? ceil((x - k - 1) * B / A) : 0,   o_hi = min(out - 1, ((x + 2) * B - 1) / A)
// (all cells when A == 0 or out == 1). Each block counts the cells it claimed;
// a second kernel compares each plane's claims with its cell count and, for a
// plane whose indices did not all fall in the searched windows (indices not
// made by the forward), recomputes it by scanning every cell of the plane. Out
// of range indices contribute nothing.

template <typename IndexT>
struct AxisCover {
  IndexT out, k, A, B;
  bool all;
  IntDivider<IndexT> div_a;

  __device__ __forceinline__ void range(IndexT x, IndexT& lo, IndexT& hi) const {
    if (all) {
      lo = 0;
      hi = out - 1;
      return;
    }
    const IndexT h = div_a.div((x + 2) * B - 1);
    hi = h < out - 1 ? h : out - 1;
    lo = x >= k + 2 ? div_a.div((x - k - 1) * B + A - 1) : IndexT(0);
  }
};

template <typename IndexT>
struct FmpGatherParams {
  AxisCover<IndexT> axis[3];
  IndexT out_h, out_w;
  IntDivider<IndexT> in_w, in_h;
  IndexT in_plane, out_plane, tiles;
};

template <typename scalar_t, typename acc_t, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    fmp_gather_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx, scalar_t* __restrict__ dx,
                      int32_t* __restrict__ claims, FmpGatherParams<IndexT> p) {
  __shared__ int32_t scratch[kThreads / 32];
  const int64_t block = blockIdx.x;
  const int64_t plane = block / p.tiles;
  const IndexT tile_begin = static_cast<IndexT>(block - plane * p.tiles) * IndexT(kTile);
  const scalar_t* dyp = dy + plane * p.out_plane;
  const int64_t* ip = idx + plane * p.out_plane;
  scalar_t* dxp = dx + plane * p.in_plane;
  int32_t claimed = 0;
#pragma unroll
  for (int j = 0; j < kElemsPerThread; ++j) {
    const IndexT e = tile_begin + IndexT(j * kThreads + threadIdx.x);
    if (e < p.in_plane) {
      const auto wq = p.in_w.divmod(e);
      const auto hq = p.in_h.divmod(wq.div);
      IndexT lo[3], hi[3];
      p.axis[0].range(hq.div, lo[0], hi[0]);
      p.axis[1].range(hq.mod, lo[1], hi[1]);
      p.axis[2].range(wq.mod, lo[2], hi[2]);
      acc_t acc = 0;
      for (IndexT ot = lo[0]; ot <= hi[0]; ++ot) {
        for (IndexT oh = lo[1]; oh <= hi[1]; ++oh) {
          const IndexT row = (ot * p.out_h + oh) * p.out_w;
          for (IndexT ow = lo[2]; ow <= hi[2]; ++ow) {
            if (ip[row + ow] == static_cast<int64_t>(e)) {
              acc += static_cast<acc_t>(dyp[row + ow]);
              ++claimed;
            }
          }
        }
      }
      dxp[e] = static_cast<scalar_t>(acc);
    }
  }
  claimed = cuda::block_sum(claimed, scratch);
  if (threadIdx.x == 0) claims[block] = claimed;
}

// Per plane: sum of its blocks' claims (fixed order) == out_plane, or the plane
// is recomputed by a full ordered scan (same sum order as the gather).
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    fmp_claim_check_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                           scalar_t* __restrict__ dx, const int32_t* __restrict__ claims, int64_t planes,
                           int64_t tiles, int64_t in_plane, int64_t out_plane) {
  for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
    int64_t total = 0;
    for (int64_t j = 0; j < tiles; ++j) total += claims[plane * tiles + j];
    if (total == out_plane) continue;
    const scalar_t* dyp = dy + plane * out_plane;
    const int64_t* ip = idx + plane * out_plane;
    for (int64_t e = threadIdx.x; e < in_plane; e += kThreads) {
      acc_t acc = 0;
      for (int64_t o = 0; o < out_plane; ++o) {
        if (ip[o] == e) acc += static_cast<acc_t>(dyp[o]);
      }
      dx[plane * in_plane + e] = static_cast<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, typename IndexT>
void launch_fmp_backward(const FmpGeometry& g, const FmpChoice& c, const at::Tensor& dy, const at::Tensor& idx,
                         const at::Tensor& dx, const at::Tensor& workspace) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpGatherParams<IndexT> p;
  for (int a = 0; a < 3; ++a) {
    auto& ax = p.axis[a];
    ax.out = static_cast<IndexT>(g.out[a]);
    ax.k = static_cast<IndexT>(g.k[a]);
    ax.A = static_cast<IndexT>(g.in[a] - g.k[a]);
    ax.B = static_cast<IndexT>(g.out[a] - 1);
    ax.all = g.in[a] == g.k[a] || g.out[a] == 1;
    if (!ax.all) ax.div_a = IntDivider<IndexT>(ax.A);
  }
  p.out_h = static_cast<IndexT>(g.out[1]);
  p.out_w = static_cast<IndexT>(g.out[2]);
  p.in_w = IntDivider<IndexT>(static_cast<IndexT>(g.in[2]));
  p.in_h = IntDivider<IndexT>(static_cast<IndexT>(g.in[1]));
  p.in_plane = static_cast<IndexT>(g.in_plane());
  p.out_plane = static_cast<IndexT>(g.out_plane());
  p.tiles = static_cast<IndexT>(c.tiles);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* claims = reinterpret_cast<int32_t*>(workspace.mutable_data_ptr());
  const int64_t blocks = g.planes() * c.tiles;
  fmp_gather_kernel<scalar_t, acc_t, IndexT><<<blocks, kThreads, 0, stream>>>(
      dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), claims, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t check_blocks = std::min<int64_t>(g.planes(), int64_t(cuda::num_sms()) * 16);
  fmp_claim_check_kernel<scalar_t, acc_t><<<check_blocks, kThreads, 0, stream>>>(
      dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), claims,
      g.planes(), c.tiles, g.in_plane(), g.out_plane());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int Dims>
void fmp_backward_out_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                           at::IntArrayRef output_size, const at::Tensor& indices, const at::Tensor& grad_input,
                           const at::Tensor& workspace) {
  const char* op = fmp_op_name(Dims, true);
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  check_fmp_grad_input(Dims, self, grad_input);
  if (grad_input.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  if (g.out_plane() == 0) {
    grad_input.zero_();
    return;
  }
  const auto c = choose_fmp(g);
  const int64_t need = fmp_backward_workspace_bytes(g, c);
  check_same_device(op, "self", self, "workspace", workspace);
  TORCH_CHECK_VALUE(workspace.is_contiguous() && workspace.nbytes() >= static_cast<size_t>(need) &&
                        cuda::is_aligned(workspace.const_data_ptr(), 4),
                    op, ": workspace has ", workspace.nbytes(), " bytes, needs ", need,
                    " contiguous 4-byte-aligned bytes");
  const auto dy = grad_output.contiguous();
  const auto idx = indices.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_backward_cuda", [&] {
    c.index32 ? launch_fmp_backward<scalar_t, uint32_t>(g, c, dy, idx, grad_input, workspace)
              : launch_fmp_backward<scalar_t, uint64_t>(g, c, dy, idx, grad_input, workspace);
  });
}

template <int Dims>
at::Tensor fmp_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                             at::IntArrayRef output_size, const at::Tensor& indices) {
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  auto grad_input = at::empty(self.sizes(), self.options());
  const auto workspace =
      at::empty({fmp_backward_workspace_bytes(g, choose_fmp(g))}, self.options().dtype(at::kByte));
  fmp_backward_out_cuda<Dims>(grad_output, self, kernel_size, output_size, indices, grad_input, workspace);
  return grad_input;
}

// problem = [dims, input ndim, *input_shape, *kernel_size, *output_size]
KernelChoice fmp_choice(c10::IntArrayRef problem, c10::ScalarType) {
  return {fmp_variant(choose_fmp(fmp_geometry_of_problem("baracuda::fractional_max_pool", problem))), 0};
}

KernelChoice fmp_backward_choice(c10::IntArrayRef problem, c10::ScalarType) {
  const auto g = fmp_geometry_of_problem("baracuda::fractional_max_pool_backward", problem);
  const auto c = choose_fmp(g);
  return {fmp_backward_variant(c), fmp_backward_workspace_bytes(g, c)};
}

BARACUDA_REGISTER_VARIANT("fractional_max_pool2d", c10::DeviceType::CUDA, fmp_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d", c10::DeviceType::CUDA, fmp_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool2d_backward", c10::DeviceType::CUDA, fmp_backward_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d_backward", c10::DeviceType::CUDA, fmp_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("fractional_max_pool2d", &baracuda::fmp_cuda<2>);
  m.impl("fractional_max_pool2d.out", &baracuda::fmp_out_cuda<2>);
  m.impl("fractional_max_pool2d_backward", &baracuda::fmp_backward_cuda<2>);
  m.impl("fractional_max_pool2d_backward.out", &baracuda::fmp_backward_out_cuda<2>);
  m.impl("fractional_max_pool3d", &baracuda::fmp_cuda<3>);
  m.impl("fractional_max_pool3d.out", &baracuda::fmp_out_cuda<3>);
  m.impl("fractional_max_pool3d_backward", &baracuda::fmp_backward_cuda<3>);
  m.impl("fractional_max_pool3d_backward.out", &baracuda::fmp_backward_out_cuda<3>);
}
