// rms_norm family, CUDA kernels.
//
// The input is [M, N] rows. A row is split over `row_threads = group * cluster`
// threads: `group` threads of one CTA (a sub-warp when several rows share a CTA,
// else the whole CTA), times `cluster` CTAs of a thread-block cluster (sm_90) for
// long rows. Thread u of a row holds vectors q = j * row_threads + u (j < Vpt) of
// V elements in registers, as raw 32-bit words (16-bit elements two to a register),
// so x (and dy) are read from memory exactly once; the row's sum is a fixed-order
// shuffle / block / cluster reduction. Vpt = kVpt = 4, except:
//   - decode rows (no more rows than SMs, latency-bound): kernels of their own
//     (rms_norm_fwd_decode_kernel, rms_norm_bwd_decode_kernel), a CTA a row;
//     forward at most 256 threads of 1 to 8 vectors (fwd_decode_max_vpt),
//     backward 1 or 2 vectors in up to 1024 threads; w loaded together with x
//     and kept as loaded (RawWeight) until used;
//   - the backward of a single row too long for that: Vpt = 1 over a cluster of 8;
//   - forward rows that need a cluster: Vpt = 2 * kVpt, half the cluster.
// Backward rows that need a cluster run two CTAs per SM (64 registers) and add
// their dW sums while they wait at the row's cluster barrier; with a float32 weight
// on a half input, one CTA per SM instead, x and dy staged in shared memory by
// bulk copies and consecutive rows overlapped (rms_norm_bwd_streamed_kernel). The
// register launches (not the cluster-spread ones) copy each thread's weight vectors
// into shared memory once and read them there (forward: once per row, backward:
// twice) instead of from L2, where they keep as many CTAs per SM: all of a
// thread's 16-byte vectors, and in the backward as many of its 32-byte ones (a
// float32 weight with a half input) as fit beside the dW slots (staged_weight,
// staged_weight_vectors).
// Rows longer than kVpt * 1024 * 8 vectors (forward; kVpt * 512 * 8 backward) use
// a two-pass kernel that reads x (and dy) twice.
//
// Bytes moved (e = element size, a = rstd size, w = weight bytes):
//   forward : M*N*e read + M*N*e written + M*a written (+ w, cached)
//   backward: 2*M*N*e read + M*a read + M*N*e written (+ w, cached)
//             + P*N*a dW partials written and read once by the ordered sum,
//             P ~ the number of row groups resident on the GPU at once
//             (P == 1, e.g. a single decode row: dW is written directly, one launch;
//             decode rows: no partials, x and dy read again by the dW column CTAs).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/rms_norm.h"
#include "baracuda/rms_norm_policy.h"
#include "baracuda/rms_rows.cuh"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

namespace cg = cooperative_groups;
using cuda::ceil_div;

using namespace rms;  // the policy's constants (baracuda/rms_norm_policy.h)

// ---------------------------------------------------------------------------
// Device helpers (the row helpers shared with rms_norm_fused: baracuda/rms_rows.cuh).

// Where this thread sits: its row within the CTA's rows, its index u among the
// row's threads, and the first row group / stride of the grid-stride loop.
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

// Vector j of this thread's staged weight (staged_weight's slots) as AccT.
template <typename AccT, typename W, int kChunkElems, int V>
__device__ __forceinline__ void read_staged_weight(const cuda::Vec<W, kChunkElems>* slots, int j, AccT (&wv)[V]) {
  constexpr int kChunks = V / kChunkElems;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const auto v = slots[(j * kChunks + c) * blockDim.x + threadIdx.x];
#pragma unroll
    for (int i = 0; i < kChunkElems; ++i) wv[c * kChunkElems + i] = static_cast<AccT>(v.v[i]);
  }
}

// A thread's dW sums, sum_at(k) for sum k = j * V + i (element i of its vector j),
// when they are its columns' whole sums over the CTA's rows (one row per CTA):
// to the CTA's partial row (the row group's; the workspace is 16-byte aligned,
// N a multiple of V), or to dW itself (dw_direct). Vector stores: one store per
// element, each lane's in another sector, cost microseconds at decode.
template <int Vpt, int V, typename AccT, typename W, typename SumAt>
__device__ __forceinline__ void store_thread_dw(const RowLayout& L, int cluster, int nv, int N,
                                                AccT* __restrict__ partials, W* __restrict__ dw_direct,
                                                SumAt&& sum_at) {
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * L.row_threads + L.u;
    if (q >= nv) continue;
    AccT sums[V];
#pragma unroll
    for (int i = 0; i < V; ++i) sums[i] = sum_at(j * V + i);
    if (dw_direct == nullptr) {
      store_row_slice<AccT, V>(partials + int64_t(blockIdx.x / cluster) * N + int64_t(q) * V, sums);
    } else {
      store_dw_slice<W, V>(dw_direct, int64_t(q) * V, sums);
    }
  }
}

// Whether a backward launch holds its last weight vector in registers (kHoldLast):
// rows of a cluster (two CTAs per SM) with 32-byte weight vectors. Shared by the
// kernel and staged_weight_vectors, which then stages at most Vpt - 1.
constexpr bool holds_last_weight(bool cluster_rows, int64_t w_vec_bytes) { return cluster_rows && w_vec_bytes == 32; }

