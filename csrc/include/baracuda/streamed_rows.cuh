// What the kernels that stream rows through shared memory share (rms_norm's
// backward_streamed.cuh, rms_norm_fused's streamed cluster-row backward): a CTA's slice of a row staged by bulk copies, and a row's sum over its
// cluster split around other work.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "baracuda/cuda_utils.cuh"
#include "baracuda/rms_norm_policy.h"
#include "baracuda/rms_rows.cuh"

namespace baracuda {
namespace {

// This CTA's slice of row i of kTensors tensors, staged in stage i % kStages (rows of
// a CTA or a cluster of CTAs: group = blockDim.x). Chunk j < Vpt of `group` vectors
// from global vector j * row_threads + rank * group (fewer at the row's end) is copied
// to j * group of the tensor's part of the stage; thread t takes vector j * group + t
// of it, global vector q = j * row_threads + u: the register kernels' map, so their
// sums in their order.
template <typename T, int V, int Vpt, int kTensors, int kStages>
struct StagedRowSlices {
  using Raw = cuda::RawVec<T, V>;
  Raw* smem;
  RowLayout L;
  int nv;
  int64_t N;

  __device__ Raw* stage(int64_t i, int tensor) const {
    return smem + ((i % kStages) * kTensors + tensor) * Vpt * int(blockDim.x);
  }
  __device__ int chunk_first(int j) const { return j * L.row_threads + L.rank * int(blockDim.x); }
  __device__ int chunk_count(int j) const { return std::clamp(nv - chunk_first(j), 0, int(blockDim.x)); }
  // Whether this thread's vector j lies in the row.
  __device__ bool mine(int j) const { return j * L.row_threads + L.u < nv; }
  // This thread's vector j of the tensor in item i's stage.
  __device__ Raw at(int64_t i, int tensor, int j) const { return stage(i, tensor)[j * blockDim.x + threadIdx.x]; }

  // Thread 0: row `row` of the tensors (`from`, each [M, N]) into item i's stage,
  // completing on `bar`.
  __device__ void fetch(int64_t i, int64_t row, const T* const (&from)[kTensors], uint64_t* bar) const {
    uint32_t bytes = 0;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) bytes += uint32_t(kTensors) * chunk_count(j) * sizeof(Raw);
    cuda::mbarrier_expect_bytes(bar, bytes);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int count = chunk_count(j);
      if (count == 0) continue;
      const int64_t at = row * N + int64_t(chunk_first(j)) * V;
#pragma unroll
      for (int t = 0; t < kTensors; ++t) {
        cuda::bulk_copy_to_shared(stage(i, t) + j * blockDim.x, from[t] + at, count * sizeof(Raw), bar);
      }
    }
  }
};

// A row's sum over the CTAs of its cluster, split around other work: publish sums
// the CTA's threads (block_sum_once on the parity's scratch: one barrier) and returns
// that sum; with a cluster it also puts the sum in the CTA's slot and arrives at the
// cluster barrier, and collect waits there and adds the CTAs' sums in rank order
// (row_sum's order: the same bits). A CTA that is its own row's cluster takes its own
// sum without a cluster barrier (its launch cluster may be wider: dW fold). Rows
// alternate between two parities: a slot or scratch is rewritten two rows later, past
// the next row's barrier, which follows every read of it.
template <typename AccT>
struct ClusterRowSum {
  cuda::BlockSumScratch<AccT>* scratch;  // two, by parity
  AccT* slots;                           // two, by parity
  int cluster;

  __device__ AccT publish(AccT part, int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const AccT v = cuda::block_sum_once(part, scratch[parity]);
    if (cluster > 1) {
      if (threadIdx.x == 0) slots[parity] = v;
      cooperative_groups::this_cluster().barrier_arrive();
    }
    return v;
#else
    __trap();
    return part;
#endif
  }

  // Row sum of the parity's row, whose CTA sum publish returned as `own`.
  __device__ AccT collect(int parity, AccT own) const {
    if (cluster == 1) return own;
    return cluster_slots_fold(slots, parity, cluster, AccT(0), [](AccT a, AccT b) { return a + b; });
  }
};

// What the streamed-rows kernels declare and walk: this CTA's rows row_of(i), i < count
// (its cluster's row group), their slices of the kTensors tensors `from` staged
// rms::kStreamStages rows ahead (staged, ring: start() fetches the first, refill(i) after a
// CTA barrier past the last read of row i - kStages), and the rows' sums over the
// cluster (sum). Shared memory: the dynamic stages, two block-sum scratches and slots
// (by row parity) and the stages' mbarriers. Rows of blockDim.x threads, rms::kVpt vectors each.
template <typename T, typename AccT, int V, int kTensors>
struct StreamedRows {
  static constexpr int kStages = rms::kStreamStages;
  StagedRowSlices<T, V, rms::kVpt, kTensors, kStages> staged;
  cuda::BulkStageRing<kStages> ring;
  ClusterRowSum<AccT> sum;
  int64_t count;
  const T* from[kTensors];

