// What the rms_norm kernels that stream rows through shared memory share
// (forward_streamed.cuh, backward_streamed.cuh): a CTA's slice of a row staged by bulk
// copies, and a row's sum over its cluster split around other work.
#pragma once

#include "common.cuh"

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
// the CTA's threads (block_sum_once on the parity's scratch: one barrier), puts the
// CTA's sum in its slot and arrives at the cluster barrier; collect waits there and
// adds the CTAs' sums in rank order (row_sum's order: the same bits). Rows alternate
// between two parities: a slot is rewritten two rows later, past the next row's
// cluster barrier, which follows every CTA's read of it. A CTA that is its own
// cluster passes straight through the barrier.
template <typename AccT>
struct ClusterRowSum {
  cuda::BlockSumScratch<AccT>* scratch;  // two, by parity
  AccT* slots;                           // two, by parity
  int cluster;

  __device__ void publish(AccT part, int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const AccT v = cuda::block_sum_once(part, scratch[parity]);
    if (threadIdx.x == 0) slots[parity] = v;
    cooperative_groups::this_cluster().barrier_arrive();
#else
    __trap();
#endif
  }

  __device__ AccT collect(int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    cl.barrier_wait();
    AccT total = 0;
    for (int rank = 0; rank < cluster; ++rank) total += *cl.map_shared_rank(slots + parity, rank);
    return total;
#else
    __trap();
    return AccT(0);
#endif
  }
};

}  // namespace
}  // namespace baracuda