// The weight of the register kernels' rows: weight_at(j, q, wv) sets wv to w[q * V
// .. q * V + V), this thread's vector j. A thread's columns are the same for every
// row it visits, so (not in the cluster-spread rows) it copies its first `staged`
// vectors once into `smem` and weight_at reads those there instead of from L2
// (staged_weight_vectors: all or none of 16-byte vectors; with kPartial, the
// backward, the most 32-byte ones that fit). Slots are 16-byte chunks, chunk c of
// vector j at (j * C + c) * blockDim.x + threadIdx.x (C chunks a vector): a warp's
// accesses are consecutive (no bank conflicts) and a thread reads only its own
// slots (no barrier needed). kHoldLast (the backward's cluster rows with 32-byte
// vectors): the last vector is held in registers for all rows (8 floats, which
// spares an L2 read per row after the cluster barrier) and at most Vpt - 1 are
// staged.
template <bool kSpreadRows, bool kPartial, bool kHoldLast, typename AccT, typename W, int V, int Vpt>
__device__ __forceinline__ auto staged_weight(const W* __restrict__ w, int staged, unsigned char* smem,
                                              const RowLayout& L, int nv) {
  constexpr bool kAllOrNone = sizeof(W) * V == 16;
  constexpr int kChunkElems = static_cast<int>(16 / sizeof(W));
  constexpr int kChunks = V / kChunkElems;
  using Chunk = cuda::Vec<W, kChunkElems>;
  Chunk* slots = nullptr;
  if constexpr (!kSpreadRows && (kAllOrNone || (kPartial && sizeof(W) * V == 32))) {
    if (staged > 0) {
      slots = reinterpret_cast<Chunk*>(smem);
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * L.row_threads + L.u;
        if ((kAllOrNone || j < staged) && !(kHoldLast && j == Vpt - 1) && q < nv) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            slots[(j * kChunks + c) * blockDim.x + threadIdx.x] =
                cuda::load_vec<W, kChunkElems>(w + int64_t(q) * V + c * kChunkElems);
          }
        }
      }
    }
  }
  // Separate closures: captured and unused, the count alone made the forward's
  // float32 kernel spill (8 bytes).
  if constexpr (kHoldLast) {
    static_assert(kPartial && !kSpreadRows && sizeof(W) * V == 32);
    AccT held[V] = {};
    const int q_last = (Vpt - 1) * L.row_threads + L.u;
    if (q_last < nv) load_weight<AccT, W, V>(w, int64_t(q_last) * V, held);
    return [w, slots, staged, held](int j, int q, AccT(&wv)[V]) {
      if (j == Vpt - 1) {
#pragma unroll
        for (int i = 0; i < V; ++i) wv[i] = held[i];
        return;
      }
      if (slots != nullptr && j < staged) return read_staged_weight<AccT>(slots, j, wv);
      load_weight<AccT, W, V>(w, int64_t(q) * V, wv);
    };
  } else if constexpr (kPartial) {
    return [w, slots, staged](int j, int q, AccT(&wv)[V]) {
      if (slots != nullptr && j < staged) return read_staged_weight<AccT>(slots, j, wv);
      load_weight<AccT, W, V>(w, int64_t(q) * V, wv);
    };
  } else {
    return [w, slots](int j, int q, AccT(&wv)[V]) {
      if (slots != nullptr) return read_staged_weight<AccT>(slots, j, wv);
      load_weight<AccT, W, V>(w, int64_t(q) * V, wv);
    };
  }
}

// ---------------------------------------------------------------------------
// Forward, row in registers:
//   ss = sum_i x_i^2 (acc_t, this thread's vectors in order, then row_sum)
//   rstd = 1 / sqrt(ss / N + eps);  y_i = T(x_i * rstd * w_i)
// x is read once (kept in registers between the two steps); rstd written by u == 0.
// kStreamRow: where the weight's vectors are 32 bytes (a float32 weight with a half
// input; not staged, read from L2 for every row), x is loaded and y stored with
// streaming hints (evict first), which keeps the weight in L2. With a staged weight
// the hints only slow the stores, so they are off there.
// stage_w: the thread's w vectors in shared memory (staged_weight).

template <typename T, typename W, typename AccT, int V, int Vpt>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                        AccT* __restrict__ rstd, int64_t M, int N, int group, int cluster, AccT eps, bool stage_w) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  __shared__ AccT slots[2];
  extern __shared__ __align__(16) unsigned char rms_smem[];
  const RowLayout L(group, cluster);
  const int nv = N / V;
  const auto weight_at = staged_weight<false, false, false, AccT, W, V, Vpt>(w, stage_w ? Vpt : 0, rms_smem, L, nv);
  constexpr bool kStreamRow = sizeof(W) * V == 32;
  int parity = 0;
  for (int64_t base = L.first; base < M; base += L.step, parity ^= 1) {
    const int64_t row = base + L.g;
    const bool live = row < M;
    cuda::RawVec<T, V> xv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (live && q < nv) {
        const T* from = x + row * N + int64_t(q) * V;
        xv[j] = kStreamRow ? cuda::load_raw_streaming<T, V>(from) : cuda::load_raw<T, V>(from);
      }
    }
    const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
    const AccT ss = row_sum(sum_of_squares<AccT, T, V>(xv), group, cluster, scratch, slots, parity, [] {});
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + eps);
    if (live && L.u == 0) rstd[row] = r;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (live && q < nv) {
        AccT wv[V];
        weight_at(j, q, wv);
        cuda::Vec<T, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(x_at(j, i) * r * wv[i]);
        if constexpr (kStreamRow) {
          cuda::store_vec_streaming<T, V>(y + row * N + int64_t(q) * V, out);
        } else {
          cuda::store_vec<T, V>(y + row * N + int64_t(q) * V, out);
        }
      }
    }
  }
  if (cluster > 1) cluster_sync();  // no CTA leaves while another still reads its slots
}

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

// Forward of decode rows (no more rows than SMs, a CTA each):
// CTA b holds row b, Vpt vectors of V elements per thread (vector q = j *
// blockDim.x + threadIdx.x), x and w in registers from one round of loads:
//   ss = sum_i x_i^2 (this thread's Vpt * V squares by tree_sum, then block_sum_once)
//   rstd = 1 / sqrt(ss * (1 / N) + eps);  y_i = T(x_i * rstd * w_i)
// The CTA's only block sum takes no barrier after it. Both decode kernels take
// 1 / N from the host (inv_n): a multiply where a division is a dozen
// instructions and a branch after the block sum (at most an ulp from ss / N; none
// for a power of two N).

