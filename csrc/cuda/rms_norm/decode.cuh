// rms_norm, decode rows: the loads the forward and backward decode kernels share.
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Decode kernels: a thread's weight vector w[col .. col + V) as loaded, 16-byte
// chunks of raw bits, its elements converted to AccT where they are used (as x's
// and dy's), so that no conversion waits for a weight load before the next
// vector's loads are issued (unpacking a bf16 weight early would hold them back).
template <typename W, int V>
struct RawWeight {
  static constexpr int kChunk = sizeof(W) * V > 16 ? static_cast<int>(16 / sizeof(W)) : V;
  cuda::RawVec<W, kChunk> chunk[V / kChunk];

  template <typename AccT>
  __device__ __forceinline__ AccT at(int i) const {
    return cuda::raw_elem<AccT, W, kChunk>(chunk[i / kChunk], i % kChunk);
  }

  // A chunk of W(1)s: the weight where there is none.
  static __device__ __forceinline__ cuda::RawVec<W, kChunk> ones_chunk() {
    cuda::Vec<W, kChunk> one;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) one.v[i] = W(1);
    cuda::RawVec<W, kChunk> raw;
    memcpy(&raw, &one, sizeof(raw));
    return raw;
  }
};

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
