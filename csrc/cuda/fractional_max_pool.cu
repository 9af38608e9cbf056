// fractional_max_pool family (2d and 3d), CUDA kernels.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/fractional_max_pool.h"
#include "baracuda/fractional_max_pool_policy.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

// The choice of kernel and its launch shape: fmp_forward_config and
// fmp_backward_config (baracuda/fractional_max_pool_policy.h), with the device's facts.
constexpr int kThreads = kFmpThreads;
constexpr int kBwdThreads = kFmpBwdThreads;
// Backward: blocks per SM the registers must allow (__launch_bounds__): 4 (64
// registers); at 5 (48) the tile kernels spill loaded values right after their loads,
// and the spill stores wait on the loads.
constexpr int fmp_bwd_blocks_per_sm(int dims, bool index32) { return !index32 ? 2 : 4; }
constexpr int kCellsPerThread = 8;       // backward: output cells a thread holds per chunk
constexpr int kBoxCells = kFmpBoxCells;
constexpr int kRowRun = 3;               // backward, tile_counts: candidates of a row visited unrolled (at most 3
                                         // along W for 3 x 3 windows at strides above 4 / 3)
constexpr int kTileTable = 8;            // backward: tiles per plane whose geometry the host computes
constexpr int kLaterCap = kFmpLaterCap;
// Backward, overlapping windows: a box cell's staged target is its tile element (a
// tile holds at most kFmpTileBytes / 4 elements), kNoTarget for a cell whose index is not
// in the tile.
constexpr uint16_t kNoTarget = 0xffff;
static_assert(kFmpTileBytes / 4 < kNoTarget);
// Overlapping windows: 16-bit contribution counts, which cannot overflow: a tile's box
// holds fewer cells (each takes at least 8 of a block's at most 227 KB of shared memory).
static_assert(227 * 1024 / 8 < (1 << 16));

// ---------------------------------------------------------------------------
// Forward. For plane (n, c) and output cell (ot, oh, ow) of that plane:
//   start_a = fmp_start<acc_t>(sample[plane][slot_a], o_a, in_a, out_a, k_a)   (PyTorch's CUDA formula;
//             alpha per axis computed once on the host, the same IEEE division)
//   y   = first max over the window [start_a, start_a + k_a) of x[plane], in (t, h, w) order
//         (val > best || isnan(val), from -inf),
//   idx = (t * inH + h) * inW + w of that element (the window's first element if all are -inf).
// Work items are (plane, segment) pairs, a segment being blockDim.x * kCells
// consecutive cells of one plane (fmp_forward_config). Each block walks a contiguous
// range of items: one item when the windows are disjoint (every input element is
// loaded once: the kernel streams, and many short blocks keep DRAM busiest), else as
// many as spread the items over kFmpForwardWaves waves of resident blocks (overlapping
// windows hit L1 for most loads; the kernel is latency bound and a block's later
// items reuse its start table). Thread j takes cells j, j + blockDim.x, ... of the
// segment, so loads and stores coalesce. With a start table the block computes its
// plane's window starts (outT + outH + outW values) into shared memory when the plane
// changes, and a cell's window origin costs one division by a constant (two in 3d)
// and two or three shared loads; without one (huge axes) each cell evaluates the
// formula. With K > 0 (every pooled axis has k = K) every window element of the
// thread's kCells cells is loaded before the first compare, kCells * K^Dims loads in
// flight; cells past the plane's end load the last cell's window and store nothing.
// K == 0: any k, one cell per thread, scanned in loops. 64-bit indices are stored as
// PyTorch returns them. 2d problems with K > 0 take fmp2d_forward_band_kernel instead
// where a band of rows fits in shared memory (fmp_forward_config). Cells are strided
// across the threads, not run consecutively per thread: runs would make each load and
// store instruction span several times the lines.

template <typename IndexT, typename acc_t>
struct FmpForwardParams {
  IndexT in[3], out[3], k[3];
  acc_t alpha[3];      // fmp_alpha<acc_t>(in, out, k) per axis
  int sample_slot[3];  // -1: none (2d's T)
  int dims;            // samples per plane
  IntDivider<IndexT> out_w, out_h;
  IndexT in_plane, out_plane;
  IndexT segment_cells, segments;  // cells of a segment, segments of a plane
  int64_t items, items_per_block;  // planes * segments; contiguous items per block
  bool table;                      // window starts tabulated in shared memory
};

// Window start along axis a of output row/column o of the plane whose samples are u.
template <typename scalar_t, typename acc_t, typename IndexT>
__device__ __forceinline__ IndexT fmp_axis_start(const FmpForwardParams<IndexT, acc_t>& p,
                                                 const scalar_t* __restrict__ u, int a, IndexT o) {
  const acc_t sample = p.sample_slot[a] < 0 ? acc_t(0) : static_cast<acc_t>(u[p.sample_slot[a]]);
  return static_cast<IndexT>(fmp_start_from<acc_t>(sample, p.alpha[a], fmp_trunc<acc_t>(sample * p.alpha[a]),
                                                   int64_t(o), p.in[a], p.out[a], p.k[a]));
}

// Plane-relative offset of the first element of cell q's window. The start table
// holds [T starts (3d only)][H starts][W starts].
template <int Dims, typename scalar_t, typename acc_t, typename IndexT>
__device__ __forceinline__ IndexT fmp_window_origin(const FmpForwardParams<IndexT, acc_t>& p,
                                                    const IndexT* table, const scalar_t* __restrict__ u, IndexT q) {
  const auto wq = p.out_w.divmod(q);
  IndexT o[3] = {0, wq.div, wq.mod};
  if constexpr (Dims == 3) {
    const auto hq = p.out_h.divmod(wq.div);
    o[0] = hq.div;
    o[1] = hq.mod;
  }
  const IndexT off_h = Dims == 3 ? p.out[0] : IndexT(0);
  IndexT start[3] = {0, 0, 0};
#pragma unroll
  for (int a = 3 - Dims; a < 3; ++a) {
    start[a] = table != nullptr ? table[(a == 0 ? 0 : (a == 1 ? off_h : off_h + p.out[1])) + o[a]]
                                : fmp_axis_start<scalar_t, acc_t, IndexT>(p, u, a, o[a]);
  }
  return (start[0] * p.in[1] + start[1]) * p.in[2] + start[2];
}

// The K^Dims window of each of kCells cells, read from src at offsets at[c] (the
// window's first element; rows in_w apart, T-slices in_h * in_w apart), every load
// issued before any value is used. The (t, h, w) loops are spelled out here and in
// fmp_window_max: a shared visitor lambda costs registers and speed in 3d, and one flat
// loop with the offsets derived from its index takes up to 128 registers where these
// take 78 (3d, k = 3, float32).
template <int Dims, int K, int kCells, typename scalar_t, typename IndexT>
__device__ __forceinline__ void fmp_load_windows(const scalar_t* src, const IndexT (&at)[kCells], IndexT in_h,
                                                 IndexT in_w, scalar_t (&vals)[kCells][fmp_window(Dims, K)]) {
  constexpr int KT = Dims == 3 ? K : 1;
#pragma unroll
  for (int c = 0; c < kCells; ++c) {
#pragma unroll
    for (int dt = 0; dt < KT; ++dt) {
#pragma unroll
      for (int dh = 0; dh < K; ++dh) {
#pragma unroll
        for (int dw = 0; dw < K; ++dw) {
          vals[c][(dt * K + dh) * K + dw] = src[at[c] + (IndexT(dt) * in_h + dh) * in_w + dw];
        }
      }
    }
  }
}

// y and idx of a cell from its loaded window: the first max in (t, h, w) order
// (val > best || isnan(val), from -inf) and its plane index, counted from the
// window's plane-relative origin. Stored with streaming hints: written once, never
// read back by the kernel.
template <int Dims, int K, typename acc_t, typename scalar_t, typename IndexT>
__device__ __forceinline__ void fmp_window_max(const scalar_t (&vals)[fmp_window(Dims, K)], IndexT origin,
                                               IndexT in_h, IndexT in_w, scalar_t* y, int64_t* index) {
  constexpr int KT = Dims == 3 ? K : 1;
  acc_t best = -INFINITY;
  IndexT best_index = origin;
#pragma unroll
  for (int dt = 0; dt < KT; ++dt) {
#pragma unroll
    for (int dh = 0; dh < K; ++dh) {
#pragma unroll
      for (int dw = 0; dw < K; ++dw) {
        const acc_t v = static_cast<acc_t>(vals[(dt * K + dh) * K + dw]);
        if (v > best || v != v) {
          best = v;
          best_index = origin + (IndexT(dt) * in_h + dh) * in_w + dw;
        }
      }
    }
  }
  cuda::store_streaming(y, static_cast<scalar_t>(best));
  cuda::store_streaming(index, static_cast<int64_t>(best_index));
}

