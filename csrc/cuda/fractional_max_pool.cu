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
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

constexpr int kThreads = 256;            // forward and stray-fixup blocks
constexpr int kBwdThreads = 256;         // backward tile blocks (512 measured slower)
constexpr int64_t kForwardWaves = 2;     // forward, overlapping windows: waves of resident blocks (1-3% faster than 1)
constexpr int kCellsPerThread = 8;       // backward: output cells a thread holds per chunk
constexpr int64_t kTileBytes = 64 * 1024;  // backward: acc_t accumulator of one tile (shared memory)

// ---------------------------------------------------------------------------
// Choice of kernel: a pure function of the problem, used by the launchers and
// by the Plan API (through the variant registry).

constexpr int64_t kInt31 = int64_t(1) << 31;

// Forward window elements when unrolled (k per axis, 0: not unrolled).
constexpr int fmp_window(int dims, int k) { return k == 0 ? 0 : (dims == 3 ? k * k * k : k * k); }

// Output cells per thread in the forward: enough window loads in flight to cover
// DRAM latency (the whole window of each cell is loaded before any compare).
constexpr int fmp_cells_per_thread(int window) { return window == 0 ? 1 : (window <= 8 ? 4 : 2); }

struct FmpChoice {
  bool index32;  // 32-bit index math (fast division) when every dividend stays below 2^31
  int k;         // forward: 2 or 3 when every pooled axis has that kernel size (windows unrolled); 0: loops
  bool table;    // forward: window starts tabulated per plane in shared memory (at most one per cell of a segment)
  bool disjoint; // forward: windows never overlap (k <= alpha on every axis): one block per work item
};

FmpChoice choose_fmp(const FmpGeometry& g) {
  bool fits = g.planes() * g.in_plane() < kInt31 && g.planes() * g.out_plane() < kInt31;
  // Backward reach and cell-range math multiplies (x + k + 3) * out-sized values.
  for (int a = 0; a < 3; ++a) fits = fits && (g.in[a] + g.k[a] + 3) * (g.out[a] + 1) < kInt31;
  int k = 0;
  for (int kk : {2, 3}) {
    bool all = true;
    for (int a = 3 - g.dims; a < 3; ++a) all = all && g.k[a] == kk;
    if (all) k = kk;
  }
  bool disjoint = true;  // alpha = (in - k) / (out - 1) >= k on every axis
  for (int a = 0; a < 3; ++a) disjoint = disjoint && (g.out[a] <= 1 || g.k[a] * (g.out[a] - 1) <= g.in[a] - g.k[a]);
  k = fits ? k : 0;  // unrolled windows only with 32-bit indices (64-bit problems take the loops)
  // A block computes its plane's whole start table: worth it while that is no more
  // starts than the cells of one work item (else each cell computes its own).
  const int64_t starts = (g.dims == 3 ? g.out[0] : 0) + g.out[1] + g.out[2];
  const bool table = starts <= int64_t(kThreads) * fmp_cells_per_thread(fmp_window(g.dims, k));
  return {fits, k, table, disjoint};
}

// Backward tiling (see the comment above fmp_backward_tile_kernel). A tile is a
// box of tile[T] x tile[H] x tile[W] input elements of one plane with at most
// kTileBytes / sizeof(acc_t) elements; only the outermost axes are split, so a
// tile is always one contiguous range of the plane. Rounds per axis:
// R = ceil((k + 2) * (out - 1) / (in - k)), at most out (1 when out == 1; 1 for
// disjoint windows, whose cells store once per element instead).
struct FmpBackwardChoice {
  bool index32 = true;
  int64_t tile[3] = {1, 1, 1};   // input extent of a tile per axis
  int64_t count[3] = {1, 1, 1};  // tiles per axis
  int64_t rounds[3] = {1, 1, 1};
  int64_t tiles = 1;             // tiles per plane
  bool disjoint = false;         // windows disjoint (k <= alpha on every axis): one store per element, no rounds
  int64_t acc_bytes = 0;         // (tile elements + one vector of slack) * sizeof(acc_t), 16-byte multiple
  int64_t smem_bytes = 0;        // acc_bytes + (disjoint) a "seen" bit per tile element, 16-byte multiple
};

