// Rows of the rms_norm family on CUDA (rms_norm and rms_norm_fused): a row's
// vectors loaded and stored in 16-byte pieces, weights held as loaded, the sum of
// squares of a thread's vectors, the fixed-order sum over the threads of a row, and
// the ordered sum of the backward's dW partial rows.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "baracuda/cuda_utils.cuh"
#include "baracuda/rms_norm_policy.h"

namespace baracuda {

template <typename AccT>
__device__ __forceinline__ AccT rsqrt_acc(AccT v) {
  if constexpr (std::is_same_v<AccT, float>) {
    return rsqrtf(v);
  } else {
    return rsqrt(v);
  }
}

// w[col .. col + V) as AccT, in 16-byte loads where the width allows.
template <typename AccT, typename W, int V>
__device__ __forceinline__ void load_weight(const W* __restrict__ w, int64_t col, AccT (&out)[V]) {
  if (w == nullptr) {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = AccT(1);
    return;
  }
  constexpr int kChunk = sizeof(W) * V > 16 ? static_cast<int>(16 / sizeof(W)) : V;
#pragma unroll
  for (int c = 0; c < V / kChunk; ++c) {
    const auto v = cuda::load_vec<W, kChunk>(w + col + c * kChunk);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out[c * kChunk + i] = static_cast<AccT>(v.v[i]);
  }
}

// Rows in registers or staged (a row's vectors over `group` threads of a CTA times
// `cluster` CTAs; thread u of the row holds vectors q = j * row_threads + u): where this
// thread sits, its row within the CTA's rows, its index u among the row's threads, and
// the first row group / stride of the grid-stride loop (row groups: CTAs, or clusters).
struct RowLayout {
  int g;             // row within the CTA
  int u;             // thread index within the row (0 .. row_threads)
  int row_threads;   // group * cluster
  int rank;          // CTA rank within its cluster
  int rows_per_cta;  // blockDim.x / group
  int64_t first;     // first row of this CTA's row group
  int64_t step;      // rows between two iterations

  __device__ RowLayout(int group, int cluster) {
    rows_per_cta = blockDim.x / group;
    g = threadIdx.x / group;
    rank = blockIdx.x % cluster;
    u = rank * group + threadIdx.x % group;
    row_threads = group * cluster;
    first = int64_t(blockIdx.x / cluster) * rows_per_cta;
    step = int64_t(gridDim.x / cluster) * rows_per_cta;
  }
};

// A thread's weight vector w[col .. col + V) as loaded: 16-byte chunks of raw bits, its
// elements converted to AccT where they are used (as x's and dy's), so that no
// conversion waits for a weight load before the next vector's loads are issued
// (unpacking a bf16 weight early would hold them back).
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

  // Vector q of w (ones without a weight, or past the row's nv vectors).
  static __device__ __forceinline__ RawWeight load(const W* __restrict__ w, int q, int nv) {
    RawWeight out;
#pragma unroll
    for (int c = 0; c < V / kChunk; ++c) {
      out.chunk[c] = w == nullptr || q >= nv ? ones_chunk() : cuda::load_raw<W, kChunk>(w + int64_t(q) * V + c * kChunk);
    }
    return out;
  }
};

// p[0 .. V) as raw words (cuda::RawVec), in 16-byte loads where the width allows
// (p aligned to the load: 16 bytes, or sizeof(X) * V when that is less).
template <typename X, int V>
__device__ __forceinline__ cuda::RawVec<X, V> load_row_raw(const X* __restrict__ p) {
  constexpr int kChunk = sizeof(X) * V > 16 ? static_cast<int>(16 / sizeof(X)) : V;
  if constexpr (kChunk == V) {
    return cuda::load_raw<X, V>(p);
  } else {
    cuda::RawVec<X, V> raw;
#pragma unroll
    for (int c = 0; c < V / kChunk; ++c) {
      const auto part = cuda::load_raw<X, kChunk>(p + c * kChunk);
      memcpy(reinterpret_cast<char*>(&raw) + c * sizeof(part), &part, sizeof(part));
    }
    return raw;
  }
}

// out[0 .. V) = v as W, in 16-byte stores where the width allows (out aligned to
// the store: 16 bytes, or sizeof(W) * V when that is less).
template <typename W, int V, typename AccT>
__device__ __forceinline__ void store_row_slice(W* __restrict__ out, const AccT (&v)[V]) {
  constexpr int kChunk = sizeof(W) * V > 16 ? static_cast<int>(16 / sizeof(W)) : V;
#pragma unroll
  for (int c = 0; c < V / kChunk; ++c) {
    cuda::Vec<W, kChunk> chunk;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) chunk.v[i] = static_cast<W>(v[c * kChunk + i]);
    cuda::store_vec<W, kChunk>(out + c * kChunk, chunk);
  }
}