template <typename scalar_t, typename acc_t, typename IndexT, int Dims, int K>
__global__ void __launch_bounds__(kThreads)
    fmp_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ samples,
                       scalar_t* __restrict__ y, int64_t* __restrict__ idx, FmpForwardParams<IndexT, acc_t> p) {
  constexpr int kWindow = fmp_window(Dims, K);
  constexpr int kCells = fmp_cells_per_thread(kWindow);
  extern __shared__ __align__(16) unsigned char fmp_smem[];
  IndexT* const table = p.table ? reinterpret_cast<IndexT*>(fmp_smem) : nullptr;
  const IndexT off_h = Dims == 3 ? p.out[0] : IndexT(0);

  const int64_t first = int64_t(blockIdx.x) * p.items_per_block;
  const int64_t last = std::min(first + p.items_per_block, p.items);
  int64_t plane = first / p.segments;
  IndexT segment = static_cast<IndexT>(first - plane * p.segments);
  int64_t table_plane = -1;
  for (int64_t item = first; item < last; ++item) {
    const scalar_t* const u = samples + plane * p.dims;
    if (table != nullptr && plane != table_plane) {
      __syncthreads();  // the previous plane's starts are no longer read
#pragma unroll
      for (int a = 3 - Dims; a < 3; ++a) {
        const IndexT offset = a == 0 ? IndexT(0) : (a == 1 ? off_h : off_h + p.out[1]);
        for (IndexT o = threadIdx.x; o < p.out[a]; o += blockDim.x) {
          table[offset + o] = fmp_axis_start<scalar_t, acc_t, IndexT>(p, u, a, o);
        }
      }
      __syncthreads();
      table_plane = plane;
    }
    const scalar_t* const xp = x + plane * int64_t(p.in_plane);
    scalar_t* const yp = y + plane * int64_t(p.out_plane);
    int64_t* const ip = idx + plane * int64_t(p.out_plane);
    const IndexT q0 = segment * p.segment_cells + threadIdx.x;
    if constexpr (K > 0) {
      IndexT origin[kCells];
      scalar_t vals[kCells][kWindow];
#pragma unroll
      for (int c = 0; c < kCells; ++c) {
        const IndexT q = std::min<IndexT>(q0 + IndexT(c * blockDim.x), p.out_plane - 1);
        origin[c] = fmp_window_origin<Dims, scalar_t, acc_t, IndexT>(p, table, u, q);
      }
      fmp_load_windows<Dims, K, kCells>(xp, origin, p.in[1], p.in[2], vals);
#pragma unroll
      for (int c = 0; c < kCells; ++c) {
        const IndexT q = q0 + IndexT(c * blockDim.x);
        if (q < p.out_plane) fmp_window_max<Dims, K, acc_t>(vals[c], origin[c], p.in[1], p.in[2], yp + q, ip + q);
      }
    } else if (q0 < p.out_plane) {
      const IndexT origin = fmp_window_origin<Dims, scalar_t, acc_t, IndexT>(p, table, u, q0);
      acc_t best = -INFINITY;
      IndexT best_index = origin;
      for (IndexT dt = 0; dt < p.k[0]; ++dt) {
        for (IndexT dh = 0; dh < p.k[1]; ++dh) {
          const IndexT row = origin + (dt * p.in[1] + dh) * p.in[2];
          for (IndexT dw = 0; dw < p.k[2]; ++dw) {
            const acc_t v = static_cast<acc_t>(xp[row + dw]);
            if (v > best || v != v) {
              best = v;
              best_index = row + dw;
            }
          }
        }
      }
      yp[q0] = static_cast<scalar_t>(best);
      ip[q0] = static_cast<int64_t>(best_index);
    }
    if (++segment == p.segments) {
      segment = 0;
      ++plane;
    }
  }
}

// Copies src[0, len) to dst[shift, shift + len) with 16-byte vectors (src + i and
// dst + shift + i are 16-byte aligned together: shift is src's offset from 16-byte
// alignment, in elements), each thread's vectors loaded before any is stored; the
// elements before and after the vectors one at a time.
template <typename scalar_t, typename IndexT>
__device__ __forceinline__ void fmp_stage_range(const scalar_t* __restrict__ src, IndexT len, int shift,
                                                scalar_t* dst) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  constexpr int kInFlight = 4;
  const IndexT head = std::min<IndexT>(len, IndexT((kVec - shift) % kVec));
  const IndexT nvec = (len - head) / kVec;
  for (IndexT i = threadIdx.x; i < head; i += blockDim.x) dst[shift + i] = src[i];
  for (IndexT first = threadIdx.x; first < nvec; first += kInFlight * blockDim.x) {
    cuda::Vec<scalar_t, kVec> v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const IndexT q = first + IndexT(j) * blockDim.x;
      if (q < nvec) v[j] = cuda::load_vec<scalar_t, kVec>(src + head + q * kVec);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const IndexT q = first + IndexT(j) * blockDim.x;
      if (q < nvec) cuda::store_vec<scalar_t, kVec>(dst + shift + head + q * kVec, v[j]);
    }
  }
  for (IndexT i = head + nvec * kVec + threadIdx.x; i < len; i += blockDim.x) dst[shift + i] = src[i];
}

// Forward, 2d, input rows staged in shared memory (fmp_forward_config). Block b takes
// band (b mod bands) of plane (b / bands): output rows [o0, o0 + rows), whose windows
// cover the input rows [r0, r1) = [start_h(o0), start_h(o0 + rows - 1) + k_h) (starts
// never decrease along an axis), one contiguous range of the plane. The block tabulates
// the band's H starts and the plane's W starts, and when [r0, r1) fits the
// band_in_rows it was sized for (always, for samples in [0, 1)) copies those rows into
// shared memory and reads its windows there (else from global memory). Then as in
// fmp_forward_kernel: thread j takes cells j, j + blockDim.x, ... of each segment of
// blockDim.x * kCells cells of the band, every window load before the first compare.
template <typename scalar_t, typename acc_t, int K>
__global__ void __launch_bounds__(kThreads)
    fmp2d_forward_band_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ samples,
                              scalar_t* __restrict__ y, int64_t* __restrict__ idx,
                              FmpForwardParams<uint32_t, acc_t> p, uint32_t band_rows, uint32_t band_in_rows,
                              IntDivider<uint32_t> bands) {
  using IndexT = uint32_t;
  constexpr int kWindow = fmp_window(2, K);
  constexpr int kCells = fmp_cells_per_thread(kWindow);
  constexpr int kVec = 16 / sizeof(scalar_t);
  extern __shared__ __align__(16) unsigned char fmp_smem[];
  IndexT* const start_h = reinterpret_cast<IndexT*>(fmp_smem);  // the band's rows
  IndexT* const start_w = start_h + band_rows;
  const IndexT table_bytes = ceil_div<IndexT>((band_rows + p.out[2]) * sizeof(IndexT), 16) * 16;
  scalar_t* const staged = reinterpret_cast<scalar_t*>(fmp_smem + table_bytes);

  const auto pb = bands.divmod(blockIdx.x);
  const IndexT plane = pb.div, o0 = pb.mod * band_rows;
  const IndexT rows = std::min(band_rows, p.out[1] - o0);
  const scalar_t* const u = samples + int64_t(plane) * 2;
  for (IndexT o = threadIdx.x; o < rows; o += blockDim.x) {
    start_h[o] = fmp_axis_start<scalar_t, acc_t, IndexT>(p, u, 1, o0 + o);
  }
  for (IndexT o = threadIdx.x; o < p.out[2]; o += blockDim.x) {
    start_w[o] = fmp_axis_start<scalar_t, acc_t, IndexT>(p, u, 2, o);
  }
  __syncthreads();
  const scalar_t* const xp = x + int64_t(plane) * p.in_plane;
  const IndexT r0 = start_h[0], r1 = std::min(p.in[1], start_h[rows - 1] + p.k[1]);
  const IndexT g0 = r0 * p.in[2];
  const int shift = static_cast<int>((reinterpret_cast<uintptr_t>(xp + g0) / sizeof(scalar_t)) % kVec);
  const bool stage = r1 - r0 <= band_in_rows;
  if (stage) fmp_stage_range<scalar_t, IndexT>(xp + g0, (r1 - r0) * p.in[2], shift, staged);
  __syncthreads();

  const IndexT n = rows * p.out[2];
  scalar_t* const yp = y + int64_t(plane) * p.out_plane + o0 * p.out[2];
  int64_t* const ip = idx + int64_t(plane) * p.out_plane + o0 * p.out[2];
  // Window origin o (plane-relative) is read at src[o - sub].
  auto band_cells = [&](const scalar_t* src, IndexT sub) {
    for (IndexT first = 0; first < n; first += IndexT(blockDim.x) * kCells) {
      const IndexT q0 = first + threadIdx.x;
      IndexT origin[kCells], at[kCells];
      scalar_t vals[kCells][kWindow];
#pragma unroll
      for (int c = 0; c < kCells; ++c) {
        const auto hw = p.out_w.divmod(std::min<IndexT>(q0 + IndexT(c * blockDim.x), n - 1));
        origin[c] = start_h[hw.div] * p.in[2] + start_w[hw.mod];
        at[c] = origin[c] - sub;
      }
      fmp_load_windows<2, K, kCells>(src, at, p.in[1], p.in[2], vals);
#pragma unroll
      for (int c = 0; c < kCells; ++c) {
        const IndexT q = q0 + IndexT(c * blockDim.x);
        if (q < n) fmp_window_max<2, K, acc_t>(vals[c], origin[c], p.in[1], p.in[2], yp + q, ip + q);
      }
    }
  };
  if (stage) {
    band_cells(staged, g0 - IndexT(shift));
  } else {
    band_cells(xp, 0);
  }
}