FmpBackwardChoice choose_fmp_backward(const FmpGeometry& g, c10::ScalarType dtype) {
  FmpBackwardChoice c;
  c.index32 = choose_fmp(g).index32;
  const int64_t acc_size = dtype == at::kDouble ? 8 : 4;
  const int64_t vec = 16 / static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t budget = kTileBytes / acc_size;
  // Largest extent per axis, innermost axes whole first.
  int64_t inner = 1;
  for (int a = 2; a >= 0; --a) {
    const int64_t max_extent = std::max<int64_t>(1, budget / inner);
    c.count[a] = ceil_div<int64_t>(g.in[a], max_extent);
    c.tile[a] = ceil_div<int64_t>(g.in[a], c.count[a]);  // balanced tiles
    inner = c.count[a] == 1 ? inner * g.in[a] : budget + 1;  // a split axis leaves 1 for the outer ones
  }
  c.tiles = c.count[0] * c.count[1] * c.count[2];
  for (int a = 0; a < 3; ++a) {
    const int64_t A = g.in[a] - g.k[a], B = g.out[a] - 1;
    c.rounds[a] = B <= 0 ? 1 : std::min<int64_t>(g.out[a], ceil_div<int64_t>((g.k[a] + 2) * B, A));
  }
  c.disjoint = choose_fmp(g).disjoint;
  if (c.disjoint) c.rounds[0] = c.rounds[1] = c.rounds[2] = 1;
  const int64_t elems = c.tile[0] * c.tile[1] * c.tile[2];
  c.acc_bytes = ceil_div<int64_t>((elems + vec) * acc_size, 16) * 16;
  c.smem_bytes = c.acc_bytes + (c.disjoint ? ceil_div<int64_t>(elems, 128) * 16 : 0);
  return c;
}

// Stray flags, one int32 per backward block; none when nothing is launched.
int64_t fmp_backward_workspace_bytes(const FmpGeometry& g, const FmpBackwardChoice& c) {
  if (g.planes() == 0 || g.out_plane() == 0) return 0;
  return g.planes() * c.tiles * int64_t(sizeof(int32_t));
}

std::string fmp_variant(const FmpChoice& c, int dims) {
  const std::string k = c.k == 0 ? "any k" : "k=" + std::to_string(c.k);
  return std::string("window_max<") + (c.index32 ? "i32" : "i64") + "," + k + "," +
         (c.table ? "start table" : "inline starts") + "," +
         std::to_string(fmp_cells_per_thread(fmp_window(dims, c.k))) + " cells/thread," +
         (c.disjoint ? "block per segment" : "resident blocks") + ">";
}

std::string fmp_backward_variant(const FmpBackwardChoice& c) {
  return std::string(c.disjoint ? "tile_stores<" : "tile_rounds<") + (c.index32 ? "i32" : "i64") + ">+stray_fixup";
}

// ---------------------------------------------------------------------------
// Forward. For plane (n, c) and output cell (ot, oh, ow) of that plane:
//   start_a = fmp_start<acc_t>(sample[plane][slot_a], o_a, in_a, out_a, k_a)   (PyTorch's CUDA formula;
//             alpha per axis computed once on the host, the same IEEE division)
//   y   = first max over the window [start_a, start_a + k_a) of x[plane], in (t, h, w) order
//         (val > best || isnan(val), from -inf),
//   idx = (t * inH + h) * inW + w of that element (the window's first element if all are -inf).
// Work items are (plane, segment) pairs, a segment being kThreads * kCells consecutive
// cells of one plane. Each block walks a contiguous range of items: one item when the
// windows are disjoint (every input element is loaded once: the kernel streams, and
// many short blocks keep DRAM busiest), else as many as spread the items over
// kForwardWaves waves of resident blocks (overlapping windows hit L1 for most loads;
// the kernel is latency bound and a block's later items reuse its start table). Thread j takes cells j,
// j + kThreads, ... of the segment, so loads and stores coalesce. With a start table the block computes its plane's window starts
// (outT + outH + outW values) into shared memory when the plane changes, and a cell's
// window origin costs one division by a constant (two in 3d) and two or three shared
// loads; without one (huge axes) each cell evaluates the formula. With K > 0 (every
// pooled axis has k = K) every window element of the thread's kCells cells is loaded
// before the first compare, kCells * K^Dims loads in flight; cells past the plane's
// end load the last cell's window and store nothing. K == 0: any k, one cell per
// thread, scanned in loops. 64-bit indices are stored as PyTorch returns them.
// (Tried and slower: runs of consecutive cells per thread, whose loads span 4x the
// lines; one window visitor shared by the load and compare loops: see
// docs/PERFORMANCE.md.)

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

