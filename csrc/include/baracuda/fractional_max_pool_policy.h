// fractional_max_pool family, CUDA launch policy (baracuda/launch_policy.h): a pure
// function of the pooling geometry (problem = [dims, input ndim, *input_shape,
// *kernel_size, *output_size]), the dtype and the device's facts, shared by the
// launchers (csrc/cuda/fractional_max_pool/) and the Plan API. Plain C++: compiled
// into CPU-only builds too, so CI runs it with recorded facts.
//
// The forward kernel over overlapping windows spreads its work over waves of
// resident blocks: how many blocks of it an SM holds is the compiled kernel's
// occupancy, which the launcher asks the runtime for and passes to
// fmp_forward_resident_grid (the recorded-facts view leaves that grid out).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "baracuda/fractional_max_pool.h"
#include "baracuda/launch_policy.h"

namespace baracuda {

constexpr int kFmpThreads = 256;              // forward and stray-fixup blocks
constexpr int kFmpBwdThreads = 256;           // backward tile blocks (512 are slower)
constexpr int64_t kFmpForwardWaves = 2;       // forward, overlapping windows: waves of resident blocks (faster than 1)
constexpr int kFmpBoxCells = 4;               // backward, owned boxes: output cells a thread writes the boxes of
constexpr int64_t kFmpMaxBoxStride = 4;       // backward, owned boxes: the largest integer stride taken
constexpr int kFmpLaterCap = 32;              // backward, disjoint windows: second contributions a block resolves itself
constexpr int64_t kFmpTileBytes = 64 * 1024;  // backward: largest tile, in acc_t elements of this many bytes
constexpr int64_t kFmpMaxBwdSmem = 72 * 1024;  // backward: tiles halve until a block's shared memory fits (3 blocks per SM)
// Forward, 2d: most shared memory for a band's input rows. 16 KB: more, shorter blocks
// than at larger bands keep more loads in flight; smaller bands re-read more rows.
constexpr int64_t kFmpBandBytes = 16 * 1024;
// Backward stray fixup: about this many blocks per SM share the planes (few read the
// flags when none is set, many share the scans when many are).
constexpr int64_t kFmpFixupBlocksPerSm = 8;
constexpr int64_t kFmpInt31 = int64_t(1) << 31;

// Forward window elements when unrolled (k per axis, 0: not unrolled).
constexpr int fmp_window(int dims, int k) { return k == 0 ? 0 : (dims == 3 ? k * k * k : k * k); }

// Output cells per thread in the forward: enough window loads in flight to cover
// DRAM latency (the whole window of each cell is loaded before any compare).
constexpr int fmp_cells_per_thread(int window) { return window == 0 ? 1 : (window <= 8 ? 4 : 2); }

// Backward geometry along one axis (see the comment above fmp_backward_tile_kernel):
// the cells whose reach [f(c) - 1, f(c) + k] meets the input range [x0, x1] are
// [c0, c0 + n), where f(c) = floor(c * (in - k) / (out - 1)) (f = in - k when out == 1).
C10_HOST_DEVICE inline void fmp_reach_cells(int64_t in, int64_t out, int64_t k, int64_t x0, int64_t x1, int64_t& c0,
                                            int64_t& n) {
  if (out == 1) {
    c0 = 0;
    n = 1;
    return;
  }
  const int64_t a = in - k, b = out - 1;
  const int64_t m = x0 - k;  // f(c) >= m  <=>  c >= ceil(m * b / a)
  c0 = m <= 0 ? 0 : std::min<int64_t>(out - 1, (m * b + a - 1) / a);
  const int64_t c1 = std::min<int64_t>(out - 1, ((x1 + 2) * b - 1) / a);  // f(c) <= x1 + 1
  n = c1 >= c0 ? c1 - c0 + 1 : 0;
}

enum class FmpForwardKernel {
  kSegments,       // fmp_forward_kernel, disjoint windows: one block per work item (plane, segment)
  kResidentWaves,  // fmp_forward_kernel, overlapping windows: items spread over waves of resident blocks
  kBands,          // fmp2d_forward_band_kernel: bands of output rows, their input rows staged in shared memory
};

struct FmpForwardConfig {
  FmpForwardKernel kind = FmpForwardKernel::kSegments;
  bool index32 = true;    // 32-bit index math (fast division) when every dividend stays below 2^31
  int k = 0;              // 2 or 3 when every pooled axis has that kernel size (windows unrolled); 0: loops
  bool table = false;     // window starts tabulated per plane in shared memory (at most kFmpThreads x cells of them)
  bool disjoint = false;  // windows never overlap (k <= alpha on every axis)
  int threads = kFmpThreads;  // threads per block (whole warps, at most kFmpThreads), fmp_segment_threads
  int cells_per_thread = 1;
  // Bands: band_rows output rows whose input rows (at most band_in_rows) are staged.
  int64_t band_rows = 0, band_in_rows = 0, bands = 0;
  int64_t smem = 0;             // dynamic shared memory of a block
  int64_t items = 0;            // work items: (plane, segment) pairs, or (plane, band)
  int64_t items_per_block = 0;  // kResidentWaves: 0 until fmp_forward_resident_grid
  int64_t blocks = 0;
};

enum class FmpBackwardKernel {
  kOwnedBoxes,  // fmp_backward_boxes_kernel: each block writes the boxes of its cells (integer strides)
  kTileStores,  // fmp_backward_tile_kernel, disjoint windows: one store per element
  kTileCounts,  // fmp_backward_tile_kernel, overlapping windows: contributions counted, then summed in order
};

// Backward tiling (see the comment above fmp_backward_tile_kernel). A tile is a
// box of tile[T] x tile[H] x tile[W] input elements of one plane; only the
// outermost axes are split, so a tile is always one contiguous range of the plane.
// Shared memory of a block: an accumulator per tile element (acc_t; scalar_t for
// disjoint windows, see tile_stores) and one vector of slack to align it with dx, a
// field of `bits` bits per tile element (disjoint: 1, a "seen" bit; overlapping: 16, a
// count), and with overlapping windows the dy (acc_t) and target (uint16) of each cell
// of the box, a list of the elements of three or more contributions (uint16; each
// takes three cells) and one of the box places of second contributions (uint16; each
// element takes two cells). Tiles start at kFmpTileBytes / (accumulator size) elements
// and shrink until the block fits in kFmpMaxBwdSmem (a plane of 112 x 112 float32 with
// 3 x 3 windows takes two tiles: four blocks per SM, not two), then on while the cells
// loaded per element do not grow.
struct FmpBackwardConfig {
  FmpBackwardKernel kind = FmpBackwardKernel::kTileCounts;
  bool index32 = true;
  int64_t tile[3] = {1, 1, 1};   // input extent of a tile per axis
  int64_t count[3] = {1, 1, 1};  // tiles per axis
  int64_t tiles = 1;             // tiles per plane (owned boxes: blocks per plane)
  bool disjoint = false;         // windows disjoint (k <= alpha on every axis): one store per element
  int bits = 1;                  // field bits per element: 1 (disjoint: seen), 16 (overlapping: a count)
  int64_t box[3] = {1, 1, 1};    // most cells per axis in the box of one tile
  int64_t box_cells = 0;         // box[0] * box[1] * box[2]
  bool whole_rows = false;       // a box holds whole rows of cells (W, and in 3d H, not split): place q is
                                 // cell o0 + q
  int64_t acc_bytes = 0;         // acc_t per tile element and one vector, 16-byte multiple
  int64_t cell_bytes = 0;        // overlapping windows: acc_t + uint16 per box cell, a list of box_cells / 3 + 1
                                 // and one of box_cells / 2 + 1 uint16, 16-byte multiple
  int64_t mask_bytes = 0;        // bits per tile element, 16-byte multiple
  int64_t smem_bytes = 0;        // acc_bytes + cell_bytes + mask_bytes: the dynamic shared memory
  int64_t block_smem = 0;        // tile kernels: smem_bytes and the static shared memory
  // Owned boxes: the integer stride per axis, and the cells of one block.
  int64_t stride[3] = {1, 1, 1};
  int64_t block_cells = 0;
  int threads = kFmpBwdThreads;
  int64_t blocks = 0;            // the backward kernel's grid
  // The stray fixup (none when a tile kernel's blocks hold whole planes).
  bool fixup = false;
  int fixup_group = 0;           // planes a fixup block takes at a time
  int64_t fixup_blocks = 0;
  int64_t workspace_bytes = 0;   // stray flags, one int32 per backward block
};

namespace fmp_policy {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Forward segments: `cells` output cells (a plane, or a band of one) are split into
// segments of `threads` x `per_thread` slots, threads a multiple of 32 and at most
// kFmpThreads. Slots past the end load a window and store nothing, so of the first few
// segment counts (at least 128 threads, unless the fewest segments need fewer) the
// one with the fewest such slots wins (ties: fewer segments). A 40 x 40 plane with 2
// cells per thread: 5 segments of 160 threads, none idle, where 4 of 256 threads
// left 22% of the slots idle.
inline int segment_threads(int64_t cells, int per_thread) {
  int best = kFmpThreads;
  if (cells == 0) return best;  // nothing is launched
  const int64_t fewest = ceil_div(cells, int64_t(kFmpThreads) * per_thread);
  int64_t best_idle = -1;
  for (int64_t s = fewest; s < fewest + 8; ++s) {
    const int64_t threads = ceil_div(ceil_div(cells, s * per_thread), 32) * 32;
    if (threads < 128 && s > fewest) break;
    const int64_t idle = s * threads * per_thread - cells;
    if (best_idle < 0 || idle < best_idle) {
      best = static_cast<int>(threads);
      best_idle = idle;
    }
  }
  return best;
}

// 2d bands: with samples in [0, 1) the starts of output rows o < o' differ by at most
// floor((o' - o) * (in - k) / (out - 1)) + 1, so a band of R output rows reads at most
// that for o' - o = R - 1, plus k, plus one row for float rounding: band_in_rows. The
// band is the most rows whose input rows (and a 16-byte vector of alignment slack)
// fit in kFmpBandBytes, balanced over the plane's bands.
inline void choose_bands(const FmpGeometry& g, int64_t elem_bytes, FmpForwardConfig& c) {
  const int64_t in = g.in[1], out = g.out[1], k = g.k[1], width = g.in[2];
  auto in_rows = [&](int64_t rows) {
    return out == 1 ? k : std::min<int64_t>(in, (rows - 1) * (in - k) / (out - 1) + k + 2);
  };
  auto bytes = [&](int64_t rows) { return (in_rows(rows) * width) * elem_bytes + 16; };
  if (bytes(1) > kFmpBandBytes) return;
  int64_t rows = 1;
  while (rows < out && bytes(rows + 1) <= kFmpBandBytes) ++rows;
  c.bands = ceil_div(out, rows);
  c.band_rows = ceil_div(out, c.bands);
  c.band_in_rows = in_rows(c.band_rows);
  c.threads = segment_threads(c.band_rows * g.out[2], c.cells_per_thread);
}

}  // namespace fmp_policy

inline FmpForwardConfig fmp_forward_config(const FmpGeometry& g, c10::ScalarType dtype, const DeviceFacts&) {
  using fmp_policy::ceil_div;
  FmpForwardConfig c;
  bool fits = g.planes() * g.in_plane() < kFmpInt31 && g.planes() * g.out_plane() < kFmpInt31;
  // Backward reach and cell-range math multiplies (x + k + 3) * out-sized values.
  for (int a = 0; a < 3; ++a) fits = fits && (g.in[a] + g.k[a] + 3) * (g.out[a] + 1) < kFmpInt31;
  const int k = g.uniform_kernel();
  bool disjoint = true;  // alpha = (in - k) / (out - 1) >= k on every axis
  for (int a = 0; a < 3; ++a) disjoint = disjoint && (g.out[a] <= 1 || g.k[a] * (g.out[a] - 1) <= g.in[a] - g.k[a]);
  c.index32 = fits;
  c.k = fits ? k : 0;  // unrolled windows only with 32-bit indices (64-bit problems take the loops)
  c.disjoint = disjoint;
  // A block computes its plane's whole start table: worth it while that is no more
  // starts than the cells of one work item (else each cell computes its own).
  const int64_t starts = (g.dims == 3 ? g.out[0] : 0) + g.out[1] + g.out[2];
  c.cells_per_thread = fmp_cells_per_thread(fmp_window(g.dims, c.k));
  c.table = starts <= int64_t(kFmpThreads) * c.cells_per_thread;
  c.threads = fmp_policy::segment_threads(g.out_plane(), c.cells_per_thread);
  if (g.dims == 2 && c.k > 0 && c.table) {
    fmp_policy::choose_bands(g, static_cast<int64_t>(c10::elementSize(dtype)), c);
  }
  if (c.band_rows > 0) {
    c.kind = FmpForwardKernel::kBands;
    c.smem = ceil_div((c.band_rows + g.out[2]) * 4, 16) * 16 +
             c.band_in_rows * g.in[2] * static_cast<int64_t>(c10::elementSize(dtype)) + 16;
    c.items = g.planes() * c.bands;
    c.items_per_block = 1;
    c.blocks = c.items;
    return c;
  }
  const int64_t index_bytes = c.index32 ? 4 : 8;
  c.smem = c.table ? starts * index_bytes : 0;
  c.items = g.planes() * ceil_div(g.out_plane(), int64_t(c.threads) * c.cells_per_thread);
  c.kind = c.disjoint ? FmpForwardKernel::kSegments : FmpForwardKernel::kResidentWaves;
  if (c.disjoint && c.items > 0) {
    c.items_per_block = ceil_div(c.items, std::min<int64_t>(c.items, std::numeric_limits<int32_t>::max()));
    c.blocks = ceil_div(c.items, c.items_per_block);
  }
  return c;
}

// kResidentWaves: the items over kFmpForwardWaves waves of resident blocks, given how
// many blocks of the compiled kernel the GPU holds at once at c.threads threads and
// c.smem bytes (cuda::resident_groups).
inline void fmp_forward_resident_grid(FmpForwardConfig& c, int64_t resident_blocks) {
  using fmp_policy::ceil_div;
  if (c.items == 0) return;
  const int64_t resident = std::max<int64_t>(1, resident_blocks);
  const int64_t wanted = std::min(c.items, kFmpForwardWaves * resident);
  c.items_per_block = ceil_div(c.items, std::min<int64_t>(wanted, std::numeric_limits<int32_t>::max()));
  c.blocks = ceil_div(c.items, c.items_per_block);
}

inline FmpBackwardConfig fmp_backward_config(const FmpGeometry& g, c10::ScalarType dtype, const DeviceFacts& f) {
  using fmp_policy::ceil_div;
  FmpBackwardConfig c;
  const FmpForwardConfig forward = fmp_forward_config(g, dtype, f);
  c.index32 = forward.index32;
  c.disjoint = forward.disjoint;
  // Owned boxes: alpha = (in - k) / (out - 1) an integer in [k, kFmpMaxBoxStride] on
  // every axis (an axis of one cell: its box is the whole axis, at most kFmpMaxBoxStride),
  // 2 = k along W (box rows of 2 elements, stored as vectors; boxes 3 wide would be
  // stored element by element, slower than the tiles).
  bool boxes = c.disjoint && g.k[2] == 2 && g.in[2] == 2 * g.out[2];
  for (int a = 0; a < 3; ++a) {
    const int64_t A = g.in[a] - g.k[a], B = g.out[a] - 1;
    c.stride[a] = B == 0 ? g.in[a] : A / B;
    boxes = boxes && (B == 0 || A % B == 0) && g.k[a] <= c.stride[a] && c.stride[a] <= kFmpMaxBoxStride;
  }
  const bool empty = g.planes() == 0 || g.out_plane() == 0;
  if (boxes) {
    c.kind = FmpBackwardKernel::kOwnedBoxes;
    c.threads = kFmpThreads;
    const int64_t per_block = int64_t(kFmpThreads) * kFmpBoxCells;
    c.tiles = ceil_div(g.out_plane(), per_block);
    // Whole units of up to kFmpBoxCells W-adjacent cells (fmp_backward_boxes_kernel).
    c.block_cells = ceil_div(ceil_div(g.out_plane(), c.tiles), int64_t(kFmpBoxCells)) * kFmpBoxCells;
  } else {
    c.kind = c.disjoint ? FmpBackwardKernel::kTileStores : FmpBackwardKernel::kTileCounts;
    const int64_t acc_size = dtype == c10::ScalarType::Double ? 8 : 4;
    const int64_t elem_size = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t vec = 16 / elem_size;
    const int64_t store_size = c.disjoint ? elem_size : acc_size;  // the tile's accumulator elements
    c.bits = c.disjoint ? 1 : 16;
    // The tiles of at most `budget` elements.
    const auto tiles_of = [&](int64_t budget) {
      FmpBackwardConfig t = c;
      // Largest extent per axis, innermost axes whole first.
      int64_t inner = 1;
      for (int a = 2; a >= 0; --a) {
        const int64_t max_extent = std::max<int64_t>(1, budget / inner);
        t.count[a] = ceil_div(g.in[a], max_extent);
        t.tile[a] = ceil_div(g.in[a], t.count[a]);  // balanced tiles
        inner = t.count[a] == 1 ? inner * g.in[a] : budget + 1;  // a split axis leaves 1 for the outer ones
      }
      t.tiles = t.count[0] * t.count[1] * t.count[2];
      t.box_cells = 1;
      for (int a = 0; a < 3; ++a) {  // the widest box of cells over this axis' tiles
        int64_t most = 0;
        for (int64_t i = 0; i < t.count[a]; ++i) {
          int64_t c0 = 0, n = 0;
          const int64_t x0 = i * t.tile[a];
          fmp_reach_cells(g.in[a], g.out[a], g.k[a], x0, std::min(x0 + t.tile[a], g.in[a]) - 1, c0, n);
          most = std::max(most, n);
        }
        t.box[a] = std::max<int64_t>(most, 1);
        t.box_cells *= t.box[a];
      }
      const int64_t elems = t.tile[0] * t.tile[1] * t.tile[2];
      t.whole_rows = t.count[2] == 1 && (g.dims == 2 || t.count[1] == 1);
      t.acc_bytes = ceil_div((elems + vec) * store_size, 16) * 16;
      const int64_t list_bytes = (t.box_cells / 3 + 1 + t.box_cells / 2 + 1) * 2;
      t.cell_bytes = t.disjoint ? 0 : ceil_div(t.box_cells * (acc_size + 2) + list_bytes, 16) * 16;
      t.mask_bytes = ceil_div(elems * t.bits, 128) * 16;
      t.smem_bytes = t.acc_bytes + t.cell_bytes + t.mask_bytes;
      return t;
    };
    // Budgets of kFmpTileBytes, then 3/4, 1/2, 3/8, ... of it: the first whose block
    // fits, or a smaller one (down to a quarter of it) with no more box cells per tile
    // element, the smallest such: as many cells loaded, more blocks per SM (3d [8, 32,
    // 32, 64, 64] float32: 3 T-slices at 4 blocks per SM rather than 4 T-slices at 3).
    const auto next_budget = [](int64_t b) { return std::max<int64_t>(1, b % 3 == 0 ? b * 2 / 3 : b * 3 / 4); };
    int64_t budget = kFmpTileBytes / store_size;
    FmpBackwardConfig best = tiles_of(budget);
    while (best.smem_bytes > kFmpMaxBwdSmem && budget > 1) best = tiles_of(budget = next_budget(budget));
    const auto elems_of = [](const FmpBackwardConfig& t) { return t.tile[0] * t.tile[1] * t.tile[2]; };
    for (const int64_t lowest = budget / 4; budget > 1 && next_budget(budget) >= lowest;) {
      const FmpBackwardConfig t = tiles_of(budget = next_budget(budget));
      if (t.box_cells * elems_of(best) <= best.box_cells * elems_of(t)) best = t;
    }
    c = best;
    c.threads = kFmpBwdThreads;
    c.block_smem = c.smem_bytes + 8 + kFmpLaterCap * (4 + acc_size);  // + the static shared memory
  }
  if (empty) return c;  // nothing is launched
  c.blocks = g.planes() * c.tiles;
  if (c.kind != FmpBackwardKernel::kOwnedBoxes) c.blocks = std::min<int64_t>(c.blocks, int64_t(1) << 30);
  c.workspace_bytes = g.planes() * c.tiles * 4;
  // A tile kernel whose blocks hold whole planes scans its planes itself.
  c.fixup = c.kind == FmpBackwardKernel::kOwnedBoxes || c.tiles > 1;
  if (c.fixup) {
    const int64_t target = kFmpFixupBlocksPerSm * f.num_sms;
    c.fixup_group = static_cast<int>(std::clamp<int64_t>(ceil_div(g.planes(), target), 1, 32));
    c.fixup_blocks = std::min(ceil_div(g.planes(), c.fixup_group), 2 * target);
  }
  return c;
}

inline LaunchConfigView fmp_forward_view(const FmpForwardConfig& c) {
  LaunchConfigView v;
  switch (c.kind) {
    case FmpForwardKernel::kSegments: v.kind = "window_max_segments"; break;
    case FmpForwardKernel::kResidentWaves: v.kind = "window_max_resident"; break;
    case FmpForwardKernel::kBands: v.kind = "band_window_max"; break;
  }
  v.params = {{"index32", c.index32},
              {"k", c.k},
              {"table", c.table},
              {"threads", c.threads},
              {"cells_per_thread", c.cells_per_thread}};
  if (c.kind == FmpForwardKernel::kBands) {
    v.params.insert(v.params.end(), {{"band_rows", c.band_rows}, {"band_in_rows", c.band_in_rows}, {"bands", c.bands}});
  }
  v.params.insert(v.params.end(), {{"smem", c.smem}, {"items", c.items}});
  if (c.kind == FmpForwardKernel::kResidentWaves) {
    v.params.emplace_back("waves", kFmpForwardWaves);
  } else {
    v.params.emplace_back("blocks", c.blocks);
  }
  return v;
}

inline LaunchConfigView fmp_backward_view(const FmpBackwardConfig& c) {
  LaunchConfigView v;
  v.workspace_bytes = c.workspace_bytes;
  v.params = {{"index32", c.index32}, {"threads", c.threads}, {"blocks", c.blocks}};
  if (c.kind == FmpBackwardKernel::kOwnedBoxes) {
    v.kind = "owned_boxes";
    v.params.insert(v.params.end(), {{"block_cells", c.block_cells},
                                     {"stride_t", c.stride[0]},
                                     {"stride_h", c.stride[1]},
                                     {"stride_w", c.stride[2]}});
  } else {
    v.kind = c.kind == FmpBackwardKernel::kTileStores ? "tile_stores" : "tile_counts";
    v.params.insert(v.params.end(), {{"tile_t", c.tile[0]},
                                     {"tile_h", c.tile[1]},
                                     {"tile_w", c.tile[2]},
                                     {"tiles", c.tiles},
                                     {"box_cells", c.box_cells},
                                     {"whole_rows", c.whole_rows},
                                     {"smem", c.smem_bytes}});
  }
  v.params.insert(v.params.end(), {{"fixup_group", c.fixup_group}, {"fixup_blocks", c.fixup_blocks}});
  return v;
}

// problem = [dims, input ndim, *input_shape, *kernel_size, *output_size]
inline LaunchConfigView fmp_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype, const DeviceFacts& f) {
  return fmp_forward_view(fmp_forward_config(fmp_geometry_of_problem(false, problem), dtype, f));
}

inline LaunchConfigView fmp_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                 const DeviceFacts& f) {
  return fmp_backward_view(fmp_backward_config(fmp_geometry_of_problem(true, problem), dtype, f));
}

}  // namespace baracuda