template <typename scalar_t, typename IndexT, int Dims, int K>
void launch_fmp_forward(const FmpForwardConfig& c, const FmpGeometry& g, const at::Tensor& x, const at::Tensor& samples,
                        const at::Tensor& output, const at::Tensor& indices) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpForwardParams<IndexT, acc_t> p;
  for (int a = 0; a < 3; ++a) {
    p.in[a] = static_cast<IndexT>(g.in[a]);
    p.out[a] = static_cast<IndexT>(g.out[a]);
    p.k[a] = static_cast<IndexT>(g.k[a]);
    p.alpha[a] = fmp_alpha<acc_t>(g.in[a], g.out[a], g.k[a]);
    p.sample_slot[a] = g.sample_slot[a];
  }
  p.dims = g.dims;
  p.out_w = IntDivider<IndexT>(static_cast<IndexT>(g.out[2]));
  p.out_h = IntDivider<IndexT>(static_cast<IndexT>(g.out[1]));
  p.in_plane = static_cast<IndexT>(g.in_plane());
  p.out_plane = static_cast<IndexT>(g.out_plane());
  p.segment_cells = static_cast<IndexT>(c.threads * fmp_cells_per_thread(fmp_window(Dims, K)));
  p.segments = ceil_div<IndexT>(p.out_plane, p.segment_cells);
  p.items = g.planes() * int64_t(p.segments);
  p.table = c.table;
  if constexpr (Dims == 2 && K > 0 && std::is_same_v<IndexT, uint32_t>) {
    if (c.kind == FmpForwardKernel::kBands) {
      auto kernel = fmp2d_forward_band_kernel<scalar_t, acc_t, K>;
      cuda::allow_dynamic_smem(kernel, c.smem);
      kernel<<<c.blocks, c.threads, c.smem, c10::cuda::getCurrentCUDAStream()>>>(
          x.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(),
          indices.mutable_data_ptr<int64_t>(), p, static_cast<uint32_t>(c.band_rows),
          static_cast<uint32_t>(c.band_in_rows), IntDivider<uint32_t>(static_cast<uint32_t>(c.bands)));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  auto kernel = fmp_forward_kernel<scalar_t, acc_t, IndexT, Dims, K>;
  FmpForwardConfig grid = c;
  if (c.kind == FmpForwardKernel::kResidentWaves) {
    fmp_forward_resident_grid(grid, cuda::resident_groups(kernel, c.threads, 1, c.smem));
  }
  p.items_per_block = grid.items_per_block;
  kernel<<<grid.blocks, c.threads, c.smem, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(),
      indices.mutable_data_ptr<int64_t>(), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Calls launch_fmp_forward with the unrolled window of the choice.
template <int Dims, typename scalar_t>
void launch_fmp_forward_for(const FmpForwardConfig& c, const FmpGeometry& g, const at::Tensor& x,
                            const at::Tensor& samples, const at::Tensor& output, const at::Tensor& indices) {
  if (!c.index32) {
    launch_fmp_forward<scalar_t, uint64_t, Dims, 0>(c, g, x, samples, output, indices);  // fmp_forward_config: k == 0
  } else if (c.k == 2) {
    launch_fmp_forward<scalar_t, uint32_t, Dims, 2>(c, g, x, samples, output, indices);
  } else if (c.k == 3) {
    launch_fmp_forward<scalar_t, uint32_t, Dims, 3>(c, g, x, samples, output, indices);
  } else {
    launch_fmp_forward<scalar_t, uint32_t, Dims, 0>(c, g, x, samples, output, indices);
  }
}

template <int Dims>
void fmp_out_cuda(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef output_size,
                  const at::Tensor& random_samples, const at::Tensor& output, const at::Tensor& indices) {
  const auto g = check_fmp_forward(Dims, self, kernel_size, output_size, random_samples);
  check_fmp_forward_outs(Dims, self, output_size, output, indices);
  check_no_overlap(fmp_op_name(Dims, false), {{"output", output}, {"indices", indices}},
                   {{"self", self}, {"random_samples", random_samples}});
  if (output.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  cuda::check_device_arch(fmp_op_name(Dims, false));
  const auto c = fmp_forward_config(g, self.scalar_type(), cuda::device_facts());
  const auto x = self.contiguous();
  const auto s = random_samples.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_cuda",
                             [&] { launch_fmp_forward_for<Dims, scalar_t>(c, g, x, s, output, indices); });
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
// Backward: dx[e] = sum_{o : idx[o] == e} dy[o] per plane, deterministic: each
// element's contributions are added from 0 in increasing o, as PyTorch's CPU kernel
// adds them, or in an order that gives the same bits (two contributions, either order).
//
// Geometry. Along one axis (A = in - k >= B = out - 1, since out + k - 1 <= in),
// let f(c) = floor(c * A / B) (f = A when out == 1). In exact arithmetic the
// forward's window of cell c starts at floor((c + u) * alpha) - floor(u * alpha),
// which is f(c) or f(c) + 1; float rounding moves it by at most one more in
// practice (measured: never outside [f - 1, f + 1]). The REACH of cell c is
//   reach(c) = [f(c) - 1, f(c) + k]        (the window for any start in [f-1, f+1]).
// The CANDIDATES of input position x are the cells whose reach holds it, those with
// f(c) in [x - k, x + 1]: the consecutive cells first(x)..last(x).
//
// Tiles. Block b owns tile (b mod tiles) of plane (b / tiles): an input box
// [x0, x1) per axis that is one contiguous range [g0, g0 + len) of the plane
// (fmp_backward_config). It walks, in chunks of kBwdThreads * kCellsPerThread, the
// box of cells whose reach meets the tile (fmp_reach_cells), each cell at its place in
// a box of the widest extents over the tiles (fmp_tile; when the box holds whole rows
// of cells, place q is cell o0 + q); each thread loads its cells' dy and idx
// coalesced. A cell whose index lies in the tile is the tile's. A cell whose index
// lies in the plane but in another tile is that tile's too when the index is in the
// cell's reach (that tile's box then holds the cell); else, and for an index outside
// the plane, the cell is a STRAY.
//
// Every block zeroes an accumulator for its tile in shared memory and ends by storing
// it to dx as scalar_t with 16-byte vectors (acc_t sums rounded once).
//
// Overlapping windows (tile_counts). Each tile element has a 16-bit count in shared
// memory. Each of the tile's cells adds 1 to its element's count (integer atomicAdd),
// which returns the cell's rank among the element's contributions; rank 0 stores
// 0 + dy into the accumulator; every one of them stages its dy and its target (the
// element) at its box place; rank 1 lists its box place, rank 2 the element. After a
// barrier each listed rank-1 cell whose element has count 2 adds its dy (either order
// gives the same sum, -0 included), and each listed element (three or more
// contributions), a thread each, is summed again from 0, adding in increasing o the
// staged dy of the element's candidates that target it (first those whose window can
// hold it unless float rounding moved it, f(c) in [x - k, x] per axis: 3 x 3 instead of
// 4 x 4 at the benchmark's 3 x 3 windows; if fewer than the count do, all); if fewer
// than the count do (a contributor from outside its reach) the block flags a stray. So
// a contribution from outside a cell's reach costs nothing unless its element has three
// or more.
//
// Disjoint windows (tile_stores; k <= alpha on every axis, fmp_forward_config): the forward's
// indices give each element at most one contribution, so fields are 1 "seen" bit:
// the first cell to set it stores 0 + dy (0 + (-0) = +0, as an add would give) into
// the zeroed accumulator (stored to dx with 16-byte vectors last). That accumulator
// holds scalar_t (0 + dy in acc_t rounds back to dy exactly), so 16-bit tiles hold
// twice the elements (3d bfloat16: 8 T-slices, not 4, and fewer cells loaded twice).
// A cell that finds it set (float rounding can move a window start onto its
// neighbour's last element, which is often the max of both windows) is kept in a
// short list and added after the barrier, in acc_t and rounded once as the CPU kernel
// does: two contributions sum the same in either order. A third to one element, or a
// full list, flags the block like a stray, so that the ordered scan below recomputes
// the plane (whatever the racing stores left). The two window kinds are two
// instantiations (Disjoint).
//
// Strays. A block that sees one writes flag 1 (else 0) to workspace[b], and
// fmp_stray_fixup_kernel recomputes every plane with a flag by a full ordered
// scan (fmp_scan_plane: sum over all o in increasing order; out-of-plane indices add
// nothing); with one tile per plane the block scans its plane itself instead of
// storing its tile, and no fixup kernel is launched. Every cell is loaded by at least
// one tile (reach(c) meets [0, in)), so every stray is seen. Forward indices are never
// strays unless float rounding moved a start by two, which only costs time.
// (Counts are faster at overlapping windows than a field of bits per element naming
// its contributors, which needs two lists and passes of offsets, and than rounds of
// cells that cannot collide, added between barriers.)

template <typename IndexT>
struct FmpBwdAxis {
  IndexT in, out, k, A;    // A = in - k
  IndexT f_base;           // A when out == 1 (so that f(0) = A), else 0
  IntDivider<IndexT> B;    // out - 1 (1 when out == 1)
  IntDivider<IndexT> A_div;  // A (1 when A == 0, which implies out == 1)
  IndexT tile;             // input extent of a tile
  IntDivider<IndexT> count;  // tiles along this axis

  __device__ __forceinline__ IndexT f(IndexT c) const { return B.div(c * A + f_base); }
  // The first cell whose reach can hold x (fmp_reach_cells' c0 for [x, x]).
  __device__ __forceinline__ IndexT first(IndexT x) const {
    if (out == 1 || x <= k) return 0;
    const IndexT c = A_div.div((x - k) * B.divisor + A - 1);
    return c < out ? c : out - 1;
  }
  // The last cell c with f(c) <= x + margin. Margin 1: the last whose reach can hold
  // x (fmp_reach_cells' c0 + n - 1 for [x, x]); margin 0: the last whose window can
  // hold x unless float rounding moved it (its start is f(c) or f(c) + 1 in exact
  // arithmetic, so the window lies in [f(c), f(c) + k]).
  __device__ __forceinline__ IndexT last(IndexT x, IndexT margin = 1) const {
    if (out == 1) return 0;
    const IndexT c = A_div.div((x + 1 + margin) * B.divisor - 1);
    return c < out ? c : out - 1;
  }
};

// A tile's geometry (the same in every plane), and with it the block's plane and the
// alignment of its dx.
template <typename IndexT>
struct FmpTile {
  IndexT plane, g0;    // the plane; the tile's first element within the plane
  int len, shift;      // elements of the tile; its dx start's offset from 16-byte alignment, in elements
  IndexT c0[3], n[3];  // per axis, the cells whose reach meets the tile: [c0, c0 + n)
  IndexT o0;           // the box's first cell (c0 on every axis), plane-relative
  IndexT ncells;       // box places to visit: with whole rows n[T] x n[H] x n[W], else n[T] x box_h x box_w
                       // (rows of the box past n hold no cell)
};

template <typename IndexT>
struct FmpBwdParams {
  FmpBwdAxis<IndexT> axis[3];
  IntDivider<IndexT> in_w, in_h;
  IntDivider<IndexT> tiles;         // per plane
  IntDivider<IndexT> box_w, box_h;  // box extents along W and H (the widest over the tiles; cells are
                                    // staged at their place in a box this size)
  int64_t in_plane, out_plane, blocks;
  int acc_bytes, cell_bytes, mask_bytes;  // shared memory: acc_t per element; acc_t + uint16 per box cell and
                                          // two lists (overlapping windows); the fields
  int box_cells;                    // most cells in a tile's box
  int dx_shift;                     // dx's offset from 16-byte alignment, in elements
  FmpTile<IndexT> table[kTileTable];  // with at most kTileTable tiles per plane: each tile's geometry
                                      // (fmp_tile_geometry; plane and shift unset)
};

// A block's tile: its geometry from the table, or computed by every thread of the
// block (fast divisions only, a small share of the kernel's instructions).
template <typename scalar_t, typename IndexT, bool WholeRows>
__device__ __forceinline__ FmpTile<IndexT> fmp_tile(const FmpBwdParams<IndexT>& p, IndexT block) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  FmpTile<IndexT> t;
  const auto pt = p.tiles.divmod(block);
  if (p.tiles.divisor <= IndexT(kTileTable)) {
    t = p.table[pt.mod];
  } else {
    IndexT rest = pt.mod, x0[3], x1[3];
#pragma unroll
    for (int a = 2; a >= 0; --a) {
      const auto& ax = p.axis[a];
      const auto ic = ax.count.divmod(rest);
      rest = ic.div;
      x0[a] = ic.mod * ax.tile;
      x1[a] = x0[a] + ax.tile < ax.in ? x0[a] + ax.tile : ax.in;
      t.c0[a] = ax.first(x0[a]);
      const IndexT c1 = ax.last(x1[a] - 1);
      t.n[a] = c1 >= t.c0[a] ? c1 - t.c0[a] + 1 : 0;
    }
    t.g0 = (x0[0] * p.axis[1].in + x0[1]) * p.axis[2].in + x0[2];
    t.len = static_cast<int>((x1[0] - x0[0]) * (x1[1] - x0[1]) * (x1[2] - x0[2]));
    t.o0 = (t.c0[0] * p.axis[1].out + t.c0[1]) * p.axis[2].out + t.c0[2];
    t.ncells = WholeRows ? t.n[0] * t.n[1] * t.n[2] : t.n[0] * p.box_h.divisor * p.box_w.divisor;
  }
  t.plane = pt.div;
  // (dx + plane * in_plane + g0) in elements, modulo kVec (a power of 2: low bits only).
  t.shift = static_cast<int>((uint32_t(p.dx_shift) + uint32_t(t.plane) * uint32_t(p.in_plane) + uint32_t(t.g0)) &
                             uint32_t(kVec - 1));
  return t;
}

// Box place q of a tile as (t, h, w) offsets from the box's first cell c0 (2d: t =
// 0); false where the place holds no cell of this tile (past n along H or W).
template <int Dims, typename IndexT>
__device__ __forceinline__ bool fmp_box_cell(const FmpBwdParams<IndexT>& p, const FmpTile<IndexT>& t, IndexT q,
                                             IndexT (&place)[3]) {
  const auto wq = p.box_w.divmod(q);
  place[0] = 0;
  place[1] = wq.div;
  place[2] = wq.mod;
  if constexpr (Dims == 3) {
    const auto hq = p.box_h.divmod(wq.div);
    place[0] = hq.div;
    place[1] = hq.mod;
  }
  return place[1] < t.n[1] && place[2] < t.n[2];
}

// The plane-relative cell o at box place q < t.ncells; false where the place holds no cell.
template <int Dims, bool WholeRows, typename IndexT>
__device__ __forceinline__ bool fmp_box_cell_index(const FmpBwdParams<IndexT>& p, const FmpTile<IndexT>& t, IndexT q,
                                                   IndexT& o) {
  if constexpr (WholeRows) {
    o = t.o0 + q;
    return true;
  }
  IndexT place[3];
  if (!fmp_box_cell<Dims>(p, t, q, place)) return false;
  o = t.o0 + (place[0] * p.axis[1].out + place[1]) * p.axis[2].out + place[2];
  return true;
}

// Plane element e as (t, h, w) input coordinates (2d: t = 0).
template <int Dims, typename IndexT>
__device__ __forceinline__ void fmp_element(const FmpBwdParams<IndexT>& p, IndexT e, IndexT (&x)[3]) {
  const auto we = p.in_w.divmod(e);
  x[2] = we.mod;
  if constexpr (Dims == 3) {
    const auto he = p.in_h.divmod(we.div);
    x[0] = he.div;
    x[1] = he.mod;
  } else {
    x[0] = 0;
    x[1] = we.div;
  }
}

// Whether plane element e lies in the reach of the cell at box place q on every axis.
template <int Dims, typename IndexT>
__device__ __forceinline__ bool fmp_in_reach(const FmpBwdParams<IndexT>& p, const FmpTile<IndexT>& t, IndexT q,
                                             IndexT e) {
  IndexT place[3], x[3];
  fmp_box_cell<Dims>(p, t, q, place);
  fmp_element<Dims>(p, e, x);
  bool in = true;
#pragma unroll
  for (int a = 3 - Dims; a < 3; ++a) {
    in = in && IndexT(x[a] + 1 - p.axis[a].f(t.c0[a] + place[a])) <= p.axis[a].k + 1;  // wraps below f - 1
  }
  return in;
}

// tile_counts: tile element `slot` summed from 0 over the staged cells that target
// it, in increasing o (its candidates: first(x)..last(x, margin) per axis, all in the
// box: with margin 0 the cells whose window can hold x unless float rounding moved
// it, with margin 1 those whose reach can), and how many did (the scan ends after the
// row of candidates that completes `count`; none when an axis has no candidate).
template <typename acc_t>
struct FmpOrderedSum {
  acc_t sum;
  uint32_t matched;
};

template <int Dims, typename IndexT, typename acc_t>
__device__ FmpOrderedSum<acc_t> fmp_ordered_sum(const FmpBwdParams<IndexT>& p, const FmpTile<IndexT>& t,
                                                const acc_t* dys, const uint16_t* targets, uint32_t slot,
                                                uint32_t count, IndexT margin) {
  FmpOrderedSum<acc_t> r{acc_t(0), 0};
  IndexT x[3], lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // 2d: one T place
  fmp_element<Dims>(p, IndexT(slot) + t.g0, x);
#pragma unroll
  for (int a = 3 - Dims; a < 3; ++a) {  // box places; first(x) >= c0 within the tile
    const IndexT first = p.axis[a].first(x[a]), last = p.axis[a].last(x[a], margin);
    if (last < first) return r;  // (windows farther apart than k + 1 along this axis)
    lo[a] = first - t.c0[a];
    hi[a] = last - t.c0[a];
  }
  const IndexT run = hi[2] - lo[2] + 1;  // candidates of a row
  const auto visit = [&](const uint16_t* tq, const acc_t* dq) {
    if (*tq == slot) {
      r.sum += *dq;
      ++r.matched;
    }
  };
  for (IndexT pt = lo[0]; pt <= hi[0]; ++pt) {
    for (IndexT ph = lo[1]; ph <= hi[1]; ++ph) {
      const IndexT first = (pt * p.box_h.divisor + ph) * p.box_w.divisor + lo[2];
      // The row's first kRowRun candidates with every load issued before the first
      // compare (places past the row: its last candidate again, not counted); one that
      // does not match adds +0, which leaves the sum's bits (the sum starts at +0, so it
      // is never -0). Any more candidates one by one.
      uint16_t tq[kRowRun];
      acc_t dq[kRowRun];
#pragma unroll
      for (int n = 0; n < kRowRun; ++n) {
        const IndexT at = first + (IndexT(n) < run ? IndexT(n) : run - 1);
        tq[n] = targets[at];
        dq[n] = dys[at];
      }
#pragma unroll
      for (int n = 0; n < kRowRun; ++n) {
        const bool hit = IndexT(n) < run && tq[n] == slot;
        r.sum += hit ? dq[n] : acc_t(0);
        r.matched += hit ? 1u : 0u;
      }
      for (IndexT n = kRowRun; n < run; ++n) visit(targets + first + n, dys + first + n);
      if (r.matched == count) return r;
    }
  }
  return r;
}

// One plane's dx by the ordered scan, the block's threads taking elements in turn:
// dx[e] = sum over o in increasing order of dy[o] with idx[o] == e (an index outside
// the plane adds nothing).
template <typename scalar_t, typename acc_t>
__device__ void fmp_scan_plane(const scalar_t* dyp, const int64_t* ip, scalar_t* dxp, int64_t in_plane,
                               int64_t out_plane) {
  for (int64_t e = threadIdx.x; e < in_plane; e += blockDim.x) {
    acc_t acc = 0;
    for (int64_t o = 0; o < out_plane; ++o) {
      if (ip[o] == e) acc += static_cast<acc_t>(dyp[o]);
    }
    dxp[e] = static_cast<scalar_t>(acc);
  }
}

template <typename scalar_t, typename acc_t, typename IndexT, int Dims, bool Disjoint, bool WholeRows>
__global__ void __launch_bounds__(kBwdThreads, fmp_bwd_blocks_per_sm(Dims, sizeof(IndexT) == 4))
    fmp_backward_tile_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                             scalar_t* __restrict__ dx, int32_t* __restrict__ strays, FmpBwdParams<IndexT> p) {
  cuda::start_next_grid();  // fmp_stray_fixup_kernel, when launched, may take free slots now
  extern __shared__ __align__(16) unsigned char fmp_smem[];
  __shared__ int later_count;                      // tile_stores: contributions to elements already stored,
  __shared__ uint32_t later_slot[kLaterCap];       // kept for after the barrier
  __shared__ acc_t later_grad[kLaterCap];
  __shared__ uint32_t list_counts;                 // tile_counts: elements listed, crowded (low 16 bits) and
                                                   // paired (high 16 bits)
  using store_t = std::conditional_t<Disjoint, scalar_t, acc_t>;  // the accumulator's elements
  store_t* const acc = reinterpret_cast<store_t*>(fmp_smem);        // per element (+ alignment slack)
  acc_t* const dys = reinterpret_cast<acc_t*>(fmp_smem + p.acc_bytes);        // tile_counts: per box cell
  uint16_t* const targets = reinterpret_cast<uint16_t*>(dys + p.box_cells);   // tile_counts: per box cell
  uint16_t* const crowded = targets + p.box_cells;  // tile_counts: elements of 3+
  uint16_t* const paired = crowded + p.box_cells / 3 + 1;  // tile_counts: the places of second contributions
  uint32_t* const fields = reinterpret_cast<uint32_t*>(fmp_smem + p.acc_bytes + p.cell_bytes);
  constexpr int kVec = 16 / sizeof(scalar_t);
  constexpr int kAccVec = 16 / sizeof(store_t);
  constexpr IndexT kChunk = IndexT(kBwdThreads) * kCellsPerThread;
  constexpr int kFieldLog2 = Disjoint ? 0 : 4;  // a field per element: 1 "seen" bit, or a 16-bit count
  auto zero = [&](unsigned char* from, int bytes) {
    for (int i = threadIdx.x; i < bytes / 16; i += kBwdThreads) reinterpret_cast<uint4*>(from)[i] = make_uint4(0, 0, 0, 0);
  };

  for (int64_t block = blockIdx.x; block < p.blocks; block += gridDim.x) {
    const FmpTile<IndexT> t = fmp_tile<scalar_t, IndexT, WholeRows>(p, static_cast<IndexT>(block));
    if (threadIdx.x == 0) later_count = list_counts = 0;
    zero(fmp_smem, p.acc_bytes);
    zero(reinterpret_cast<unsigned char*>(fields), p.mask_bytes);
    __syncthreads();  // accumulator and fields zeroed
    scalar_t* const dxt = dx + int64_t(t.plane) * p.in_plane + t.g0;
    store_t* const acct = acc + t.shift;  // acct[i] accumulates dxt[i]; acct + i is 16-byte aligned where dxt + i is
    const scalar_t* const dyp = dy + int64_t(t.plane) * p.out_plane;
    const int64_t* const ip = idx + int64_t(t.plane) * p.out_plane;
    bool stray = false;
    for (IndexT first = 0; first < t.ncells; first += kChunk) {
      int64_t target[kCellsPerThread];
      scalar_t grad[kCellsPerThread];
      uint32_t listed = 0;  // tile_counts: bit j, the thread's cell j is its element's third contribution
      uint32_t second = 0;  // tile_counts: bit j, the thread's cell j is its element's second contribution
      // Coalesced loads of the chunk (whole rows: one base, constant offsets).
      const int64_t* const ipc = ip + (WholeRows ? int64_t(t.o0) + first + threadIdx.x : 0);
      const scalar_t* const dyc = dyp + (WholeRows ? int64_t(t.o0) + first + threadIdx.x : 0);
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j) {
        const IndexT q = first + IndexT(j * kBwdThreads + threadIdx.x);
        target[j] = 0;
        grad[j] = scalar_t(0);
        IndexT o;
        if (WholeRows && q < t.ncells) {
          target[j] = ipc[j * kBwdThreads];
          grad[j] = dyc[j * kBwdThreads];
        } else if (!WholeRows && q < t.ncells && fmp_box_cell_index<Dims, WholeRows>(p, t, q, o)) {
          target[j] = ip[o];
          grad[j] = dyp[o];
        }
      }
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j) {
        const IndexT q = first + IndexT(j * kBwdThreads + threadIdx.x);
        if (q >= t.ncells) break;
        IndexT o;
        const bool held = fmp_box_cell_index<Dims, WholeRows>(p, t, q, o);  // the place again (cheaper than holding it)
        const int64_t e = target[j];
        const IndexT slot = static_cast<IndexT>(e) - t.g0;  // wraps below the tile
        const bool in_plane = static_cast<uint64_t>(e) < static_cast<uint64_t>(p.in_plane);
        if (!held || !in_plane || slot >= IndexT(t.len)) {
          // Not the tile's: a stray unless the tile that holds its index loads it.
          if (held) stray = stray || !in_plane || !fmp_in_reach<Dims>(p, t, q, static_cast<IndexT>(e));
          if constexpr (!Disjoint) targets[q] = kNoTarget;
          continue;
        }
        uint32_t* const word = fields + ((uint32_t(slot) << kFieldLog2) >> 5);
        const int at = (uint32_t(slot) << kFieldLog2) & 31;
        if constexpr (Disjoint) {
          if (atomicOr(word, 1u << at) & (1u << at)) {  // a later contribution
            const int n = atomicAdd(&later_count, 1);
            if (n < kLaterCap) {
              later_slot[n] = uint32_t(slot);
              later_grad[n] = static_cast<acc_t>(grad[j]);
            }
          } else {
            acct[slot] = static_cast<store_t>(acc_t(0) + static_cast<acc_t>(grad[j]));  // 0 + (-0) = +0
          }
        } else {
          const uint32_t rank = (atomicAdd(word, 1u << at) >> at) & 0xffffu;
          if (rank == 0) acct[slot] = acc_t(0) + static_cast<acc_t>(grad[j]);  // 0 + (-0) = +0
          second |= rank == 1 ? 1u << j : 0u;  // added after the barrier if it is the last
          listed |= rank == 2 ? 1u << j : 0u;  // the element is summed again after the barrier
          dys[q] = static_cast<acc_t>(grad[j]);
          targets[q] = static_cast<uint16_t>(slot);
        }
      }
      // The listed elements and second contributions, one shared atomic a thread and
      // chunk for both lists (per cell, the compiler's warp aggregation cost about 17
      // instructions a warp and cell). Neither count reaches 2^16: a box holds fewer
      // cells, and each listed element takes two or three.
      if (!Disjoint && (listed | second) != 0) {
        const uint32_t at = atomicAdd(&list_counts, __popc(listed) | (__popc(second) << 16));
        const auto place = [&](uint32_t bits) {  // of the thread's cell j = the lowest bit set
          return first + IndexT((__ffs(bits) - 1) * kBwdThreads + threadIdx.x);
        };
        uint16_t* to = crowded + (at & 0xffffu);
        // Over the set bits (an unrolled loop over j costs more instructions).
        for (uint32_t bits = listed; bits != 0; bits &= bits - 1) *to++ = targets[place(bits)];
        to = paired + (at >> 16);
        for (uint32_t bits = second; bits != 0; bits &= bits - 1) *to++ = static_cast<uint16_t>(place(bits));
      }
    }
    int any_stray = 0;
    if constexpr (Disjoint) {
      any_stray = __syncthreads_or(stray);  // first contributions stored, later ones listed
      // Later contributions: with two per element the sum does not depend on the
      // order; an element with three, or more than kLaterCap of them, takes the scan.
      const int later = later_count;
      if (later > 0) {
        if (threadIdx.x == 0) {
          bool scan = later > kLaterCap;
          for (int i = 0; i < later && !scan; ++i) {
            for (int j = 0; j < i; ++j) scan = scan || later_slot[j] == later_slot[i];
          }
          any_stray = any_stray || scan;
          for (int i = 0; i < later && !scan; ++i) {
            acct[later_slot[i]] = static_cast<store_t>(static_cast<acc_t>(acct[later_slot[i]]) + later_grad[i]);
          }
        }
        any_stray = __syncthreads_or(any_stray);  // thread 0's verdict, for every thread
      }
    } else {
      __syncthreads();  // counts complete, cells staged, first contributions stored, elements listed
      const auto count_of = [&](uint32_t slot) { return (fields[slot >> 1] >> ((slot & 1) * 16)) & 0xffffu; };
      const uint32_t lists = list_counts;
      // An element of two contributions: the second adds (either order gives the same sum).
      for (uint32_t i = threadIdx.x; i < (lists >> 16); i += kBwdThreads) {
        const uint32_t q = paired[i];
        const uint32_t slot = targets[q];
        if (count_of(slot) == 2) acct[slot] += dys[q];
      }
      // Three or more (listed, so that the warps sum them together): again, in order.
      for (uint32_t i = threadIdx.x; i < (lists & 0xffffu); i += kBwdThreads) {
        const uint32_t slot = crowded[i];
        const uint32_t count = count_of(slot);
        // The candidates of unmoved windows (3 x 3 at the benchmark's 3 x 3 windows, where
        // reach holds 4 x 4); those of the reach if a window moved.
        FmpOrderedSum<acc_t> s = fmp_ordered_sum<Dims>(p, t, dys, targets, slot, count, IndexT(0));
        if (s.matched != count) s = fmp_ordered_sum<Dims>(p, t, dys, targets, slot, count, IndexT(1));
        acct[slot] = s.sum;
        stray = stray || s.matched != count;
      }
      any_stray = __syncthreads_or(stray);  // sums complete
    }
    if (threadIdx.x == 0) strays[block] = any_stray ? 1 : 0;
    if (any_stray && p.tiles.divisor == 1) {
      // The block holds the whole plane: it scans the plane itself (no fixup kernel).
      fmp_scan_plane<scalar_t, acc_t>(dyp, ip, dxt, p.in_plane, p.out_plane);
    } else {
      const int head = std::min(t.len, (kVec - t.shift) % kVec);
      const int nvec = (t.len - head) / kVec;
      for (int i = threadIdx.x; i < head; i += kBwdThreads) dxt[i] = static_cast<scalar_t>(acct[i]);
      for (int v = threadIdx.x; v < nvec; v += kBwdThreads) {
        const int i = head + v * kVec;
        cuda::Vec<scalar_t, kVec> out;
#pragma unroll
        for (int s = 0; s < kVec; s += kAccVec) {
          const auto a = cuda::load_vec<store_t, kAccVec>(acct + i + s);
#pragma unroll
          for (int u = 0; u < kAccVec; ++u) out.v[s + u] = static_cast<scalar_t>(a.v[u]);
        }
        if constexpr (Dims == 3) {  // streaming stores pay in 3d only
          cuda::store_vec_streaming<scalar_t, kVec>(dxt + i, out);
        } else {
          cuda::store_vec<scalar_t, kVec>(dxt + i, out);
        }
      }
      for (int i = head + nvec * kVec + threadIdx.x; i < t.len; i += kBwdThreads) {
        dxt[i] = static_cast<scalar_t>(acct[i]);
      }
    }
    __syncthreads();  // shared memory and the tile are reused by the next block of the loop
  }
}

