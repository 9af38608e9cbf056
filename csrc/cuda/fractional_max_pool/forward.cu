// fractional_max_pool family, CUDA: the forward (the first maximum of each window).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "baracuda/variant.h"
#include "common.cuh"

namespace baracuda {
namespace {

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

// The Plan's variant: the launch config, described.
KernelChoice fmp_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = fmp_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("fractional_max_pool2d", c10::DeviceType::CUDA, fmp_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d", c10::DeviceType::CUDA, fmp_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("fractional_max_pool2d", &baracuda::fmp_cuda<2>);
  m.impl("fractional_max_pool2d.out", &baracuda::fmp_out_cuda<2>);
  m.impl("fractional_max_pool3d", &baracuda::fmp_cuda<3>);
  m.impl("fractional_max_pool3d.out", &baracuda::fmp_out_cuda<3>);
}
