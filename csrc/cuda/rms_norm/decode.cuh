// rms_norm, decode rows: the loads the forward and backward decode kernels share.
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// One 16-byte vector of a decode row: the forward's by the read-only path (the
// compiler's ld.global.nc), the backward's (kPlain) by a plain ld.global: each the
// faster form for its kernel.
template <bool kPlain, typename T, int N>
__device__ __forceinline__ cuda::RawVec<T, N> load_decode_vec(const T* p) {
  if constexpr (kPlain) {
    return cuda::load_raw_plain<T, N>(p);
  } else {
    return cuda::load_raw<T, N>(p);
  }
}

// A thread's vectors q = j * blockDim.x + threadIdx.x (j < Vpt) of row `row` of x,
// of dy (kDy: the backward, plain loads), and of w at the same columns (ones when
// w is null), every load issued before any is used; vectors past the row's end
// keep the caller's zeros.
template <typename T, typename W, int V, int Vpt, bool kDy>
__device__ __forceinline__ void load_decode_row(const T* __restrict__ x, const T* __restrict__ dy,
                                                const W* __restrict__ w, int64_t row, int N,
                                                cuda::RawVec<T, V> (&xv)[Vpt], cuda::RawVec<T, V> (&gv)[Vpt],
                                                RawWeight<W, V> (&wv)[Vpt]) {
  const auto ones = RawWeight<W, V>::ones_chunk();
  const int nv = N / V;
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * blockDim.x + threadIdx.x;
    if (q < nv) {
      xv[j] = load_decode_vec<kDy, T, V>(x + row * N + int64_t(q) * V);
      if constexpr (kDy) gv[j] = load_decode_vec<kDy, T, V>(dy + row * N + int64_t(q) * V);
#pragma unroll
      for (int c = 0; c < V / RawWeight<W, V>::kChunk; ++c) {
        const int64_t col = int64_t(q) * V + c * RawWeight<W, V>::kChunk;
        wv[j].chunk[c] = w != nullptr ? load_decode_vec<kDy, W, RawWeight<W, V>::kChunk>(w + col) : ones;
      }
    }
  }
}

}  // namespace
}  // namespace baracuda