template <typename T, typename W, typename AccT, int V, int Vpt>
__global__ void __launch_bounds__(kBwdMaxThreads)
    rms_norm_fwd_decode_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                               AccT* __restrict__ rstd, int N, AccT eps, AccT inv_n) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int nv = N / V;
  const int64_t row = blockIdx.x;
  cuda::RawVec<T, V> xv[Vpt] = {}, unused[Vpt];
  RawWeight<W, V> wv[Vpt] = {};
  load_decode_row<T, W, V, Vpt, false>(x, nullptr, w, row, N, xv, unused, wv);
  const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
  AccT sq[Vpt * V];
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) sq[j * V + i] = x_at(j, i) * x_at(j, i);
  }
  // Each thread's sum by cuda::tree_sum: a tree of independent adds, shorter than
  // a chain of Vpt * V dependent ones.
  const AccT ss = cuda::block_sum_once(cuda::tree_sum<Vpt * V>(sq), scratch);
  const AccT r = rsqrt_acc(ss * inv_n + eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * blockDim.x + threadIdx.x;
    if (q >= nv) continue;
    cuda::Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(x_at(j, i) * r * wv[j].template at<AccT>(i));
    cuda::store_vec<T, V>(y + row * N + int64_t(q) * V, out);
  }
}

// ---------------------------------------------------------------------------
// Backward, row in registers. Per row, with g_i = dy_i * w_i:
//   s = sum_i g_i * x_i (row_sum);  dx_i = T(rstd * g_i - x_i * rstd^3 * s / N)
//   dW: acc[i] += dy_i * x_i * rstd, in shared memory, one slot per (thread,
//   element): each thread adds the rows it visits in order. At the end the CTA
//   adds its row slots in row order and writes partials[p][col] (p = the row
//   group), which rms_norm_dw_sum_kernel adds over p in order. No atomics.
//   With a single row group (gridDim == cluster) the sums are dW itself: written
//   to dw_direct as W, and no second kernel runs.
//   staged_w: the thread's first staged_w w vectors in shared memory after the
//   dW slots (staged_weight).

template <typename T, typename W, typename AccT, int V, int Vpt, int MinBlocks, bool kGroupedSlots = false>
__global__ void __launch_bounds__(kBwdMaxThreads, MinBlocks)
    rms_norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                        const W* __restrict__ w, T* __restrict__ dx, AccT* __restrict__ partials,
                        W* __restrict__ dw_direct, int64_t M, int N, int group, int cluster, int staged_w) {
  constexpr bool kSpreadRows = Vpt < kVpt;  // a single row, one vector a thread over a cluster: latency-bound
  // Rows that need a cluster, the only ones the policy runs two CTAs per SM: the dW
  // sums are added while the CTA waits at the row's cluster barrier (below).
  constexpr bool kClusterRows = MinBlocks == 2;
  cuda::start_next_grid();  // rms_norm_dw_sum_kernel may take its SMs' free slots now
  extern __shared__ __align__(16) unsigned char rms_smem[];
  AccT* acc = reinterpret_cast<AccT*>(rms_smem);  // [Vpt * V][blockDim.x]
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  __shared__ AccT slots[2];
  const RowLayout L(group, cluster);
  const int nv = N / V;
  const bool want_dw = partials != nullptr || dw_direct != nullptr;
  // This thread's dW sum k (k = j * V + i): a register in a cluster-spread row (a
  // CTA holds a slice of it, nothing to combine), else its slot in `acc`.
  AccT dw_reg[kSpreadRows ? Vpt * V : 1];
  // Slot of sum k of thread t: (k, t) at k * blockDim.x + t; kGroupedSlots: in
  // groups of kSlotG sums of a thread side by side (16 bytes), which add_dw reads
  // and writes with one shared access instead of kSlotG.
  constexpr int kSlotG = kGroupedSlots && V % (16 / sizeof(AccT)) == 0 ? static_cast<int>(16 / sizeof(AccT)) : 1;
  const auto slot_index = [&](int k, int t) { return ((k / kSlotG) * blockDim.x + t) * kSlotG + k % kSlotG; };
  const auto dw_sum = [&](int k) -> AccT& {
    if constexpr (kSpreadRows) {
      return dw_reg[k];
    } else {
      return acc[slot_index(k, threadIdx.x)];
    }
  };
  if (want_dw) {
#pragma unroll
    for (int k = 0; k < Vpt * V; ++k) dw_sum(k) = AccT(0);
  }
  constexpr bool kHoldLast = holds_last_weight(kClusterRows, sizeof(W) * V);
  const auto weight_at = staged_weight<kSpreadRows, true, kHoldLast, AccT, W, V, Vpt>(
      w, staged_w, rms_smem + (want_dw ? Vpt * V * blockDim.x * sizeof(AccT) : 0), L, nv);
  int parity = 0;
  for (int64_t base = L.first; base < M; base += L.step, parity ^= 1) {
    const int64_t row = base + L.g;
    const bool live = row < M;
    cuda::RawVec<T, V> xv[Vpt] = {}, gv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (live && q < nv) {
        xv[j] = cuda::load_raw<T, V>(x + row * N + int64_t(q) * V);
        gv[j] = cuda::load_raw<T, V>(dy + row * N + int64_t(q) * V);
      }
    }
    const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
    const auto g_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(gv[j], i); };
    const AccT r = live ? rstd[row] : AccT(0);
    // Cluster rows with a 16-bit weight keep the last vector's weight from this sum
    // for dx (8 registers, faster than reading it again; a float32 weight with a half
    // input holds that vector already, staged_weight).
    constexpr bool kKeepLastW = kClusterRows && sizeof(W) == 2;
    AccT s = 0, w_last[V];
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (q < nv) {
        AccT wv[V];
        weight_at(j, q, wv);
#pragma unroll
        for (int i = 0; i < V; ++i) s += g_at(j, i) * wv[i] * x_at(j, i);
        if (kKeepLastW && j == Vpt - 1) {
#pragma unroll
          for (int i = 0; i < V; ++i) w_last[i] = wv[i];
        }
      }
    }
    const auto add_dw = [&](int j) {
      if constexpr (kSlotG > 1) {
#pragma unroll
        for (int c = 0; c < V / kSlotG; ++c) {
          auto* p = reinterpret_cast<cuda::Vec<AccT, kSlotG>*>(acc + slot_index(j * V + c * kSlotG, threadIdx.x));
          auto v = *p;
#pragma unroll
          for (int e = 0; e < kSlotG; ++e) {
            const int i = c * kSlotG + e;
            v.v[e] += g_at(j, i) * x_at(j, i) * r;
          }
          *p = v;
        }
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) dw_sum(j * V + i) += g_at(j, i) * x_at(j, i) * r;
      }
    };
    // Cluster rows: the dW sums need no s, so they are added between arriving at the
    // row's cluster barrier and waiting there (row_sum), which hides part of its wait.
    // The other launches add them after the row's dx (before it, they are slower).
    s = row_sum(s, group, cluster, scratch, slots, parity, [&] {
      if constexpr (kClusterRows) {
        if (!want_dw || !live) return;
#pragma unroll
        for (int j = 0; j < Vpt; ++j) {
          if (j * L.row_threads + L.u < nv) add_dw(j);
        }
      }
    });
    const AccT k = r * r * r * s / static_cast<AccT>(N);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (!live || q >= nv) continue;
      if (dx != nullptr) {
        AccT wv[V];
        if (kKeepLastW && j == Vpt - 1) {
#pragma unroll
          for (int i = 0; i < V; ++i) wv[i] = w_last[i];
        } else {
          weight_at(j, q, wv);
        }
        cuda::Vec<T, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          out.v[i] = static_cast<T>(r * g_at(j, i) * wv[i] - x_at(j, i) * k);
        }
        cuda::store_vec<T, V>(dx + row * N + int64_t(q) * V, out);
      }
      if (!kClusterRows && want_dw) add_dw(j);
    }
  }
  if (want_dw && (kSpreadRows || L.rows_per_cta == 1)) {
    // One row per CTA: a thread's own slots are its columns' sums.
    store_thread_dw<Vpt, V>(L, cluster, nv, N, partials, dw_direct, dw_sum);
  } else if (want_dw) {
    __syncthreads();
    // Slot (j, t, i) of this CTA is column (j * row_threads + rank * group + t) * V + i;
    // consecutive slots are consecutive columns, so the writes coalesce.
    const int slots_per_cta = Vpt * V * group;
    for (int slot = threadIdx.x; slot < slots_per_cta; slot += blockDim.x) {
      const int j = slot / (group * V);
      const int t = (slot / V) % group;
      const int i = slot % V;
      const int q = j * L.row_threads + L.rank * group + t;
      if (q >= nv) continue;
      AccT sum = 0;
      for (int g = 0; g < L.rows_per_cta; ++g) sum += acc[slot_index(j * V + i, g * group + t)];
      if (dw_direct != nullptr) {
        dw_direct[int64_t(q) * V + i] = static_cast<W>(sum);
      } else {
        partials[int64_t(blockIdx.x / cluster) * N + int64_t(q) * V + i] = sum;
      }
    }
  }
  if (cluster > 1) cluster_sync();
}