  static __device__ __forceinline__ StreamedRows make(const T* const (&from)[kTensors], int64_t M, int N,
                                                      int cluster) {
    extern __shared__ __align__(16) unsigned char rms_smem[];
    __shared__ cuda::BlockSumScratch<AccT> scratch[2];  // by row parity: one barrier a block sum
    __shared__ AccT slots[2];
    __shared__ uint64_t full[kStages];
    const RowLayout L(blockDim.x, cluster);
    StreamedRows s{{reinterpret_cast<cuda::RawVec<T, V>*>(rms_smem), L, N / V, N},
                  {full, kStages},
                  {scratch, slots, cluster},
                  L.first < M ? (M - 1 - L.first) / L.step + 1 : 0,
                  {}};
#pragma unroll
    for (int t = 0; t < kTensors; ++t) s.from[t] = from[t];
    return s;
  }

  __device__ int64_t row_of(int64_t i) const { return staged.L.first + i * staged.L.step; }
  __device__ void fetch(int64_t i) const { staged.fetch(i, row_of(i), from, ring.bar(i)); }
  __device__ void start() const {
    ring.start(count, [&](int64_t i) { fetch(i); });
  }
  __device__ void refill(int64_t i) const {
    ring.refill(i, [&](int64_t k) { fetch(k); });
  }
  // Calls f(j, a, b) for each of this thread's vectors j in the row (a, b: its vectors j of
  // tensors 0 and 1 in row i's stage). The kernels' stores keep a loop of their own: through
  // this call nvcc emitted 8% more instructions a row there.
  template <typename F>
  __device__ __forceinline__ void for_each_pair(int64_t i, F&& f) const {
#pragma unroll
    for (int j = 0; j < rms::kVpt; ++j) {
      if (staged.mine(j)) f(j, staged.at(i, 0, j), staged.at(i, 1, j));
    }
  }

  // Walks the rows overlapped around their sums: while row i's sum crosses the cluster
  // (published, not yet collected) the CTA computes partial(i + 1, rstd of row i + 1), row
  // i + 1's part of its sum, and after publishing that, finish(i, rstd of row i, row i's
  // sum). rstd is loaded a row ahead of its use. Row i's stage takes row i + kStages
  // either right after finish(i) (refill_after_finish: behind a CTA barrier of its own, so
  // the refill has a whole row's time, cluster wait included, to land) or, a row later,
  // past the block-sum barrier of row i + 2, which every thread reaches after finish(i).
  template <typename Partial, typename Finish>
  __device__ __forceinline__ void walk_overlapped(const AccT* rstd, bool refill_after_finish, Partial&& partial,
                                                  Finish&& finish) const {
    if (count == 0) return;
    AccT r = rstd[row_of(0)];
    AccT r_next = count > 1 ? rstd[row_of(1)] : AccT(0);
    AccT own = sum.publish(partial(int64_t(0), r), 0);
    for (int64_t i = 0; i < count; ++i) {
      const bool more = i + 1 < count;
      const AccT r_after = i + 2 < count ? rstd[row_of(i + 2)] : AccT(0);
      AccT part_next = 0;
      if (more) part_next = partial(i + 1, r_next);
      const AccT s = sum.collect(i & 1, own);
      if (more) {
        own = sum.publish(part_next, (i + 1) & 1);
        if (!refill_after_finish && threadIdx.x == 0 && i >= 1 && i - 1 + kStages < count) refill(i - 1 + kStages);
      }
      finish(i, r, s);
      if (refill_after_finish && i + kStages < count) {
        __syncthreads();  // every thread is done with row i's stage
        if (threadIdx.x == 0) refill(i + kStages);
      }
      r = r_next;
      r_next = r_after;
    }
  }

  // This thread's weight vectors (held in registers for all its rows).
  template <typename W>
  __device__ void load_weight(const W* w, RawWeight<W, V> (&wv)[rms::kVpt]) const {
#pragma unroll
    for (int j = 0; j < rms::kVpt; ++j) wv[j] = RawWeight<W, V>::load(w, j * staged.L.row_threads + staged.L.u, staged.nv);
  }
};

}  // namespace
}  // namespace baracuda