// dW[col .. col + V) = v as W: vector stores where dW is 16-byte aligned, else one
// element at a time (an out-variant's grad_weight may start anywhere).
template <typename W, int V, typename AccT>
__device__ __forceinline__ void store_dw_slice(W* __restrict__ dw, int64_t col, const AccT (&v)[V]) {
  if (reinterpret_cast<uintptr_t>(dw) % 16 == 0) return store_row_slice<W, V>(dw + col, v);
#pragma unroll
  for (int i = 0; i < V; ++i) dw[col + i] = static_cast<W>(v[i]);
}

// Sum of x^2 over this thread's vectors (in order, element by element), in AccT.
template <typename AccT, typename T, int V, int Vpt>
__device__ __forceinline__ AccT sum_of_squares(const cuda::RawVec<T, V> (&xv)[Vpt]) {
  AccT ss = 0;
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const AccT a = cuda::raw_elem<AccT, T, V>(xv[j], i);
      ss += a * a;
    }
  }
  return ss;
}

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // clusters are only chosen on sm_90 and newer
#endif
}

// Waits at the cluster barrier (this CTA has arrived, its value in slots[parity]), then
// folds the cluster's CTAs' slots[parity] into init with op, in rank order: the same
// bits in every CTA of the cluster.
template <typename AccT, typename Op>
__device__ __forceinline__ AccT cluster_slots_fold(AccT* slots, int parity, int cluster, AccT init, Op&& op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  cl.barrier_wait();
  for (int rank = 0; rank < cluster; ++rank) init = op(init, *cl.map_shared_rank(slots + parity, rank));
  return init;
#else
  __trap();  // clusters are only chosen on sm_90 and newer
  return init;
#endif
}

// A value folded over the CTAs of a cluster that holds one row (a kernel whose CTAs fold
// once per barrier: one row a CTA), pushed rather than pulled: each CTA stores its value
// into slot [its rank] of every CTA of the cluster (st.async, completing on that CTA's
// mbarrier) and waits on its own barrier for the cluster's values, which it folds in rank
// order, the same bits in every CTA. No cluster barrier a row, and none before a CTA
// exits: a CTA leaves once every value sent to it has landed, and none reads another's
// shared memory. Shared: slots (one per rank, up to the device's max_cluster) and the
// barrier, this CTA's.
template <typename AccT>
struct ClusterPushFold {
  AccT* slots;
  uint64_t* bar;
  int cluster;

  // Thread 0, before the cluster barrier that publishes it (announce, then
  // cuda::cluster_wait before the first fold): the barrier, for one arrival.
  __device__ void init() const {
    cuda::mbarrier_init(bar, 1);
    cuda::fence_barrier_init();
  }

  // Every thread, with the same v: the fold of the cluster's values into init by op.
  template <typename Op>
  __device__ __forceinline__ AccT fold(AccT v, AccT init, Op&& op) const {
    if (threadIdx.x == 0) cuda::mbarrier_expect_bytes(bar, uint32_t(cluster) * sizeof(AccT));
    if (threadIdx.x < cluster) cuda::store_remote_async(v, slots + blockIdx.x % cluster, bar, threadIdx.x);
    cuda::mbarrier_wait(bar, 0);
    for (int rank = 0; rank < cluster; ++rank) init = op(init, slots[rank]);
    return init;
  }

  // Announces init() to the cluster (every thread; relaxed: fence_barrier_init orders it).
  static __device__ void announce() { cuda::cluster_arrive_relaxed(); }
};

// Fetches into L2 the part of a row (`row_start`, nv vectors of V elements) that one
// CTA of the row holds: its vectors q = j * row_threads + first + t (t < group, j <
// Vpt), each of the Vpt runs of `group` consecutive vectors one bulk prefetch.
// Called by one thread for the CTA's next row while the CTA works on this one, so
// that row's loads find it in L2. Bulk prefetches take 16-byte aligned runs: a
// stream whose vectors are not a multiple of 16 bytes is not fetched.
template <int Vpt, int V, typename T>
__device__ __forceinline__ void prefetch_row_part_l2(const T* row_start, int nv, int row_threads, int first,
                                                     int group) {
  constexpr int kVecBytes = V * static_cast<int>(sizeof(T));
  if constexpr (kVecBytes % 16 == 0) {
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * row_threads + first;
      if (q < nv) cuda::bulk_prefetch_l2(row_start + int64_t(q) * V, min(group, nv - q) * kVecBytes);
    }
  }
}

