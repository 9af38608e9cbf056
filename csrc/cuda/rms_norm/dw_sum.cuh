// rms_norm backward: the ordered sum of the dW partial rows.
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// dw[c] = sum_{p = 0 .. P-1} partials[p][c]: thread (c, s) adds p = s, s + S, ...
// in order, then the S slice sums are added in slice order. Deterministic.
// Launched early (cuda::LaunchShape): its CTAs start while the backward kernel
// that writes the partials still runs, and wait here for it to end.
template <typename AccT, typename W>
__global__ void __launch_bounds__(kReduceCols* kReduceSlices)
    rms_norm_dw_sum_kernel(const AccT* __restrict__ partials, W* __restrict__ dw, int64_t P, int64_t N) {
  cuda::wait_for_previous_grid();
  __shared__ AccT part[kReduceSlices][kReduceCols];
  const int64_t col = int64_t(blockIdx.x) * kReduceCols + threadIdx.x;
  AccT s = 0;
  if (col < N) {
    for (int64_t p = threadIdx.y; p < P; p += kReduceSlices) s += partials[p * N + col];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    AccT t = 0;
#pragma unroll
    for (int k = 0; k < kReduceSlices; ++k) t += part[k][threadIdx.x];
    dw[col] = static_cast<W>(t);
  }
}

}  // namespace
}  // namespace baracuda