// Backward, owned boxes: disjoint windows whose stride is an integer. When alpha =
// (in - k) / (out - 1) is an integer a >= k on every axis, f(c) = c * a exactly, and
// the BOXES [c * a, (c + 1) * a) per axis (the last cell's ending at in; an axis of one
// cell: all of it) partition the plane. The forward's window of cell c starts at f(c),
// so its index lies in its box, where no other cell's can:
//   dx[e] = 0 + dy[o] at e = idx[o], 0 at the other elements of o's box.
// A block takes a range of cells of one plane (a multiple of 2 cells); a thread takes
// kBoxCells of them in units of Cells W-adjacent cells (units j, j + kThreads, ...:
// coalesced dy and idx loads, and stores along W that meet the next thread's) and
// writes their boxes whole: every element once, no shared memory, no atomics. Cells > 0:
// the boxes are 2 wide along W (fmp_backward_config) and a unit's box row, 2 * Cells
// elements, is one vector store (Cells = 2 needs an even out along W and dx aligned to
// 4 elements). Cells = 0: dx not aligned to 2 elements, rows stored
// element by element.
// Float rounding can move a start by one (c + u rounds up to c + 1 when u is within
// half an ulp of 1), sending an index to the first element of the next box, or the
// last of the previous one. Such a cell is a MOVER: its index lies outside its box but
// among its POSITIONS [c * a - 1, c * a + max(k, a - 1)] (its reach, see
// fmp_backward_tile_kernel, and its box) on every axis. Its block's flag gets bit 2,
// and fmp_stray_fixup_kernel recomputes the element it names from every cell whose
// positions hold it, in increasing o. Any other index outside the box is a stray (flag
// bit 1: the plane's full scan).
struct FmpBoxAxis {
  int64_t in, out, k, stride;
  __host__ __device__ int64_t reach_hi() const { return k > stride - 1 ? k : stride - 1; }
  // Cell c's box holds x.
  __device__ bool boxes(int64_t c, int64_t x) const {
    return out == 1 ? (x >= 0 && x < in) : (x >= c * stride && x < (c + 1 == out ? in : (c + 1) * stride));
  }
  // Cell c's positions hold x.
  __device__ bool holds(int64_t c, int64_t x) const {
    return out == 1 ? (x >= 0 && x < in) : (x >= c * stride - 1 && x <= c * stride + reach_hi());
  }
  // The cells whose positions hold x (0 <= x < in): [first, last].
  __device__ int64_t first(int64_t x) const {
    const int64_t m = x - reach_hi();
    return out == 1 || m <= 0 ? 0 : (m + stride - 1) / stride;
  }
  __device__ int64_t last(int64_t x) const { return out == 1 ? 0 : std::min(out - 1, (x + 1) / stride); }
};