// ---------------------------------------------------------------------------
// Backward of rows that need a cluster, streamed (sm_90; the policy takes it for a
// float32 weight with a half input): the same sums as
// rms_norm_bwd_kernel, in the same order (the same dx bits), with x and dy
// brought into shared memory by bulk copies (cp.async.bulk) rows ahead, and the
// rows overlapped: while the cluster's sum of row i is in flight (between
// arriving at its cluster barrier and waiting there), the CTA computes the
// partial sum and dW terms of row i + 1, and after publishing that, row i's dx.
// One CTA per SM (kStreamStages rows of x and dy take the shared memory): a CTA's
// slice of a row is chunk j < Vpt of `group` vectors at j * row_threads + rank *
// group, copied to j * group of the stage; thread t takes vector j * group + t
// of each chunk. Per row (g_i = dy_i * w_i):
//   s = sum_i g_i * x_i;  dx_i = T(rstd * g_i - x_i * rstd^3 * s / N)
//   dW: acc[i] += dy_i * x_i * rstd in registers, rows in order; at the end the
//   thread's sums go to partials[p][col] (p = the cluster), or to dW itself when
//   a single cluster runs (dw_direct), as in rms_norm_bwd_kernel.
// Stage i % kStreamStages holds row i from its partial sum to its dx; it is
// refilled (with row i + kStreamStages) after the next block sum's barrier, which
// every thread reaches after row i's dx. The weight is held in registers as loaded.
template <typename T, typename W, typename AccT, int V>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    rms_norm_bwd_streamed_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                                 const W* __restrict__ w, T* __restrict__ dx, AccT* __restrict__ partials,
                                 W* __restrict__ dw_direct, int64_t M, int N, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int Vpt = kVpt;
  constexpr int kStages = kStreamStages;
  using Raw = cuda::RawVec<T, V>;
  cuda::start_next_grid();  // rms_norm_dw_sum_kernel may take its SMs' free slots now
  extern __shared__ __align__(16) unsigned char rms_smem[];
  __shared__ cuda::BlockSumScratch<AccT> scratch[2];  // by row parity: one barrier a block sum
  __shared__ AccT slots[2];
  __shared__ uint64_t full[kStages];
  cg::cluster_group cl = cg::this_cluster();
  const int group = blockDim.x;
  const RowLayout L(group, cluster);
  const int nv = N / V;
  const int stage_vectors = Vpt * group;  // per tensor
  const auto stage_x = [&](int64_t i) {
    return reinterpret_cast<Raw*>(rms_smem) + (i % kStages) * 2 * stage_vectors;
  };
  const auto stage_dy = [&](int64_t i) { return stage_x(i) + stage_vectors; };
  const auto row_of = [&](int64_t i) { return L.first + i * L.step; };
  const int64_t rows = L.first < M ? (M - 1 - L.first) / L.step + 1 : 0;  // this cluster's
  // Chunk j of this CTA: `count` vectors from global vector `first`.
  const auto chunk_first = [&](int j) { return j * L.row_threads + L.rank * group; };
  const auto chunk_count = [&](int j) { return std::clamp(nv - chunk_first(j), 0, group); };
  const auto fetch = [&](int64_t i) {  // thread 0: row i of this cluster into its stage
    uint64_t* bar = &full[i % kStages];
    uint32_t bytes = 0;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) bytes += 2u * chunk_count(j) * sizeof(Raw);
    cuda::mbarrier_expect_bytes(bar, bytes);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int count = chunk_count(j);
      if (count == 0) continue;
      const int64_t from = row_of(i) * N + int64_t(chunk_first(j)) * V;
      cuda::bulk_copy_to_shared(stage_x(i) + j * group, x + from, count * sizeof(Raw), bar);
      cuda::bulk_copy_to_shared(stage_dy(i) + j * group, dy + from, count * sizeof(Raw), bar);
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) cuda::mbarrier_init(&full[s], 1);
    cuda::fence_barrier_init();
    for (int64_t i = 0; i < kStages && i < rows; ++i) fetch(i);
  }
  __syncthreads();
  RawWeight<W, V> wv[Vpt];
  AccT dw[Vpt * V] = {};
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * L.row_threads + L.u;
#pragma unroll
    for (int c = 0; c < V / RawWeight<W, V>::kChunk; ++c) {
      constexpr int kChunk = RawWeight<W, V>::kChunk;
      if (w == nullptr || q >= nv) {
        wv[j].chunk[c] = RawWeight<W, V>::ones_chunk();
      } else {
        wv[j].chunk[c] = cuda::load_raw<W, kChunk>(w + int64_t(q) * V + c * kChunk);
      }
    }
  }
  const bool want_dw = partials != nullptr || dw_direct != nullptr;
  const auto mine = [&](int j) { return j * L.row_threads + L.u < nv; };
  // Row i's partial sum of g * w * x (waiting for its stage), its dW terms added.
  const auto partial_sum = [&](int64_t i, AccT r) {
    cuda::mbarrier_wait(&full[i % kStages], static_cast<uint32_t>((i / kStages) & 1));
    AccT sum = 0;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!mine(j)) continue;
      const Raw xv = stage_x(i)[j * group + threadIdx.x], gv = stage_dy(i)[j * group + threadIdx.x];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const AccT xe = cuda::raw_elem<AccT, T, V>(xv, e), ge = cuda::raw_elem<AccT, T, V>(gv, e);
        sum += ge * wv[j].template at<AccT>(e) * xe;
        if (want_dw) dw[j * V + e] += ge * xe * r;
      }
    }
    return sum;
  };
  // The CTA's sum of row i into its cluster slot, and arrive at the row's barrier.
  const auto publish = [&](int64_t i, AccT part) {
    const AccT v = cuda::block_sum_once(part, scratch[i & 1]);
    if (threadIdx.x == 0) slots[i & 1] = v;
    cl.barrier_arrive();
  };
  const auto collect = [&](int64_t i) {
    cl.barrier_wait();
    AccT total = 0;
    for (int rank = 0; rank < cluster; ++rank) total += *cl.map_shared_rank(slots + (i & 1), rank);
    return total;
  };
  const auto write_dx = [&](int64_t i, AccT r, AccT s) {
    const AccT k = r * r * r * s / static_cast<AccT>(N);
    const int64_t row = row_of(i);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!mine(j)) continue;
      const Raw xv = stage_x(i)[j * group + threadIdx.x], gv = stage_dy(i)[j * group + threadIdx.x];
      cuda::Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        out.v[e] = static_cast<T>(r * cuda::raw_elem<AccT, T, V>(gv, e) * wv[j].template at<AccT>(e) -
                                  cuda::raw_elem<AccT, T, V>(xv, e) * k);
      }
      cuda::store_vec<T, V>(dx + row * N + int64_t(j * L.row_threads + L.u) * V, out);
    }
  };
  if (rows > 0) {
    AccT r = rstd[row_of(0)];
    AccT r_next = rows > 1 ? rstd[row_of(1)] : AccT(0);
    publish(0, partial_sum(0, r));
    for (int64_t i = 0; i < rows; ++i) {
      const bool more = i + 1 < rows;
      const AccT r_after = i + 2 < rows ? rstd[row_of(i + 2)] : AccT(0);  // loaded a row ahead of its use
      AccT part_next = 0;
      if (more) part_next = partial_sum(i + 1, r_next);
      const AccT s = collect(i);
      if (more) {
        publish(i + 1, part_next);
        // Past the block sum's barrier every thread has written row i - 1's dx.
        if (threadIdx.x == 0 && i >= 1 && i - 1 + kStages < rows) {
          cuda::fence_shared_for_bulk_copy();
          fetch(i - 1 + kStages);
        }
      }
      if (dx != nullptr) write_dx(i, r, s);
      r = r_next;
      r_next = r_after;
    }
  }
  if (want_dw) store_thread_dw<Vpt, V>(L, cluster, nv, N, partials, dw_direct, [&](int k) { return dw[k]; });
  cl.sync();  // no CTA leaves while another still reads its slots
