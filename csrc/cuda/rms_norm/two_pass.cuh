// rms_norm, rows too long for registers: the two-pass kernels.
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Rows too long for the register kernels: one CTA per row (grid-stride), two
// passes over the row. Forward: ss = sum x^2, then y = x * rstd * w (x read
// twice). Backward: s = sum dy * w * x, then dx as above; this CTA's dW partial
// row (partials[blockIdx.x]) is set by its first row and added to by the next,
// each column owned by one thread.

template <typename T, typename W, typename AccT, int V>
__global__ void __launch_bounds__(kLoopedThreads)
    rms_norm_fwd_looped_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                               AccT* __restrict__ rstd, int64_t M, int64_t N, AccT eps) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t nv = N / V;
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * N;
    AccT ss = 0;
    for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
      const auto v = cuda::load_vec<T, V>(xr + q * V);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const AccT a = static_cast<AccT>(v.v[i]);
        ss += a * a;
      }
    }
    ss = cuda::block_sum(ss, scratch);
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
      const auto v = cuda::load_vec<T, V>(xr + q * V);
      AccT wv[V];
      load_weight<AccT, W, V>(w, q * V, wv);
      cuda::Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(static_cast<AccT>(v.v[i]) * r * wv[i]);
      cuda::store_vec<T, V>(y + row * N + q * V, out);
    }
  }
}

template <typename T, typename W, typename AccT, int V>
__global__ void __launch_bounds__(kLoopedThreads)
    rms_norm_bwd_looped_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                               const W* __restrict__ w, T* __restrict__ dx, AccT* __restrict__ partials, int64_t M,
                               int64_t N) {
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t nv = N / V;
  AccT* part = partials != nullptr ? partials + int64_t(blockIdx.x) * N : nullptr;
  bool first = true;
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x, first = false) {
    const T* xr = x + row * N;
    const T* gr = dy + row * N;
    const AccT r = rstd[row];
    AccT s = 0;
    for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
      const auto xv = cuda::load_vec<T, V>(xr + q * V);
      const auto gv = cuda::load_vec<T, V>(gr + q * V);
      AccT wv[V];
      load_weight<AccT, W, V>(w, q * V, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) s += static_cast<AccT>(gv.v[i]) * wv[i] * static_cast<AccT>(xv.v[i]);
    }
    s = cuda::block_sum(s, scratch);
    const AccT k = r * r * r * s / static_cast<AccT>(N);
    for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
      const auto xv = cuda::load_vec<T, V>(xr + q * V);
      const auto gv = cuda::load_vec<T, V>(gr + q * V);
      if (dx != nullptr) {
        AccT wv[V];
        load_weight<AccT, W, V>(w, q * V, wv);
        cuda::Vec<T, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          out.v[i] = static_cast<T>(r * static_cast<AccT>(gv.v[i]) * wv[i] - static_cast<AccT>(xv.v[i]) * k);
        }
        cuda::store_vec<T, V>(dx + row * N + q * V, out);
      }
      if (part != nullptr) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const AccT d = static_cast<AccT>(gv.v[i]) * static_cast<AccT>(xv.v[i]) * r;
          part[q * V + i] = first ? d : part[q * V + i] + d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace baracuda