struct FmpBoxAxes {
  FmpBoxAxis axis[3];
  // Plane element e as (t, h, w) (0 <= e < in_plane).
  __device__ void element(int64_t e, int64_t (&x)[3]) const {
    x[2] = e % axis[2].in;
    x[1] = e / axis[2].in % axis[1].in;
    x[0] = e / axis[2].in / axis[1].in;
  }
  // Where the index e of cell (t, h, w) = c lies: 0 in its box, else flag bit 2 (a
  // mover) or 1 (a stray).
  __device__ int classify(const int64_t (&c)[3], int64_t e) const {
    if (e < 0 || e >= axis[0].in * axis[1].in * axis[2].in) return 1;
    int64_t x[3];
    element(e, x);
    bool boxed = true, mover = true;
    for (int a = 0; a < 3; ++a) {
      boxed = boxed && axis[a].boxes(c[a], x[a]);
      mover = mover && axis[a].holds(c[a], x[a]);
    }
    return boxed ? 0 : mover ? 2 : 1;
  }
  // dx at plane element e: the cells whose positions hold it, in increasing o.
  template <typename scalar_t, typename acc_t>
  __device__ acc_t gather(const scalar_t* dyp, const int64_t* ip, int64_t e) const {
    int64_t x[3];
    element(e, x);
    acc_t sum = 0;
    for (int64_t t = axis[0].first(x[0]); t <= axis[0].last(x[0]); ++t) {
      for (int64_t h = axis[1].first(x[1]); h <= axis[1].last(x[1]); ++h) {
        for (int64_t w = axis[2].first(x[2]); w <= axis[2].last(x[2]); ++w) {
          const int64_t o = (t * axis[1].out + h) * axis[2].out + w;
          if (ip[o] == e) sum += static_cast<acc_t>(dyp[o]);
        }
      }
    }
    return sum;
  }
};