#else
  __trap();  // clusters and bulk copies: chosen only on sm_90 and newer
#endif
}

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
  cuda::start_next_grid();  // rms_norm_dw_sum_kernel may take its SMs' free slots now
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

// ---------------------------------------------------------------------------
// Launchers.

// Weight vectors per thread staged in shared memory (staged_weight) on top of the
// choice's c.smem, in a register launch that is not cluster-spread: for 16-byte weight
// vectors all of them (c.vpt) or none; in the backward, for 32-byte ones (a
// float32 weight with a half input), the most that fit (cluster rows: of all but
// the last); either way only while as many CTAs (or clusters) stay resident as
// without. A forward CTA of one-CTA rows takes a single row group; staging is kept
// there: it issues the weight's loads before the row sum, the unstaged path after
// it. (The forward's 32-byte vectors are not staged: its CTAs take one row or a
// few, and staging them is slower.)
template <typename... Args>
int staged_weight_vectors(void (*kernel)(Args...), const RmsLaunchConfig& c, bool backward, bool weighted,
                          int64_t w_vec_bytes) {
  const bool partial = backward && w_vec_bytes == 32;
  if (!weighted || (w_vec_bytes != 16 && !partial) || c.two_pass() || c.decode() || c.vpt < kVpt) return 0;
  const int64_t resident = cuda::resident_groups(kernel, c.block, c.cluster, c.smem);
  const int most = backward && holds_last_weight(c.ctas_per_sm == 2, w_vec_bytes) ? c.vpt - 1 : c.vpt;
  for (int n = most; n > 0 && (n == c.vpt || partial); --n) {
    const int64_t bytes = int64_t(c.block) * n * w_vec_bytes;
    if (c.smem + bytes <= cuda::device_facts().smem_per_block_optin &&
        cuda::resident_groups(kernel, c.block, c.cluster, c.smem + bytes) == resident) {
      return n;
    }
  }
  return 0;
}

