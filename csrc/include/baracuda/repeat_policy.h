// repeat family, CUDA launch policy (baracuda/launch_policy.h): a pure function of
// the collapsed tiling (baracuda/repeat.h), the dtype and the device's facts,
// shared by the launchers (csrc/cuda/repeat.cu) and the Plan API. Plain C++:
// compiled into CPU-only builds too, so CI runs it with recorded facts.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "baracuda/launch_policy.h"
#include "baracuda/repeat.h"

namespace baracuda {

constexpr int kRepeatThreads = 256;
constexpr int kRepeatTileLanes = 8;  // backward: warps of a block that share one vector range, splitting its tiles

enum class RepeatKernel {
  kGather,     // forward: each output word finds its source (one store a thread, in output order)
  kBroadcast,  // forward: each input word is read once and stored into every tile of its split
  kTileSum,    // backward: each input vector sums its tiles in order (+ the ordered combine of splits)
};

struct RepeatLaunchConfig {
  RepeatKernel kind = RepeatKernel::kBroadcast;
  int vec_bytes = 16;           // bytes per access: 16, 8 or 4, the widest dividing the innermost input run, else the element
  bool index32 = true;          // 32-bit index math (fast division) when the output has < 2^31 elements
  int threads = kRepeatThreads;
  int64_t blocks = 0;           // grid.x
  int64_t splits = 1;           // grid.y: tile ranges; the backward sums them in a second, ordered pass
  int64_t tiles_per_split = 1;
  int tile_lanes = 1;           // backward: warps per block splitting one vector range's tiles
  int unroll = 4;               // backward: tile loads in flight per thread (1, 2 or 4: enough for its tiles)
  bool one_step = false;        // backward: every thread's tiles (<= 4, no tile lanes) load in one step
  bool evict_first_dx = true;   // backward: dx stored evict-first (st.global.cs), unless it fits a third of L2
  int64_t combine_blocks = 0;   // backward with splits: blocks of the ordered combine
  int64_t workspace_bytes = 0;  // backward with splits: an acc_t partial per split and input element
};

namespace repeat_policy {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Forward rows narrower than this take the gather (a broadcast warp would scatter its stores).
constexpr int64_t kBroadcastRowBytes = 128;
// Forward outputs past L2 with at least this many tiles take the gather.
constexpr int64_t kGatherTilesPastL2 = 16;

inline int64_t threads_for_two_waves(const DeviceFacts& f) { return 2 * int64_t(f.num_sms) * f.max_threads_per_sm; }
// The backward's tile-lane sums: half the threads an SM holds, one wave. Each thread
// then sums a longer run of tiles (bias [4096] x (8192, 1): 32 tiles rather than 8
// per bf16 thread, 33 splits rather than 128) and fewer partials are written.
inline int64_t threads_for_half_wave(const DeviceFacts& f) { return int64_t(f.num_sms) * f.max_threads_per_sm / 2; }

inline RepeatLaunchConfig common(const TiledLayout& t, int64_t elem_bytes) {
  RepeatLaunchConfig c;
  const int64_t s_last = t.size[t.ndim - 1];
  c.vec_bytes = static_cast<int>(elem_bytes);
  for (const int bytes : {16, 8, 4}) {
    if (bytes > elem_bytes && (s_last * elem_bytes) % bytes == 0) {
      c.vec_bytes = bytes;
      break;
    }
  }
  c.index32 = t.output_numel() < (int64_t(1) << 31);
  c.tiles_per_split = std::max<int64_t>(t.tiles(), 1);
  return c;
}

// Split the tiles when the vectors alone cannot fill `want` threads.
inline void choose_splits(RepeatLaunchConfig& c, int64_t threads_per_split, int64_t tiles, int64_t min_tiles_per_split,
                          int64_t want) {
  if (tiles == 0 || threads_per_split == 0 || 2 * threads_per_split >= want) return;
  int64_t splits = ceil_div(want, threads_per_split);
  splits = std::clamp<int64_t>(std::min(splits, tiles / min_tiles_per_split), 1, 65535);
  c.tiles_per_split = ceil_div(tiles, splits);
  c.splits = ceil_div(tiles, c.tiles_per_split);
}

}  // namespace repeat_policy

// Forward: rows of at least 128 bytes are broadcast (each input vector is read
// once and stored into every tile: coalesced stores, the input read once);
// narrower rows are gathered (each output vector finds its source: coalesced
// stores where a broadcast warp would scatter). So are outputs of 16 tiles or
// more that pass L2: the stores, which bound them, go one a thread in output
// order (as Inductor's kernel), the input read from L2 after its first tile.
// Outputs that fit L2, and 4 tiles or fewer, keep the broadcast, faster there (with
// few tiles the gather reads an input past L2 from DRAM once per tile).
inline RepeatLaunchConfig repeat_forward_config(const TiledLayout& t, c10::ScalarType dtype, const DeviceFacts& f) {
  using namespace repeat_policy;
  const int64_t elem_bytes = c10::elementSize(dtype);
  RepeatLaunchConfig c = common(t, elem_bytes);
  const bool many_tiles_past_l2 = t.tiles() >= kGatherTilesPastL2 && t.output_numel() * elem_bytes > f.l2_bytes;
  if (t.size[t.ndim - 1] * elem_bytes < kBroadcastRowBytes || many_tiles_past_l2) {
    c.kind = RepeatKernel::kGather;
    const int64_t output_words = t.output_numel() * elem_bytes / c.vec_bytes;
    c.blocks = std::min<int64_t>(ceil_div(output_words, c.threads), std::numeric_limits<int32_t>::max());
    return c;
  }
  c.kind = RepeatKernel::kBroadcast;
  const int64_t input_words = t.input_numel() * elem_bytes / c.vec_bytes;
  choose_splits(c, t.input_numel() / (c.vec_bytes / elem_bytes), t.tiles(), 1, threads_for_two_waves(f));
  c.blocks = ceil_div(input_words, c.threads);
  return c;
}

inline RepeatLaunchConfig repeat_backward_config(const TiledLayout& t, c10::ScalarType dtype, const DeviceFacts& f) {
  using namespace repeat_policy;
  const int64_t elem_bytes = c10::elementSize(dtype);
  RepeatLaunchConfig c = common(t, elem_bytes);
  c.kind = RepeatKernel::kTileSum;
  const int64_t vectors = t.input_numel() / (c.vec_bytes / elem_bytes);
  // Few vectors and many tiles (a bias-like sum): 8 warps share each vector range.
  // Only then are the tiles split further (partials + ordered combine): with few
  // tiles per vector the extra partial traffic costs more than the parallelism gains.
  c.tile_lanes = (2 * vectors < threads_for_two_waves(f) && t.tiles() >= 8 * kRepeatTileLanes) ? kRepeatTileLanes : 1;
  if (c.tile_lanes > 1) choose_splits(c, vectors * c.tile_lanes, t.tiles(), 8 * c.tile_lanes, threads_for_half_wave(f));
  const int64_t per_lane = ceil_div(c.tiles_per_split, c.tile_lanes);
  c.unroll = per_lane <= 1 ? 1 : (per_lane <= 2 ? 2 : 4);
  // A thread whose tiles all load in one step takes their offsets from the host (no
  // odometer between its loads) and 8-byte vectors instead of 16, twice the threads
  // each half as wide, as Inductor's kernel for the same sum. With more tiles a thread
  // loops over them, and there 16-byte vectors are faster, as with the tile lanes.
  c.one_step = c.tile_lanes == 1 && per_lane <= 4;
  if (c.one_step && c.vec_bytes == 16) c.vec_bytes = 8;
  // A dx within a third of L2 is stored plainly and stays there for its reader (the
  // grad lines, loaded evict-first, leave first). Larger ones stream out (evict-first),
  // faster for them.
  c.evict_first_dx = 3 * t.input_numel() * elem_bytes > f.l2_bytes;
  const int64_t num_vectors = t.input_numel() / (c.vec_bytes / elem_bytes);
  c.blocks = ceil_div(num_vectors, c.threads / c.tile_lanes);
  const bool empty = t.input_numel() == 0 || t.tiles() == 0;
  if (c.splits > 1 && !empty) {
    const int64_t acc_bytes = dtype == c10::ScalarType::Double ? 8 : 4;
    c.combine_blocks = ceil_div(t.input_numel(), c.threads / kRepeatTileLanes);
    c.workspace_bytes = c.splits * t.input_numel() * acc_bytes;
  }
  return c;
}

// problem = [input dims, *input_shape, *repeats]
inline TiledLayout repeat_layout_of_problem(const char* op, c10::IntArrayRef problem) {
  BARACUDA_CHECK_VALUE(!problem.empty() && problem[0] >= 0 && int64_t(problem.size()) >= 1 + problem[0], op,
                       ": malformed problem ", shape_str(problem));
  const auto input_shape = problem.slice(1, problem[0]);
  const auto repeats = problem.slice(1 + problem[0]);
  repeat_output_shape(op, input_shape, repeats);
  return collapse_tiling(op, input_shape, repeats);
}

inline LaunchConfigView repeat_view(const RepeatLaunchConfig& c) {
  LaunchConfigView v;
  v.workspace_bytes = c.workspace_bytes;
  v.params = {{"vec_bytes", c.vec_bytes}, {"index32", c.index32}, {"threads", c.threads}, {"blocks", c.blocks}};
  switch (c.kind) {
    case RepeatKernel::kGather:
      v.kind = "tile_gather";
      break;
    case RepeatKernel::kBroadcast:
      v.kind = "tile_broadcast";
      v.params.insert(v.params.end(), {{"splits", c.splits}, {"tiles_per_split", c.tiles_per_split}});
      break;
    case RepeatKernel::kTileSum:
      v.kind = "tile_sum";
      v.params.insert(v.params.end(), {{"splits", c.splits},
                                       {"tiles_per_split", c.tiles_per_split},
                                       {"tile_lanes", c.tile_lanes},
                                       {"unroll", c.unroll},
                                       {"one_step", c.one_step},
                                       {"evict_first_dx", c.evict_first_dx},
                                       {"combine_blocks", c.combine_blocks}});
      break;
  }
  return v;
}

inline LaunchConfigView repeat_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype, const DeviceFacts& f) {
  return repeat_view(repeat_forward_config(repeat_layout_of_problem(kRepeatOp, problem), dtype, f));
}

inline LaunchConfigView repeat_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                    const DeviceFacts& f) {
  return repeat_view(repeat_backward_config(repeat_layout_of_problem(kRepeatBackwardOp, problem), dtype, f));
}

}  // namespace baracuda