// Sum of v over the threads of one row, identical (bit for bit) in all of them:
// the `group` lanes of a sub-warp (fixed xor butterfly), or the whole CTA
// (cuda::block_sum), then the `cluster` CTAs of the row, whose sums are read
// from distributed shared memory in rank order. `slots` alternates between two
// entries from row to row (parity), so a CTA never overwrites a slot another CTA
// may still be reading: that read precedes the next row's cluster barrier.
// while_waiting() runs between arriving at that barrier and waiting there (work
// that needs no sum); without a cluster, once the sum is known. kSumsOnce: a kernel that
// sums one row once (cluster 1) skips the barrier after the block sum (cuda::block_sum_once).
template <bool kSumsOnce = false, typename AccT, typename Fn>
__device__ __forceinline__ AccT row_sum(AccT v, int group, int cluster, cuda::BlockSumScratch<AccT>& scratch,
                                        AccT* slots, int parity, Fn&& while_waiting) {
  if (group <= 32 && cluster == 1) {  // sub-warp rows (a 32-thread CTA of a cluster goes on below)
    for (int offset = group / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    while_waiting();
    return v;
  }
  v = kSumsOnce ? cuda::block_sum_once(v, scratch) : cuda::block_sum(v, scratch);
  if (cluster == 1) {
    while_waiting();
    return v;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) slots[parity] = v;
  cooperative_groups::this_cluster().barrier_arrive();
#endif
  while_waiting();
  return cluster_slots_fold(slots, parity, cluster, AccT(0), [](AccT a, AccT b) { return a + b; });
}

// A backward CTA's dW sums folded over its launch cluster of `fold` CTAs before they
// are written (rows of one CTA, streamed): the CTA puts thread t's sums at their columns
// in `sums` (its shared memory, N AccT; vectors q = j * row_threads + u, as the rows map
// them), the cluster syncs, and CTA rank k adds columns c = k * blockDim.x + t, c +
// fold * blockDim.x, ... over the cluster's CTAs in rank order into partial row
// blockIdx.x / fold. One partial row a cluster instead of one a CTA: the dW sum reads
// fold times fewer (at [65536, 2048] bf16, 8 CTAs an SM: 132 rows for 1056). The
// caller's rows must be done with `sums` (a barrier precedes the stores) and the
// caller syncs the cluster again before its CTAs exit, as the other CTAs read `sums`.
template <int Vpt, int V, typename AccT, typename SumAt>
__device__ __forceinline__ void fold_dw_in_cluster(AccT* sums, int nv, int64_t N, int fold, int row_threads, int u,
                                                   AccT* __restrict__ partials, SumAt&& sum_at) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __syncthreads();
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * row_threads + u;
    if (q >= nv) continue;
    AccT v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = sum_at(j * V + i);
    store_row_slice<AccT, V>(sums + int64_t(q) * V, v);
  }
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  cl.sync();
  AccT* out = partials + int64_t(blockIdx.x / fold) * N;
  const int64_t stride = int64_t(fold) * blockDim.x;
  for (int64_t c = int64_t(cl.block_rank()) * blockDim.x + threadIdx.x; c < N; c += stride) {
    AccT s = 0;
    for (int rank = 0; rank < fold; ++rank) s += *cl.map_shared_rank(sums + c, rank);
    out[c] = s;
  }
#else
  __trap();  // clusters: chosen only on sm_90 and newer
#endif
}

namespace {

// dw[c] = sum_{p = 0 .. P-1} partials[p][c] (C columns), by CTAs of rms_dw_sum_shape:
// thread (c, s) of blockDim (cols, kSlices) adds p = s, s + kSlices, ... in order, then
// the slice sums are added pairwise (slice s and s + half, halving). Deterministic: the
// order depends on P and C alone. The slices' stride is a compile-time constant, so the
// compiler keeps several of a thread's loads in flight (with a run-time stride it issued
// them one at a time, and the sum took longer than the rest of the backward's tail).
// Launched early (cuda::LaunchShape): its CTAs start while the backward kernel that
// writes the partials still runs, and wait here for it to end.
template <typename AccT, typename W, int kSlices>
__global__ void __launch_bounds__(rms::kReduceThreads)
    rms_dw_sum_kernel(const AccT* __restrict__ partials, W* __restrict__ dw, int64_t P, int64_t C) {
  cuda::wait_for_previous_grid();
  __shared__ AccT part[rms::kReduceThreads];
  const int cols = blockDim.x;
  const int64_t col = int64_t(blockIdx.x) * cols + threadIdx.x;
  AccT s = 0;
  if (col < C) {
    for (int64_t p = threadIdx.y; p < P; p += kSlices) s += partials[p * C + col];
  }
  AccT* const mine = part + threadIdx.y * cols + threadIdx.x;
  *mine = s;
#pragma unroll
  for (int half = kSlices / 2; half > 0; half /= 2) {
    __syncthreads();
    if (int(threadIdx.y) < half) *mine += mine[half * cols];
  }
  if (threadIdx.y == 0 && col < C) dw[col] = static_cast<W>(*mine);
}

// Launches rms_dw_sum_kernel early on the current stream.
template <typename AccT, typename W>
void launch_rms_dw_sum(const AccT* partials, W* dw, int64_t P, int64_t C) {
  const RmsDwSumShape shape = rms_dw_sum_shape(P, C);
  constexpr int kManySlices = rms::kReduceThreads / rms::kManyDwCols;
  const auto kernel = shape.slices == rms::kReduceSlices ? rms_dw_sum_kernel<AccT, W, rms::kReduceSlices>
                                                         : rms_dw_sum_kernel<AccT, W, kManySlices>;
  cuda::launch(kernel, {.grid = dim3(shape.ctas), .block = dim3(shape.cols, shape.slices), .early = true}, partials,
               dw, P, C);
}

}  // namespace

}  // namespace baracuda