// Calls fn(std::integral_constant<int, V>) with V the chosen vector width.
template <typename T, typename Fn>
void with_vec(const RmsLaunchConfig& c, Fn&& fn) {
  constexpr int kV = static_cast<int>(16 / sizeof(T));
  if (c.vec == 1) {
    fn(std::integral_constant<int, 1>{});
  } else {
    fn(std::integral_constant<int, kV>{});
  }
}

// Calls fn(std::integral_constant<int, Vpt>) with the chosen vectors per thread of
// the register kernels (decode rows take the decode kernels): kVpt, or, only
// instantiated where the policy picks them (16-byte vectors), 2 * kVpt in the
// forward's cluster rows (elements of at most 4 bytes) and 1 in the backward's
// rows over a cluster of kMaxCluster.
template <typename T, int V, bool kBackward, typename Fn>
void with_vpt(const RmsLaunchConfig& c, Fn&& fn) {
  if constexpr (V * sizeof(T) == 16) {
    if constexpr (!kBackward && sizeof(T) <= 4) {
      if (c.vpt == 2 * kVpt) return fn(std::integral_constant<int, 2 * kVpt>{});
    }
    if constexpr (kBackward) {
      if (c.vpt == 1) return fn(std::integral_constant<int, 1>{});
    }
  }
  fn(std::integral_constant<int, kVpt>{});
}

// Calls fn(kernel) with the forward register kernel of the choice's vectors per thread.
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_fwd_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  with_vpt<T, V, false>(c, [&](auto vpt_tag) { fn(rms_norm_fwd_kernel<T, W, AccT, V, decltype(vpt_tag)::value>); });
}

// Calls fn(kernel) with the backward register kernel of the choice: its vectors per
// thread, and the registers capped for two CTAs per SM where the choice says so.
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  with_vpt<T, V, true>(c, [&](auto vpt_tag) {
    constexpr int Vpt = decltype(vpt_tag)::value;
    if constexpr (Vpt == kVpt) {
      if (c.ctas_per_sm == 2) return fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 2>);
      // One row per CTA of more than 256 threads: the dW slots in 16-byte groups
      // (fewer registers for 16-bit elements, faster there); at 256 threads and fewer,
      // and for cluster rows, single slots, which are as fast or faster.
      if (c.cluster == 1 && c.group == c.block && c.block > 256) {
        return fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 1, true>);
      }
    }
    fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 1>);
  });
}

// Calls fn(kernel) with the streamed cluster-row backward kernel (instantiated for
// 16-byte vectors, which the bulk copies need, as the policy picks it).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_streamed_kernel(Fn&& fn) {
  if constexpr (V * sizeof(T) == 16) {
    fn(rms_norm_bwd_streamed_kernel<T, W, AccT, V>);
  } else {
    TORCH_CHECK(false, "rms_norm_backward: no streamed kernel for vectors of ", V * sizeof(T), " bytes");
  }
}

// Calls fn(kernel) with the decode forward kernel of the choice's vectors per thread
// (1, 2, 4 or 8, up to fwd_decode_max_vpt; 16-byte vectors, as the policy picks decode rows).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_fwd_decode_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  if constexpr (V * sizeof(T) == 16) {
    if (c.vpt == 1) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 1>);
    if (c.vpt == 2) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 2>);
    if constexpr (fwd_decode_max_vpt(sizeof(T)) >= 4) {
      if (c.vpt == 4) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 4>);
    }
    if constexpr (fwd_decode_max_vpt(sizeof(T)) >= 8) {
      if (c.vpt == 8) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 8>);
    }
  }
  TORCH_CHECK(false, "rms_norm: no decode kernel for ", c.vpt, " vectors of ", V, " per thread");
}

// Calls fn(kernel) with the single-row backward kernel of the choice's vectors per
// thread (1 or kDecodeVpt; instantiated for 16-byte vectors, as the policy picks it).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_decode_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  static_assert(kDecodeVpt == 2);
  if constexpr (V * sizeof(T) == 16) {
    if (c.vpt == 1) return fn(rms_norm_bwd_decode_kernel<T, W, AccT, V, 1>);
    if (c.vpt == 2) return fn(rms_norm_bwd_decode_kernel<T, W, AccT, V, 2>);
  }
  TORCH_CHECK(false, "rms_norm_backward: no single-row kernel for ", c.vpt, " vectors of ", V, " per thread");
}

// 1 / N for the decode kernels' mean, sum * (1 / N), computed once on the host.
template <typename AccT>
AccT inverse_row_length(int64_t n) {
  return AccT(1) / static_cast<AccT>(n);
}

