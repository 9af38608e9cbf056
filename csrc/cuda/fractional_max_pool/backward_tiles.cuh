// fractional_max_pool family, CUDA: the backward over tiles of input elements staged in shared memory
// (tile_stores and tile_counts).
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

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

}  // namespace
}  // namespace baracuda