template <typename scalar_t, typename acc_t, typename IndexT, int Dims, int K>
__global__ void __launch_bounds__(kThreads)
    fmp_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ samples,
                       scalar_t* __restrict__ y, int64_t* __restrict__ idx, FmpForwardParams<IndexT, acc_t> p) {
  constexpr int KT = Dims == 3 ? K : 1;  // unrolled window extent along T (K > 0)
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
        for (IndexT o = threadIdx.x; o < p.out[a]; o += kThreads) {
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
        const IndexT q = std::min<IndexT>(q0 + IndexT(c * kThreads), p.out_plane - 1);
        origin[c] = fmp_window_origin<Dims, scalar_t, acc_t, IndexT>(p, table, u, q);
#pragma unroll
        for (int dt = 0; dt < KT; ++dt) {
#pragma unroll
          for (int dh = 0; dh < K; ++dh) {
#pragma unroll
            for (int dw = 0; dw < K; ++dw) {
              vals[c][(dt * K + dh) * K + dw] = xp[origin[c] + (IndexT(dt) * p.in[1] + dh) * p.in[2] + dw];
            }
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kCells; ++c) {
        const IndexT q = q0 + IndexT(c * kThreads);
        if (q >= p.out_plane) continue;
        acc_t best = -INFINITY;
        IndexT best_index = origin[c];
#pragma unroll
        for (int dt = 0; dt < KT; ++dt) {
#pragma unroll
          for (int dh = 0; dh < K; ++dh) {
#pragma unroll
            for (int dw = 0; dw < K; ++dw) {
              const acc_t v = static_cast<acc_t>(vals[c][(dt * K + dh) * K + dw]);
              if (v > best || v != v) {
                best = v;
                best_index = origin[c] + (IndexT(dt) * p.in[1] + dh) * p.in[2] + dw;
              }
            }
          }
        }
        yp[q] = static_cast<scalar_t>(best);
        ip[q] = static_cast<int64_t>(best_index);
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

template <typename scalar_t, typename IndexT, int Dims, int K>
void launch_fmp_forward(const FmpChoice& c, const FmpGeometry& g, const at::Tensor& x, const at::Tensor& samples,
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
  p.segment_cells = static_cast<IndexT>(kThreads * fmp_cells_per_thread(fmp_window(Dims, K)));
  p.segments = ceil_div<IndexT>(p.out_plane, p.segment_cells);
  p.items = g.planes() * int64_t(p.segments);
  p.table = c.table;
  const int64_t smem = c.table ? ((Dims == 3 ? g.out[0] : 0) + g.out[1] + g.out[2]) * int64_t(sizeof(IndexT)) : 0;
  auto kernel = fmp_forward_kernel<scalar_t, acc_t, IndexT, Dims, K>;
  const int64_t wanted =
      c.disjoint ? p.items : std::min(p.items, kForwardWaves * cuda::resident_groups(kernel, kThreads, 1, smem));
  p.items_per_block = ceil_div<int64_t>(p.items, std::min<int64_t>(wanted, std::numeric_limits<int32_t>::max()));
  const int64_t blocks = ceil_div<int64_t>(p.items, p.items_per_block);
  kernel<<<blocks, kThreads, smem, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(),
      indices.mutable_data_ptr<int64_t>(), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Calls launch_fmp_forward with the unrolled window of the choice.
template <int Dims, typename scalar_t>
void launch_fmp_forward_for(const FmpChoice& c, const FmpGeometry& g, const at::Tensor& x,
                            const at::Tensor& samples, const at::Tensor& output, const at::Tensor& indices) {
  if (!c.index32) {
    launch_fmp_forward<scalar_t, uint64_t, Dims, 0>(c, g, x, samples, output, indices);  // choose_fmp: k == 0
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
  if (output.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  const auto c = choose_fmp(g);
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
// Backward: dx[e] = sum_{o : idx[o] == e} dy[o] per plane, deterministic.
//
// Geometry. Along one axis (A = in - k >= B = out - 1, since out + k - 1 <= in),
// let f(c) = floor(c * A / B) (f = A when out == 1). In exact arithmetic the
// forward's window of cell c starts at floor((c + u) * alpha) - floor(u * alpha),
// which is f(c) or f(c) + 1; float rounding moves it by at most one more in
// practice (measured: never outside [f - 1, f + 1]). The REACH of cell c is
//   reach(c) = [f(c) - 1, f(c) + k]        (the window for any start in [f-1, f+1]).
// A cell whose index lies in its reach along every axis is REGULAR, any other
// cell (index from elsewhere, or outside the plane) is a STRAY.
//
// Rounds. Along an axis, R = ceil((k + 2) * B / A) (at most out) cells apart have
// disjoint reaches: for j - i >= R, f(j) - f(i) >= floor((j - i) * A / B) >=
// floor(R * A / B) >= k + 2, so f(j) - 1 > f(i) + k. Cell (ct, ch, cw) belongs to
// round ((ct mod R_T) * R_H + ch mod R_H) * R_W + cw mod R_W; two distinct cells
// of one round differ by a non-zero multiple of R along some axis, so two
// REGULAR cells of one round never target the same input element.
//
// Tiles. Block b owns tile (b mod tiles) of plane (b / tiles): an input box
// [x0, x1) per axis that is one contiguous range [g0, g0 + len) of the plane
// (choose_fmp_backward). It zeroes an acc_t accumulator for the tile in shared
// memory, then walks, in chunks of kBwdThreads * kCellsPerThread, the box of
// cells whose reach meets the tile (per axis c0 = min c with f(c) + k >= x0,
// c1 = max c with f(c) - 1 <= x1 - 1); each thread loads its cells' dy and idx
// coalesced, flags strays, and keeps the regular cells whose index falls in the
// tile. Then, for each round r: every thread adds its cells of round r,
//   acc[idx - g0] += dy          (plain shared-memory read-modify-write)
// and the block synchronizes. Last the tile is rounded to scalar_t once and
// stored with 16-byte vectors (the accumulator is offset so the vectors align).
//
// Determinism (tile_rounds). Within a chunk and round no two cells touch the same element and
// rounds are separated by barriers, so each element receives its contributions
// in the fixed order (chunk, round), at most one per (chunk, round); the chunks,
// rounds and tiles are functions of the problem only. Bit-identical run to run.
// (The order is not increasing o; it differs from it only for elements with
// three or more contributions, as floating-point addition is commutative.)
//
// Disjoint windows (k <= alpha on every axis, choose_fmp): the forward's indices
// give each element at most one contribution, so the tile skips the rounds: each
// cell sets the element's bit in a "seen" bitmap (shared-memory atomicOr) and, if it
// was the first, stores its value; a cell that finds the bit set flags the plane like
// a stray, and the ordered scan below recomputes the plane (whatever the racing
// stores left). Only indices not made by the forward, or float rounding that moves
// a window start onto its neighbour's last element, take that path. With one tile
// per plane every cell of the plane is in the box, so only indices outside the plane
// count as strays there (they add nothing, as in the scan) and the reach test is
// skipped. (Counted atomicAdds that let two contributions through, their sum being
// order-free, measured 4-13% slower.)
//
// Strays. A regular cell is loaded by every tile its reach meets, so it is added
// exactly once (by the tile holding its index). A stray can target any tile, so
// a block that sees one writes flag 1 (else 0) to workspace[b], and
// fmp_stray_fixup_kernel recomputes every plane with a flag by a full ordered
// scan (sum over all o in increasing order; out-of-plane indices add nothing).
// Every cell is loaded by at least one tile (reach(c) meets [0, in)), so every
// stray is seen. Forward indices are never strays unless float rounding moved a
// start by two, which only costs time.

template <typename IndexT>
struct FmpBwdAxis {
  IndexT in, out, k, A;    // A = in - k
  IndexT f_base;           // A when out == 1 (so that f(0) = A), else 0
  IntDivider<IndexT> B;    // out - 1 (1 when out == 1)
  IntDivider<IndexT> R;    // rounds along this axis
  int64_t tile, count;     // input extent of a tile, tiles along this axis

  __device__ __forceinline__ IndexT f(IndexT c) const { return B.div(c * A + f_base); }
  // x in reach(c) = [f(c) - 1, f(c) + k]
  __device__ __forceinline__ bool reaches(IndexT c, IndexT x) const {
    const IndexT s = f(c);
    return x + 1 >= s && x <= s + k;
  }
  // Cells whose reach meets the input range [x0, x1]: [c0, c0 + n).
  __device__ __forceinline__ void cells(int64_t x0, int64_t x1, int64_t& c0, int64_t& n) const {
    if (out == 1) {
      c0 = 0;
      n = 1;
      return;
    }
    const int64_t a = A, b = B.divisor, o = out;
    const int64_t m = x0 - int64_t(k);        // f(c) >= m  <=>  c >= ceil(m * b / a)
    c0 = m <= 0 ? 0 : std::min<int64_t>(o - 1, (m * b + a - 1) / a);
    const int64_t c1 = std::min<int64_t>(o - 1, ((x1 + 2) * b - 1) / a);  // f(c) <= x1 + 1
    n = c1 >= c0 ? c1 - c0 + 1 : 0;
  }
};

template <typename IndexT>
struct FmpBwdParams {
  FmpBwdAxis<IndexT> axis[3];
  IntDivider<IndexT> in_w, in_h;
  int64_t in_plane, out_plane, tiles, blocks;
  IndexT rounds;  // R_T * R_H * R_W (<= cells of a plane)
  int smem_vecs;  // 16-byte vectors of shared memory: accumulator (largest tile + one vector), then seen bits
  int acc_bytes;  // where the seen bits start
  bool disjoint;  // one store per element instead of rounds
};

// A fast divider built on the device (IntDivider's constructor is host-only).
template <typename T>
__device__ __forceinline__ IntDivider<T> device_divider(T d) {
  IntDivider<T> r;
  r.divisor = d;
  return r;
}

template <>
__device__ __forceinline__ IntDivider<uint32_t> device_divider<uint32_t>(uint32_t d) {
  IntDivider<uint32_t> r;
  r.divisor = d;
  r.shift = d <= 1 ? 0 : 32 - __clz(d - 1);  // least s with 2^s >= d
  r.m1 = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << r.shift) - d)) / d + 1);
  return r;
}

// What a block needs to know about its tile. Thread 0 computes it (64-bit
// divisions and two dividers' magic numbers) and shares it through shared memory.
template <typename IndexT>
struct FmpTile {
  int64_t plane, g0;   // the plane; the tile's first element within the plane
  int len, shift;      // elements of the tile; accumulator offset that aligns dx's 16-byte vectors
  IndexT c0[3];        // first cell of the box of cells whose reach meets the tile
  IndexT ncells;       // cells in that box
  IntDivider<IndexT> box_w, box_h;  // box extents along W and H
};

template <typename scalar_t, typename IndexT>
__device__ FmpTile<IndexT> fmp_tile(const FmpBwdParams<IndexT>& p, const scalar_t* dx, int64_t block) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  FmpTile<IndexT> t;
  t.plane = block / p.tiles;
  int64_t rest = block - t.plane * p.tiles;
  int64_t x0[3], x1[3], cn[3];
  for (int a = 2; a >= 0; --a) {
    const auto& ax = p.axis[a];
    const int64_t i = rest % ax.count;
    rest /= ax.count;
    x0[a] = i * ax.tile;
    x1[a] = std::min<int64_t>(x0[a] + ax.tile, int64_t(ax.in));
    int64_t c0;
    ax.cells(x0[a], x1[a] - 1, c0, cn[a]);
    t.c0[a] = static_cast<IndexT>(c0);
  }
  t.g0 = (x0[0] * int64_t(p.axis[1].in) + x0[1]) * int64_t(p.axis[2].in) + x0[2];
  t.len = static_cast<int>((x1[0] - x0[0]) * (x1[1] - x0[1]) * (x1[2] - x0[2]));
  t.shift = static_cast<int>((reinterpret_cast<uintptr_t>(dx + t.plane * p.in_plane + t.g0) / sizeof(scalar_t)) % kVec);
  t.ncells = static_cast<IndexT>(cn[0] * cn[1] * cn[2]);
  t.box_w = device_divider<IndexT>(static_cast<IndexT>(std::max<int64_t>(cn[2], 1)));
  t.box_h = device_divider<IndexT>(static_cast<IndexT>(std::max<int64_t>(cn[1], 1)));
  return t;
}

// Cell q of a tile's box, as (t, h, w) output coordinates (2d: t = 0).
template <int Dims, typename IndexT>
__device__ __forceinline__ void fmp_box_cell(const FmpTile<IndexT>& t, IndexT q, IndexT (&cell)[3]) {
  const auto wq = t.box_w.divmod(q);
  cell[2] = t.c0[2] + wq.mod;
  if constexpr (Dims == 3) {
    const auto hq = t.box_h.divmod(wq.div);
    cell[0] = t.c0[0] + hq.div;
    cell[1] = t.c0[1] + hq.mod;
  } else {
    cell[0] = 0;
    cell[1] = t.c0[1] + wq.div;
  }
}

template <typename scalar_t, typename acc_t, typename IndexT, int Dims>
__global__ void __launch_bounds__(kBwdThreads)
    fmp_backward_tile_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                             scalar_t* __restrict__ dx, int32_t* __restrict__ strays, FmpBwdParams<IndexT> p) {
  cuda::start_next_grid();  // fmp_stray_fixup_kernel may take free slots now
  extern __shared__ __align__(16) unsigned char fmp_smem[];
  __shared__ FmpTile<IndexT> shared_tile;
  acc_t* const acc = reinterpret_cast<acc_t*>(fmp_smem);
  uint32_t* const seen = reinterpret_cast<uint32_t*>(fmp_smem + p.acc_bytes);  // disjoint: 1 bit per element
  constexpr int kVec = 16 / sizeof(scalar_t);
  constexpr int kAccVec = 16 / sizeof(acc_t);
  constexpr IndexT kChunk = IndexT(kBwdThreads) * kCellsPerThread;
  const auto& ax = p.axis;

  for (int64_t block = blockIdx.x; block < p.blocks; block += gridDim.x) {
    if (threadIdx.x == 0) shared_tile = fmp_tile<scalar_t, IndexT>(p, dx, block);
    for (int i = threadIdx.x; i < p.smem_vecs; i += kBwdThreads) cuda::store_vec<acc_t, kAccVec>(acc + i * kAccVec, {});
    __syncthreads();  // tile known, accumulator zeroed
    const FmpTile<IndexT> t = shared_tile;
    scalar_t* const dxt = dx + t.plane * p.in_plane + t.g0;
    acc_t* const acct = acc + t.shift;  // acct[i] accumulates dxt[i]; acct + i is 16-byte aligned where dxt + i is
    const scalar_t* const dyp = dy + t.plane * p.out_plane;
    const int64_t* const ip = idx + t.plane * p.out_plane;
    bool stray = false;
    for (IndexT first = 0; first < t.ncells; first += kChunk) {
      int64_t target[kCellsPerThread];
      scalar_t grad[kCellsPerThread];
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j) {  // coalesced loads of the chunk
        const IndexT q = first + IndexT(j * kBwdThreads + threadIdx.x);
        target[j] = -1;
        grad[j] = scalar_t(0);
        if (q < t.ncells) {
          IndexT cell[3];
          fmp_box_cell<Dims>(t, q, cell);
          const IndexT o = (cell[0] * ax[1].out + cell[1]) * ax[2].out + cell[2];
          target[j] = ip[o];
          grad[j] = dyp[o];
        }
      }
      constexpr IndexT kNoRound = ~IndexT(0);
      int slot[kCellsPerThread];
      IndexT round[kCellsPerThread];
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j) {
        const IndexT q = first + IndexT(j * kBwdThreads + threadIdx.x);
        round[j] = kNoRound;
        slot[j] = 0;
        if (q < t.ncells) {
          IndexT cell[3];
          fmp_box_cell<Dims>(t, q, cell);  // the cell again (cheaper than holding it)
          const int64_t e = target[j];
          bool regular = e >= 0 && e < p.in_plane;
          if (regular && !(p.disjoint && p.tiles == 1)) {  // one tile: every cell of the plane is in the box
            const auto we = p.in_w.divmod(static_cast<IndexT>(e));
            IndexT x[3] = {0, we.div, we.mod};
            if constexpr (Dims == 3) {
              const auto he = p.in_h.divmod(we.div);
              x[0] = he.div;
              x[1] = he.mod;
            }
#pragma unroll
            for (int a = 3 - Dims; a < 3; ++a) regular = regular && ax[a].reaches(cell[a], x[a]);
          }
          stray = stray || !regular;
          const IndexT in_tile = static_cast<IndexT>(e) - static_cast<IndexT>(t.g0);  // wraps below the tile
          if (regular && in_tile < IndexT(t.len)) {
            slot[j] = static_cast<int>(in_tile);
            round[j] = p.disjoint ? IndexT(0)
                                  : (ax[0].R.mod(cell[0]) * ax[1].R.divisor + ax[1].R.mod(cell[1])) * ax[2].R.divisor +
                                        ax[2].R.mod(cell[2]);
          }
        }
      }
      for (IndexT r = 0; r < p.rounds; ++r) {
#pragma unroll
        for (int j = 0; j < kCellsPerThread; ++j) {
          if (round[j] != r) continue;
          if (p.disjoint) {
            const uint32_t bit = 1u << (slot[j] & 31);
            if (atomicOr(&seen[slot[j] >> 5], bit) & bit) {
              stray = true;  // a second contribution: the plane takes the ordered scan
            } else {
              acct[slot[j]] = acc_t(0) + static_cast<acc_t>(grad[j]);  // 0 + (-0) = +0, as an add would give
            }
          } else {
            acct[slot[j]] += static_cast<acc_t>(grad[j]);
          }
        }
        __syncthreads();
      }
    }
    // Also the barrier before the store (when the block had no cells).
    const int any_stray = __syncthreads_or(stray);
    if (threadIdx.x == 0) strays[block] = any_stray ? 1 : 0;

    const int head = std::min(t.len, (kVec - t.shift) % kVec);
    const int nvec = (t.len - head) / kVec;
    for (int i = threadIdx.x; i < head; i += kBwdThreads) dxt[i] = static_cast<scalar_t>(acct[i]);
    for (int v = threadIdx.x; v < nvec; v += kBwdThreads) {
      const int i = head + v * kVec;
      cuda::Vec<scalar_t, kVec> out;
#pragma unroll
      for (int s = 0; s < kVec; s += kAccVec) {
        const auto a = cuda::load_vec<acc_t, kAccVec>(acct + i + s);
#pragma unroll
        for (int u = 0; u < kAccVec; ++u) out.v[s + u] = static_cast<scalar_t>(a.v[u]);
      }
      cuda::store_vec<scalar_t, kVec>(dxt + i, out);
    }
    for (int i = head + nvec * kVec + threadIdx.x; i < t.len; i += kBwdThreads) {
      dxt[i] = static_cast<scalar_t>(acct[i]);
    }
    __syncthreads();  // the accumulator and the tile are reused by the next block of the loop
  }
}