// For half inputs the smaller count of the two weight types' kernels: the
// choice, and so the dW workspace a Plan reports, cannot depend on the weight.
int64_t resident_row_groups(const RmsLaunchConfig& c, c10::ScalarType dtype, bool backward) {
  int64_t resident = std::numeric_limits<int64_t>::max();
  BARACUDA_DISPATCH_FLOATING(dtype, "rms_norm_resident", [&] {
    for_each_weight_type<scalar_t>([&](auto w_tag) {
      using W = decltype(w_tag);
      with_vec<scalar_t>(c, [&](auto v_tag) {
        constexpr int V = decltype(v_tag)::value;
        int64_t n = 0;
        if (c.two_pass()) {
          n = backward ? cuda::resident_groups(rms_norm_bwd_looped_kernel<scalar_t, W, acc_t, V>, c.block, 1, 0)
                       : cuda::resident_groups(rms_norm_fwd_looped_kernel<scalar_t, W, acc_t, V>, c.block, 1, 0);
        } else {
          if (backward && c.stages > 0) {
            with_bwd_streamed_kernel<scalar_t, W, acc_t, V>(
                [&](auto kernel) { n = cuda::resident_groups(kernel, c.block, c.cluster, c.smem); });
          } else if (backward) {
            with_bwd_kernel<scalar_t, W, acc_t, V>(
                c, [&](auto kernel) { n = cuda::resident_groups(kernel, c.block, c.cluster, c.smem); });
          } else {
            with_fwd_kernel<scalar_t, W, acc_t, V>(
                c, [&](auto kernel) { n = cuda::resident_groups(kernel, c.block, c.cluster, c.smem); });
          }
        }
        resident = std::min(resident, n);
      });
    });
  });
  return resident;
}

// The policy's config for `p` on the current device, with the runtime's occupancy
// of the kernel it picks.
RmsLaunchConfig choose_rms(const RmsProblem& p) {
  return rms_launch_config(p, cuda::device_facts(), [&](const RmsLaunchConfig& shape) {
    return RmsOccupancy{resident_row_groups(shape, p.dtype, p.backward)};
  });
}

void rms_norm_out_cuda(const at::Tensor& input, at::IntArrayRef normalized_shape,
                       const std::optional<at::Tensor>& weight, std::optional<double> eps, const at::Tensor& output,
                       const at::Tensor& rstd) {
  const auto rows = check_rms_norm(input, normalized_shape, weight);
  check_out(kRmsNormOp, "output", output, input.sizes(), input.scalar_type(), input.device());
  check_out(kRmsNormOp, "rstd", rstd, rms_rstd_shape(input.sizes(), normalized_shape.size()),
            rms_acc_dtype(input.scalar_type()), input.device());
  cuda::check_out_aligned(kRmsNormOp, "output", output);
  BARACUDA_CHECK_VALUE(rstd.is_contiguous(), kRmsNormOp, ": rstd must be contiguous");
  check_rms_norm_out_overlap(input, weight, output, rstd);
  if (rows.M == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  cuda::check_device_arch(kRmsNormOp);
  if (rows.N == 0) {  // the mean of no elements is NaN, as in PyTorch
    rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const auto c = choose_rms({rows.M, rows.N, input.scalar_type(), false, 0});
  const auto x = cuda::aligned_contiguous(input);
  const auto w = has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_cuda", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      with_vec<scalar_t>(c, [&](auto v_tag) {
        constexpr int V = decltype(v_tag)::value;
        const auto* xp = x.const_data_ptr<scalar_t>();
        const W* wp = w.defined() ? w.const_data_ptr<W>() : nullptr;
        auto* yp = output.mutable_data_ptr<scalar_t>();
        auto* rp = rstd.mutable_data_ptr<acc_t>();
        if (c.two_pass()) {
          cuda::launch(rms_norm_fwd_looped_kernel<scalar_t, W, acc_t, V>,
                       {.grid = dim3(c.clusters), .block = dim3(c.block)}, xp, wp, yp, rp, rows.M, rows.N,
                       static_cast<acc_t>(e));
        } else if (c.decode()) {
          with_fwd_decode_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            cuda::launch(kernel, {.grid = dim3(c.clusters), .block = dim3(c.block)}, xp, wp, yp, rp,
                         static_cast<int>(rows.N), static_cast<acc_t>(e), inverse_row_length<acc_t>(rows.N));
          });
        } else {
          with_fwd_kernel<scalar_t, W, acc_t, V>(c, [&](auto* kernel) {
            const int staged = staged_weight_vectors(kernel, c, false, wp != nullptr, int64_t(sizeof(W)) * V);
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster,
                          .smem = c.smem + int64_t(c.block) * staged * int64_t(sizeof(W)) * V},
                         xp, wp, yp, rp, rows.M, static_cast<int>(rows.N), c.group, c.cluster, static_cast<acc_t>(e),
                         staged > 0);
          });
        }
      });
    });
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cuda(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                 const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  check_rms_norm(input, normalized_shape, weight);
  auto output = at::empty(input.sizes(), input.options());
  auto rstd = at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                        input.options().dtype(rms_acc_dtype(input.scalar_type())));
  rms_norm_out_cuda(input, normalized_shape, weight, eps, output, rstd);
  return {output, rstd};
}

