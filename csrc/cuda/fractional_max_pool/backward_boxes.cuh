// fractional_max_pool family, CUDA: the backward over owned boxes (integer strides).
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// Backward, owned boxes: disjoint windows whose stride is an integer. When alpha =
// (in - k) / (out - 1) is an integer a >= k on every axis, f(c) = c * a exactly, and
// the BOXES [c * a, (c + 1) * a) per axis (the last cell's ending at in; an axis of one
// cell: all of it) partition the plane. The forward's window of cell c starts at f(c),
// so its index lies in its box, where no other cell's can:
//   dx[e] = 0 + dy[o] at e = idx[o], 0 at the other elements of o's box.
// A block takes a range of cells of one plane (a multiple of 4 cells); a thread takes
// kBoxCells of them in units of Cells W-adjacent cells (units j, j + kThreads, ...:
// coalesced dy and idx loads, and stores along W that meet the next thread's) and
// writes their boxes whole: every element once, no shared memory, no atomics. Cells > 0:
// the boxes are 2 wide along W (fmp_backward_config) and a unit's box row, 2 * Cells
// elements, is one vector store of at most 16 bytes (Cells = 2 or 4 needs out along W a
// multiple of Cells and dx aligned to 2 * Cells elements). Cells = 0: dx not aligned to 2
// elements, rows stored element by element.
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

}  // namespace
}  // namespace baracuda