template <typename IndexT>
struct FmpBoxParams {
  FmpBoxAxes g;
  IntDivider<IndexT> out_w, out_h;
  IntDivider<IndexT> blocks_per_plane;
  IndexT block_units, plane_units, out_plane;  // units: Cells W-adjacent cells (fmp_backward_boxes_kernel)
  int64_t in_plane;
};

template <typename scalar_t, typename acc_t, typename IndexT, int Dims, int Cells>
__global__ void __launch_bounds__(kThreads)
    fmp_backward_boxes_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                              scalar_t* __restrict__ dx, int32_t* __restrict__ strays, FmpBoxParams<IndexT> p) {
  cuda::start_next_grid();  // fmp_stray_fixup_kernel may take free slots now
  constexpr int kUnitCells = Cells == 0 ? 1 : Cells;  // cells of a unit: W-adjacent, one box row vector
  constexpr int kUnits = kBoxCells / kUnitCells;       // units of a thread
  const auto pb = p.blocks_per_plane.divmod(static_cast<IndexT>(blockIdx.x));
  const IndexT first = pb.mod * p.block_units;
  const IndexT end = first + p.block_units < p.plane_units ? first + p.block_units : p.plane_units;
  const scalar_t* const dyp = dy + int64_t(pb.div) * p.out_plane;
  const int64_t* const ip = idx + int64_t(pb.div) * p.out_plane;
  scalar_t* const dxp = dx + int64_t(pb.div) * p.in_plane;
  const auto& ax = p.g.axis;
  int64_t target[kUnits][kUnitCells];
  scalar_t grad[kUnits][kUnitCells];
#pragma unroll
  for (int j = 0; j < kUnits; ++j) {
    const IndexT u = first + IndexT(j * kThreads + threadIdx.x);
#pragma unroll
    for (int c = 0; c < kUnitCells; ++c) {
      target[j][c] = -1;
      grad[j][c] = scalar_t(0);
      if (u < end) {
        target[j][c] = ip[u * kUnitCells + c];
        grad[j][c] = dyp[u * kUnitCells + c];
      }
    }
  }
  int flags = 0;
#pragma unroll
  for (int j = 0; j < kUnits; ++j) {
    const IndexT u = first + IndexT(j * kThreads + threadIdx.x);
    if (u >= end) continue;
    IndexT c[3];  // the unit's first cell
    const auto wo = p.out_w.divmod(u * kUnitCells);
    c[2] = wo.mod;
    c[1] = wo.div;
    c[0] = 0;
    if constexpr (Dims == 3) {
      const auto ho = p.out_h.divmod(wo.div);
      c[0] = ho.div;
      c[1] = ho.mod;
    }
    IndexT x0[3], ext[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      x0[a] = c[a] * IndexT(ax[a].stride);
      ext[a] = c[a] + 1 == IndexT(ax[a].out) ? IndexT(ax[a].in) - x0[a] : IndexT(ax[a].stride);
    }
    scalar_t value[kUnitCells];
    bool hit[kUnitCells];
#pragma unroll
    for (int i = 0; i < kUnitCells; ++i) {
      value[i] = static_cast<scalar_t>(acc_t(0) + static_cast<acc_t>(grad[j][i]));  // 0 + (-0) = +0
      hit[i] = false;
    }
    for (IndexT dt = 0; dt < ext[0]; ++dt) {
      for (IndexT dh = 0; dh < ext[1]; ++dh) {
        const IndexT row = ((x0[0] + dt) * IndexT(ax[1].in) + x0[1] + dh) * IndexT(ax[2].in) + x0[2];
        if constexpr (Cells > 0) {
          cuda::Vec<scalar_t, 2 * Cells> out;
#pragma unroll
          for (int w = 0; w < 2 * Cells; ++w) {
            const bool at = int64_t(row + w) == target[j][w / 2];
            hit[w / 2] = hit[w / 2] || at;
            out.v[w] = at ? value[w / 2] : scalar_t(0);
          }
          cuda::store_vec_streaming<scalar_t, 2 * Cells>(dxp + row, out);
        } else {
          for (IndexT w = 0; w < ext[2]; ++w) {
            const bool at = int64_t(row + w) == target[j][0];
            hit[0] = hit[0] || at;
            cuda::store_streaming(dxp + row + w, at ? value[0] : scalar_t(0));
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kUnitCells; ++i) {
      if (!hit[i]) flags |= p.g.classify({int64_t(c[0]), int64_t(c[1]), int64_t(c[2]) + i}, target[j][i]);
    }
  }
  const int stray = __syncthreads_or(flags & 1);
  const int mover = __syncthreads_or(flags & 2);
  if (threadIdx.x == 0) strays[blockIdx.x] = (stray ? 1 : 0) | (mover ? 2 : 0);
}

// Per plane: if any of its blocks saw a stray (flag bit 1), the plane is recomputed by
// a full ordered scan, dx[e] = sum over o in increasing order with idx[o] == e; else
// if any saw a mover (bit 2, owned boxes only), the element of each mover's index is
// recomputed from the cells whose positions hold it (FmpBoxAxes::gather; two movers
// naming one element write the same sum). A block takes `group` (<= 32) planes at a
// time: lane j of its first warp reads the flags of plane (first + j), then the block
// recomputes the flagged ones in turn. The launcher sizes groups so that about 8 blocks
// per SM share the planes: few blocks read the flags when none is set, and many share
// the scans when many are. Launched early: it waits for the backward kernel to end.

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    fmp_stray_fixup_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                           scalar_t* __restrict__ dx, const int32_t* __restrict__ strays, int64_t planes,
                           int64_t tiles, int64_t in_plane, int64_t out_plane, int group, FmpBoxAxes boxes) {
  cuda::wait_for_previous_grid();
  __shared__ uint32_t scan, movers;  // bit j: plane first + j needs the scan / its movers' elements
  for (int64_t first = int64_t(blockIdx.x) * group; first < planes; first += int64_t(gridDim.x) * group) {
    if (threadIdx.x < 32) {
      const int64_t plane = first + threadIdx.x;
      int32_t any = 0;
      for (int64_t j = 0; int(threadIdx.x) < group && plane < planes && j < tiles; ++j) {
        any |= strays[plane * tiles + j];
      }
      const uint32_t scan_bits = __ballot_sync(0xffffffffu, (any & 1) != 0);
      const uint32_t mover_bits = __ballot_sync(0xffffffffu, any == 2);
      if (threadIdx.x == 0) {
        scan = scan_bits;
        movers = mover_bits;
      }
    }
    __syncthreads();
    for (uint32_t bits = scan; bits != 0; bits &= bits - 1) {
      const int64_t plane = first + __ffs(bits) - 1;
      fmp_scan_plane<scalar_t, acc_t>(dy + plane * out_plane, idx + plane * out_plane, dx + plane * in_plane,
                                      in_plane, out_plane);
    }
    for (uint32_t bits = movers; bits != 0; bits &= bits - 1) {
      const int64_t plane = first + __ffs(bits) - 1;
      const scalar_t* dyp = dy + plane * out_plane;
      const int64_t* ip = idx + plane * out_plane;
      const auto& ax = boxes.axis;
      for (int64_t o = threadIdx.x; o < out_plane; o += kThreads) {
        const int64_t c[3] = {o / ax[2].out / ax[1].out, o / ax[2].out % ax[1].out, o % ax[2].out};
        const int64_t e = ip[o];
        if (boxes.classify(c, e) != 0) {
          dx[plane * in_plane + e] = static_cast<scalar_t>(boxes.gather<scalar_t, acc_t>(dyp, ip, e));
        }
      }
    }
    __syncthreads();  // the flags are rewritten for the next planes
  }
}

FmpBoxAxes fmp_box_axes(const FmpGeometry& g, const FmpBackwardConfig& c) {
  FmpBoxAxes b;
  for (int a = 0; a < 3; ++a) b.axis[a] = {g.in[a], g.out[a], g.k[a], c.stride[a]};
  return b;
}

template <typename scalar_t, typename IndexT, int Dims>
void launch_fmp_backward_boxes(const FmpGeometry& g, const FmpBackwardConfig& c, const at::Tensor& dy,
                               const at::Tensor& idx, const at::Tensor& dx, int32_t* strays) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpBoxParams<IndexT> p;
  p.g = fmp_box_axes(g, c);
  p.out_w = IntDivider<IndexT>(static_cast<IndexT>(g.out[2]));
  p.out_h = IntDivider<IndexT>(static_cast<IndexT>(g.out[1]));
  p.blocks_per_plane = IntDivider<IndexT>(static_cast<IndexT>(c.tiles));
  p.out_plane = static_cast<IndexT>(g.out_plane());
  p.in_plane = g.in_plane();
  // Box rows stored as vectors: the boxes are 2 wide along W (in = 2 out there, so every
  // row starts at an even element); two cells a row when out along W is even (block
  // ranges hold even counts of cells); dx aligned to the vectors.
  const void* dxp = dx.const_data_ptr();
  int cells = cuda::is_aligned(dxp, 2 * sizeof(scalar_t)) ? 1 : 0;
  constexpr int kTwo = sizeof(scalar_t) <= 4 ? 2 : 1;  // 16-byte vectors at most
  if (cells == 1 && kTwo == 2 && g.out[2] % 2 == 0 && cuda::is_aligned(dxp, 4 * sizeof(scalar_t))) cells = 2;
  const int64_t unit = std::max(cells, 1);
  p.block_units = static_cast<IndexT>(c.block_cells / unit);
  p.plane_units = static_cast<IndexT>(g.out_plane() / unit);
  auto kernel = cells == 2 ? fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, kTwo>
                : cells == 1 ? fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, 1>
                             : fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, 0>;
  kernel<<<static_cast<unsigned>(c.blocks), c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), strays, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Tile `tile` of a plane as fmp_tile computes it on the device (fmp_reach_cells is
// first(x0)..last(x1 - 1) per axis); plane and shift unset.
template <typename IndexT>
FmpTile<IndexT> fmp_tile_geometry(const FmpGeometry& g, const FmpBackwardConfig& c, int64_t tile) {
  FmpTile<IndexT> t{};
  int64_t rest = tile, x0[3], x1[3], c0[3], n[3];
  for (int a = 2; a >= 0; --a) {
    x0[a] = rest % c.count[a] * c.tile[a];
    rest /= c.count[a];
    x1[a] = std::min(x0[a] + c.tile[a], g.in[a]);
    fmp_reach_cells(g.in[a], g.out[a], g.k[a], x0[a], x1[a] - 1, c0[a], n[a]);
    t.c0[a] = static_cast<IndexT>(c0[a]);
    t.n[a] = static_cast<IndexT>(n[a]);
  }
  t.g0 = static_cast<IndexT>((x0[0] * g.in[1] + x0[1]) * g.in[2] + x0[2]);
  t.len = static_cast<int>((x1[0] - x0[0]) * (x1[1] - x0[1]) * (x1[2] - x0[2]));
  t.o0 = static_cast<IndexT>((c0[0] * g.out[1] + c0[1]) * g.out[2] + c0[2]);
  t.ncells = static_cast<IndexT>(c.whole_rows ? n[0] * n[1] * n[2] : n[0] * c.box[1] * c.box[2]);
  return t;
}

template <typename scalar_t, typename IndexT, int Dims>
void launch_fmp_backward(const FmpGeometry& g, const FmpBackwardConfig& c, const at::Tensor& dy,
                         const at::Tensor& idx, const at::Tensor& dx, const at::Tensor& workspace) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpBwdParams<IndexT> p;
  for (int a = 0; a < 3; ++a) {
    auto& ax = p.axis[a];
    ax.in = static_cast<IndexT>(g.in[a]);
    ax.out = static_cast<IndexT>(g.out[a]);
    ax.k = static_cast<IndexT>(g.k[a]);
    ax.A = static_cast<IndexT>(g.in[a] - g.k[a]);
    ax.f_base = g.out[a] == 1 ? ax.A : IndexT(0);
    ax.B = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(g.out[a] - 1, 1)));
    ax.A_div = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(g.in[a] - g.k[a], 1)));
    ax.tile = static_cast<IndexT>(c.tile[a]);
    ax.count = IntDivider<IndexT>(static_cast<IndexT>(c.count[a]));
  }
  p.in_w = IntDivider<IndexT>(static_cast<IndexT>(g.in[2]));
  p.in_h = IntDivider<IndexT>(static_cast<IndexT>(g.in[1]));
  p.in_plane = g.in_plane();
  p.out_plane = g.out_plane();
  p.tiles = IntDivider<IndexT>(static_cast<IndexT>(c.tiles));
  p.box_w = IntDivider<IndexT>(static_cast<IndexT>(c.box[2]));
  p.box_h = IntDivider<IndexT>(static_cast<IndexT>(c.box[1]));
  p.blocks = g.planes() * c.tiles;
  p.acc_bytes = static_cast<int>(c.acc_bytes);
  p.cell_bytes = static_cast<int>(c.cell_bytes);
  p.box_cells = static_cast<int>(c.box_cells);
  p.mask_bytes = static_cast<int>(c.mask_bytes);
  p.dx_shift = static_cast<int>((reinterpret_cast<uintptr_t>(dx.const_data_ptr()) / sizeof(scalar_t)) %
                                (16 / sizeof(scalar_t)));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* strays = reinterpret_cast<int32_t*>(workspace.mutable_data_ptr());
  if (c.kind == FmpBackwardKernel::kOwnedBoxes) {
    launch_fmp_backward_boxes<scalar_t, IndexT, Dims>(g, c, dy, idx, dx, strays);
  } else {
    auto kernel = c.disjoint ? (c.whole_rows ? fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, true, true>
                                             : fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, true, false>)
                             : (c.whole_rows ? fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, false, true>
                                             : fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, false, false>);
    for (int64_t i = 0; i < std::min<int64_t>(c.tiles, kTileTable); ++i) {
      p.table[i] = fmp_tile_geometry<IndexT>(g, c, i);
    }
    const int smem = static_cast<int>(c.smem_bytes);
    const int64_t optin = cuda::device_facts().smem_per_block_optin;
    BARACUDA_CHECK_NOT_IMPLEMENTED(c.block_smem <= optin, fmp_op_name(g.dims, true), ": needs ", c.block_smem,
                                   " bytes of shared memory per block, the device allows ", optin);
    cuda::allow_dynamic_smem(kernel, smem);
    kernel<<<c.blocks, c.threads, smem, stream>>>(dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(),
                                                 dx.mutable_data_ptr<scalar_t>(), strays, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // A tile kernel whose blocks hold whole planes scans its planes itself.
  if (!c.fixup) return;
  cuda::launch(fmp_stray_fixup_kernel<scalar_t, acc_t>,
               {.grid = dim3(c.fixup_blocks), .block = dim3(kThreads), .early = true}, dy.const_data_ptr<scalar_t>(),
               idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), strays, g.planes(), c.tiles,
               g.in_plane(), g.out_plane(), c.fixup_group, fmp_box_axes(g, c));
}

