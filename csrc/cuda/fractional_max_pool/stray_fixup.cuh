// fractional_max_pool family, CUDA: the backward's stray fixup (the planes whose indices left their
// tile or box).
#pragma once

#include "backward_boxes.cuh"
#include "backward_tiles.cuh"
#include "common.cuh"

namespace baracuda {
namespace {

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

}  // namespace
}  // namespace baracuda