// Per plane: if any of its tiles saw a stray, the plane is recomputed by a full
// ordered scan, dx[e] = sum over o in increasing order with idx[o] == e. A block
// takes `group` (<= 32) planes at a time: lane j of its first warp reads the flags
// of plane (first + j), then the block recomputes the flagged ones in turn. The
// launcher sizes groups so that about 8 blocks per SM share the planes: few blocks
// read the flags when none is set, and many share the scans when many are.
// Launched early: it waits for fmp_backward_tile_kernel to end.
constexpr int64_t kFixupBlocksPerSm = 8;

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    fmp_stray_fixup_kernel(const scalar_t* __restrict__ dy, const int64_t* __restrict__ idx,
                           scalar_t* __restrict__ dx, const int32_t* __restrict__ strays, int64_t planes,
                           int64_t tiles, int64_t in_plane, int64_t out_plane, int group) {
  cuda::wait_for_previous_grid();
  __shared__ uint32_t flagged;  // bit j: plane first + j needs the scan
  for (int64_t first = int64_t(blockIdx.x) * group; first < planes; first += int64_t(gridDim.x) * group) {
    if (threadIdx.x < 32) {
      const int64_t plane = first + threadIdx.x;
      int32_t any = 0;
      for (int64_t j = 0; int(threadIdx.x) < group && plane < planes && j < tiles; ++j) {
        any |= strays[plane * tiles + j];
      }
      const uint32_t bits = __ballot_sync(0xffffffffu, any != 0);
      if (threadIdx.x == 0) flagged = bits;
    }
    __syncthreads();
    for (uint32_t bits = flagged; bits != 0; bits &= bits - 1) {
      const int64_t plane = first + __ffs(bits) - 1;
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
    __syncthreads();  // flagged is rewritten for the next planes
  }
}

template <typename scalar_t, typename IndexT, int Dims>
void launch_fmp_backward(const FmpGeometry& g, const FmpBackwardChoice& c, const at::Tensor& dy,
                         const at::Tensor& idx, const at::Tensor& dx, const at::Tensor& workspace) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpBwdParams<IndexT> p;
  int64_t rounds = 1;
  for (int a = 0; a < 3; ++a) {
    auto& ax = p.axis[a];
    ax.in = static_cast<IndexT>(g.in[a]);
    ax.out = static_cast<IndexT>(g.out[a]);
    ax.k = static_cast<IndexT>(g.k[a]);
    ax.A = static_cast<IndexT>(g.in[a] - g.k[a]);
    ax.f_base = g.out[a] == 1 ? ax.A : IndexT(0);
    ax.B = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(g.out[a] - 1, 1)));
    ax.R = IntDivider<IndexT>(static_cast<IndexT>(c.rounds[a]));
    ax.tile = c.tile[a];
    ax.count = c.count[a];
    rounds *= c.rounds[a];
  }
  p.in_w = IntDivider<IndexT>(static_cast<IndexT>(g.in[2]));
  p.in_h = IntDivider<IndexT>(static_cast<IndexT>(g.in[1]));
  p.in_plane = g.in_plane();
  p.out_plane = g.out_plane();
  p.tiles = c.tiles;
  p.blocks = g.planes() * c.tiles;
  p.rounds = static_cast<IndexT>(rounds);
  p.smem_vecs = static_cast<int>(c.smem_bytes / 16);
  p.acc_bytes = static_cast<int>(c.acc_bytes);
  p.disjoint = c.disjoint;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* strays = reinterpret_cast<int32_t*>(workspace.mutable_data_ptr());
  auto kernel = fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims>;
  const int smem = static_cast<int>(c.smem_bytes);
  const int64_t block_smem = smem + int64_t(sizeof(FmpTile<IndexT>));  // dynamic + the static tile
  TORCH_CHECK_NOT_IMPLEMENTED(block_smem <= cuda::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin),
                              fmp_op_name(g.dims, true), ": needs ", block_smem,
                              " bytes of shared memory per block, the device allows ",
                              cuda::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  cuda::allow_dynamic_smem(kernel, smem);
  const int64_t grid = std::min<int64_t>(p.blocks, int64_t(1) << 30);
  kernel<<<grid, kBwdThreads, smem, stream>>>(dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(),
                                               dx.mutable_data_ptr<scalar_t>(), strays, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t fixup_target = kFixupBlocksPerSm * cuda::num_sms();
  const int group = static_cast<int>(std::clamp<int64_t>(ceil_div<int64_t>(g.planes(), fixup_target), 1, 32));
  const int64_t fixup_blocks = std::min(ceil_div<int64_t>(g.planes(), group), 2 * fixup_target);
  cuda::launch(fmp_stray_fixup_kernel<scalar_t, acc_t>,
               {.grid = dim3(fixup_blocks), .block = dim3(kThreads), .early = true}, dy.const_data_ptr<scalar_t>(),
               idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), strays, g.planes(), c.tiles,
               g.in_plane(), g.out_plane(), group);
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
  const auto c = choose_fmp_backward(g, self.scalar_type());
  const int64_t need = fmp_backward_workspace_bytes(g, c);
  check_workspace(op, workspace, need, 4, self.device());
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
      at::empty({fmp_backward_workspace_bytes(g, choose_fmp_backward(g, self.scalar_type()))},
                self.options().dtype(at::kByte));
  fmp_backward_out_cuda<Dims>(grad_output, self, kernel_size, output_size, indices, grad_input, workspace);
  return grad_input;
}

// problem = [dims, input ndim, *input_shape, *kernel_size, *output_size]
KernelChoice fmp_choice(c10::IntArrayRef problem, c10::ScalarType) {
  const auto g = fmp_geometry_of_problem("baracuda::fractional_max_pool", problem);
  return {fmp_variant(choose_fmp(g), g.dims), 0};
}

KernelChoice fmp_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto g = fmp_geometry_of_problem("baracuda::fractional_max_pool_backward", problem);
  const auto c = choose_fmp_backward(g, dtype);
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
