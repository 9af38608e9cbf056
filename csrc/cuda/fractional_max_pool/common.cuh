// fractional_max_pool family (2d and 3d), CUDA kernels: what the files of this folder
// share. forward.cu (the window maxima), backward.cu (the launchers of the backward:
// backward_tiles.cuh, backward_boxes.cuh, then stray_fixup.cuh).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/fractional_max_pool.h"
#include "baracuda/fractional_max_pool_policy.h"

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

}  // namespace
}  // namespace baracuda