// The backward into the outputs. `workspace` is the caller's (checked to hold the
// dW partials), or none: one of the needed size is allocated (the functional op).
void rms_norm_backward_into(const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                            const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                            std::array<bool, 2> output_mask, const at::Tensor& grad_input,
                            const at::Tensor& grad_weight, const std::optional<at::Tensor>& workspace) {
  const char* op = kRmsNormBackwardOp;
  const auto rows = check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);
  const bool want_dx = output_mask[0];
  const bool want_dw = output_mask[1] && has_tensor(weight);
  if (want_dx) {
    check_out(op, "grad_input", grad_input, input.sizes(), input.scalar_type(), input.device());
    cuda::check_out_aligned(op, "grad_input", grad_input);
  }
  if (want_dw) {
    check_out(op, "grad_weight", grad_weight, normalized_shape, weight->scalar_type(), input.device());
    BARACUDA_CHECK_VALUE(grad_weight.is_contiguous(), op, ": grad_weight must be contiguous");
  }
  check_rms_norm_backward_overlap(grad_out, input, rstd, weight, if_used(want_dx, grad_input),
                                  if_used(want_dw, grad_weight), at::Tensor());
  if (rows.N == 0 || (!want_dx && !want_dw)) return;
  const c10::cuda::CUDAGuard guard(input.device());
  cuda::check_device_arch(op);
  if (rows.M == 0) {
    if (want_dw) grad_weight.zero_();
    return;
  }
  const int64_t acc_bytes = acc_bytes_of(input.scalar_type());
  const RmsProblem problem{rows.M, rows.N, input.scalar_type(), true, want_dw ? weight->element_size() : 0};
  const auto c = choose_rms(problem);
  at::Tensor ws;
  if (want_dw) {
    const int64_t need = rms_dw_workspace_bytes(c, problem);
    if (workspace.has_value()) {
      check_workspace(op, *workspace, need, 16, input.device(),
                      {{"grad_out", grad_out}, {"input", input}, {"rstd", rstd}, {"weight", *weight},
                       {"grad_input", if_used(want_dx, grad_input)}, {"grad_weight", grad_weight}});
    }
    ws = workspace.has_value() ? *workspace : at::empty({need}, input.options().dtype(at::kByte));
  }
  const auto dy = cuda::aligned_contiguous(grad_out);
  const auto x = cuda::aligned_contiguous(input);
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor();
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_backward_cuda", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      with_vec<scalar_t>(c, [&](auto v_tag) {
        constexpr int V = decltype(v_tag)::value;
        const auto* gp = dy.const_data_ptr<scalar_t>();
        const auto* xp = x.const_data_ptr<scalar_t>();
        const auto* rp = r.const_data_ptr<acc_t>();
        const W* wp = w.defined() ? w.const_data_ptr<W>() : nullptr;
        scalar_t* dxp = want_dx ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
        const bool direct = want_dw && c.dw != RmsDwSum::kOrdered;
        acc_t* parts = want_dw && !direct ? static_cast<acc_t*>(ws.mutable_data_ptr()) : nullptr;
        W* dwp = direct ? grad_weight.mutable_data_ptr<W>() : nullptr;
        if (c.two_pass()) {
          cuda::launch(rms_norm_bwd_looped_kernel<scalar_t, W, acc_t, V>,
                       {.grid = dim3(c.clusters), .block = dim3(c.block)}, gp, xp, rp, wp, dxp, parts, rows.M,
                       rows.N);
        } else if (c.decode()) {
          with_bwd_decode_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            const int64_t col_smem = c.dw_columns > 0 ? int64_t(c.block) * V * acc_bytes : 0;  // decode_dw_columns
            cuda::launch(kernel, {.grid = dim3(c.clusters + c.dw_columns), .block = dim3(c.block), .smem = col_smem},
                         gp, xp, rp, wp, dxp, dwp, static_cast<int>(rows.M), static_cast<int>(rows.N),
                         inverse_row_length<acc_t>(rows.N));
          });
        } else if (c.stages > 0) {
          with_bwd_streamed_kernel<scalar_t, W, acc_t, V>([&](auto kernel) {
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster,
                          .smem = c.smem},
                         gp, xp, rp, wp, dxp, parts, dwp, rows.M, static_cast<int>(rows.N), c.cluster);
          });
        } else {
          with_bwd_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            const int staged = staged_weight_vectors(kernel, c, true, wp != nullptr, int64_t(sizeof(W)) * V);
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster,
                          .smem = c.smem + int64_t(c.block) * staged * int64_t(sizeof(W)) * V},
                         gp, xp, rp, wp, dxp, parts, dwp, rows.M, static_cast<int>(rows.N), c.group, c.cluster,
                         staged);
          });
        }
        if (want_dw && !direct) {
          cuda::launch(rms_norm_dw_sum_kernel<acc_t, W>,
                       {.grid = dim3(ceil_div<int64_t>(rows.N, kReduceCols)),
                        .block = dim3(kReduceCols, kReduceSlices),
                        .early = true},
                       parts, grad_weight.mutable_data_ptr<W>(), c.clusters, rows.N);
        }
      });
    });
  });
}

// Outputs that output_mask leaves out (and grad_weight without a weight) are
// undefined tensors (None in Python), as aten::_fused_rms_norm_backward returns.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input,
                                                          at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                          const std::optional<at::Tensor>& weight,
                                                          std::array<bool, 2> output_mask) {
  check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);  // before allocating by its shapes
  at::Tensor grad_input, grad_weight;
  if (output_mask[0]) grad_input = at::empty(input.sizes(), input.options());
  const bool want_dw = output_mask[1] && has_tensor(weight);
  if (want_dw) grad_weight = at::empty(normalized_shape, weight->options());
  const auto none = at::empty({0}, input.options());
  rms_norm_backward_into(grad_out, input, normalized_shape, rstd, weight, output_mask,
                         grad_input.defined() ? grad_input : none, grad_weight.defined() ? grad_weight : none,
                         std::nullopt);
  return {grad_input, grad_weight};
}

void rms_norm_backward_out_cuda(const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                                const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                std::array<bool, 2> output_mask, const at::Tensor& grad_input,
                                const at::Tensor& grad_weight, const at::Tensor& workspace) {
  rms_norm_backward_into(grad_out, input, normalized_shape, rstd, weight, output_mask, grad_input, grad_weight,
                         workspace);
}

// The Plan's variant: the launch config on the current device (problem as in
// rms_problem: [M, N] forward, [M, N, dW element size or 0] backward).
KernelChoice rms_choice(c10::IntArrayRef problem, c10::ScalarType dtype, bool backward) {
  const RmsProblem p = rms_problem(problem, dtype, backward);
  const LaunchConfigView view = rms_view(choose_rms(p), p);
  return {describe(view), view.workspace_bytes};
}

KernelChoice rms_norm_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  return rms_choice(problem, dtype, false);
}

KernelChoice rms_norm_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  return rms_choice(problem, dtype, true);
}

BARACUDA_REGISTER_VARIANT("rms_norm", c10::DeviceType::CUDA, rms_norm_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_backward", c10::DeviceType::CUDA, rms_norm_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm", &baracuda::rms_norm_cuda);
  m.impl("rms_norm.out", &baracuda::rms_norm_out_cuda);
  m.impl("rms_norm_backward", &baracuda::rms_norm_backward_cuda);
  m.impl("rms_norm_backward.out", &baracuda::rms_norm_backward_out_cuda);
}
