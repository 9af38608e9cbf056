// rms_norm backward, decode rows and their dW by columns.
#pragma once

#include "common.cuh"
#include "decode.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// dW of decode rows by columns (dw_by_columns), in the CTAs after the M row CTAs:
// CTA c takes kDwColumnVectors = 32 column vectors, lane = vector; warp s of S adds
// rows s, s + S, ... in order, then warp 0 adds the S sums in order (shared memory):
//   dW_i = W(sum_s sum_{r = s mod S} dy_ri * x_ri * rstd_r)
// It needs no row's result, so it runs beside the rows: one launch, no partials.
template <typename T, typename W, typename AccT, int V>
__device__ __forceinline__ void decode_dw_columns(const T* __restrict__ dy, const T* __restrict__ x,
                                                  const AccT* __restrict__ rstd, W* __restrict__ dw, int M, int N) {
  extern __shared__ __align__(16) unsigned char rms_smem[];
  AccT* sums = reinterpret_cast<AccT*>(rms_smem);  // [S][V][32]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int q = (blockIdx.x - M) * kDwColumnVectors + lane;
  const bool live = q < N / V;
  AccT acc[V] = {};
  if (live) {
#pragma unroll 4
    for (int r = warp; r < M; r += warps) {
      const auto xr = cuda::load_raw<T, V>(x + int64_t(r) * N + int64_t(q) * V);
      const auto gr = cuda::load_raw<T, V>(dy + int64_t(r) * N + int64_t(q) * V);
      const AccT rs = rstd[r];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        acc[i] += cuda::raw_elem<AccT, T, V>(gr, i) * cuda::raw_elem<AccT, T, V>(xr, i) * rs;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) sums[(warp * V + i) * 32 + lane] = acc[i];
  __syncthreads();
  if (warp != 0 || !live) return;
  AccT t[V] = {};
  for (int slice = 0; slice < warps; ++slice) {
#pragma unroll
    for (int i = 0; i < V; ++i) t[i] += sums[(slice * V + i) * 32 + lane];
  }
  store_dw_slice<W, V>(dw, int64_t(q) * V, t);
}

// Backward of decode rows (no more rows than SMs): CTA b < M holds row b, Vpt
// vectors of V elements per thread (vector q = j * blockDim.x + threadIdx.x), x,
// dy and w in registers from one round of loads:
//   s = sum_i dy_i * w_i * x_i (this thread's terms by tree_sum, then block_sum_once)
//   dx_i = T(rstd * dy_i * w_i - x_i * rstd^3 * s * (1 / N))
//   dW_i = W(dy_i * x_i * rstd), written by the row's CTA when the grid has no
//   column CTAs (a single row of at most 8 KB of dW), else by them (decode_dw_columns).
// Latency-bound: one launch, no row loop or layout, w kept from the sum for dx.

template <typename T, typename W, typename AccT, int V, int Vpt>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_bwd_decode_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                               const W* __restrict__ w, T* __restrict__ dx, W* __restrict__ dw, int M, int N,
                               AccT inv_n) {
  if (int(blockIdx.x) >= M) return decode_dw_columns<T, W, AccT, V>(dy, x, rstd, dw, M, N);
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int nv = N / V;
  const int64_t row = blockIdx.x;
  // A coherent load: ptxas moved the read-only (.nc) load of rstd, first used
  // after the block sum, past its barrier, onto the critical path.
  const AccT r = __ldcg(rstd + row);
  cuda::RawVec<T, V> xv[Vpt] = {}, gv[Vpt] = {};
  RawWeight<W, V> wv[Vpt] = {};
  load_decode_row<T, W, V, Vpt, true>(x, dy, w, row, N, xv, gv, wv);
  const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
  const auto g_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(gv[j], i); };
  AccT terms[Vpt * V];  // vectors past the row's end are zeros
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) terms[j * V + i] = g_at(j, i) * wv[j].template at<AccT>(i) * x_at(j, i);
  }
  const AccT s = cuda::block_sum_once(cuda::tree_sum<Vpt * V>(terms), scratch);
  const AccT k = r * r * r * s * inv_n;
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * blockDim.x + threadIdx.x;
    if (q >= nv) continue;
    if (dx != nullptr) {
      cuda::Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        out.v[i] = static_cast<T>(r * g_at(j, i) * wv[j].template at<AccT>(i) - x_at(j, i) * k);
      }
      cuda::store_vec<T, V>(dx + row * N + int64_t(q) * V, out);
    }
    if (dw != nullptr && int(gridDim.x) == M) {  // no column CTAs: a single row's dW
      AccT t[V];
#pragma unroll
      for (int i = 0; i < V; ++i) t[i] = g_at(j, i) * x_at(j, i) * r;
      store_dw_slice<W, V>(dw, int64_t(q) * V, t);
    }
  }
}

}  // namespace
}  // namespace baracuda