template <int Dims>
void fmp_backward_out_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                           at::IntArrayRef output_size, const at::Tensor& indices, const at::Tensor& grad_input,
                           const at::Tensor& workspace) {
  const char* op = fmp_op_name(Dims, true);
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  check_fmp_grad_input(Dims, self, grad_input);
  check_no_overlap(op, {{"grad_input", grad_input}}, {{"grad_output", grad_output}, {"self", self}, {"indices", indices}});
  if (grad_input.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  cuda::check_device_arch(op);
  if (g.out_plane() == 0) {
    grad_input.zero_();
    return;
  }
  const auto c = fmp_backward_config(g, self.scalar_type(), cuda::device_facts());
  const int64_t need = c.workspace_bytes;
  check_workspace(op, workspace, need, 4, self.device(),
                  {{"grad_output", grad_output}, {"self", self}, {"indices", indices}, {"grad_input", grad_input}});
  const auto dy = grad_output.contiguous();
  const auto idx = indices.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_backward_cuda", [&] {
    c.index32 ? launch_fmp_backward<scalar_t, uint32_t, Dims>(g, c, dy, idx, grad_input, workspace)
              : launch_fmp_backward<scalar_t, uint64_t, Dims>(g, c, dy, idx, grad_input, workspace);
  });
}

template <int Dims>
at::Tensor fmp_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                             at::IntArrayRef output_size, const at::Tensor& indices) {
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  auto grad_input = at::empty(self.sizes(), self.options());
  const auto workspace =
      at::empty({fmp_backward_config(g, self.scalar_type(), cuda::device_facts()).workspace_bytes},
                self.options().dtype(at::kByte));
  fmp_backward_out_cuda<Dims>(grad_output, self, kernel_size, output_size, indices, grad_input, workspace);
  return grad_input;
}

// The Plan's variant: the launch config, described.
KernelChoice fmp_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = fmp_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

KernelChoice fmp_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = fmp_backward_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
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
