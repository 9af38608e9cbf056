// rms_norm backward, register rows: warp rows, CTA rows, cluster rows.
#pragma once

#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Backward, row in registers. Per row, with g_i = dy_i * w_i:
//   s = sum_i g_i * x_i (row_sum);  dx_i = T(rstd * g_i - x_i * rstd^3 * s / N)
//   dW: acc[i] += dy_i * x_i * rstd, in shared memory, one slot per (thread,
//   element): each thread adds the rows it visits in order. At the end the CTA
//   adds its row slots in row order and writes partials[p][col] (p = the row
//   group), which rms_dw_sum_kernel adds over p in order. No atomics.
//   With a single row group (gridDim == cluster) the sums are dW itself: written
//   to dw_direct as W, and no second kernel runs.
//   staged_w: the thread's first staged_w w vectors in shared memory after the
//   dW slots (staged_weight). prefetch_next: one row per CTA (or per cluster's CTA);
//   thread 0 fetches the CTA's part of its next row into L2 (prefetch_row_part_l2).

template <typename T, typename W, typename AccT, int V, int Vpt, int MinBlocks, bool kGroupedSlots = false>
__global__ void __launch_bounds__(kBwdMaxThreads, MinBlocks)
    rms_norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                        const W* __restrict__ w, T* __restrict__ dx, AccT* __restrict__ partials,
                        W* __restrict__ dw_direct, int64_t M, int N, int group, int cluster, int staged_w,
                        bool prefetch_next) {
  constexpr bool kSpreadRows = Vpt < kVpt;  // a single row, one vector a thread over a cluster: latency-bound
  // Rows that need a cluster, the only ones the policy runs two CTAs per SM: the dW
  // sums are added while the CTA waits at the row's cluster barrier (below).
  constexpr bool kClusterRows = MinBlocks == 2;
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
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
    // prefetch_next (rows of one CTA, alone on its SM): between its rows the CTA waits
    // for the row sum and its dx stores with no load in flight; its next row, fetched
    // into L2 meanwhile, keeps the memory busy and shortens that row's loads. Compiled
    // only where the policy can ask for it (cluster rows spill 4 more bytes with it).
    if constexpr (V * sizeof(T) == 16 && !kSpreadRows && !kClusterRows) {
      const int64_t next = row + L.step;
      if (prefetch_next && threadIdx.x == 0 && next < M) {
        prefetch_row_part_l2<Vpt, V>(x + next * N, nv, L.row_threads, L.rank * group, group);
        prefetch_row_part_l2<Vpt, V>(dy + next * N, nv, L.row_threads, L.rank * group, group);
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

}  // namespace
}  // namespace baracuda
