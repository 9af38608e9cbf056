// rms_norm backward, rows streamed through shared memory by bulk copies.
#pragma once

#include "baracuda/streamed_rows.cuh"
#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Backward of rows streamed (sm_90; the policy takes it for half inputs: rows of one
// CTA where two or more of its CTAs fit an SM, and cluster rows): the same sums as rms_norm_bwd_kernel, in the same order for the same row
// layout (the same dx bits), with x and dy brought into shared memory by bulk copies
// (cp.async.bulk) rows ahead, and the rows overlapped: while the sum of row i is in flight (between
// arriving at its cluster barrier and waiting there; a CTA that is its own cluster
// passes straight through), the CTA computes the partial sum and dW terms of row
// i + 1, and after publishing that, row i's dx. kStreamStages rows of x and dy take
// the shared memory (StagedRowSlices): 96 KB at 256 threads, two CTAs an SM.
// Per row (g_i = dy_i * w_i):
//   s = sum_i g_i * x_i;  dx_i = T(rstd * g_i - x_i * rstd^3 * s / N)
//   dW: acc[i] += dy_i * x_i * rstd in registers, rows in order; at the end the
//   thread's sums go to partials[p][col] (p = the cluster), or to dW itself when
//   a single cluster runs (dw_direct), as in rms_norm_bwd_kernel. Rows of one CTA
//   launched in clusters of `fold` CTAs (fold > 1) first add their CTAs' sums
//   (fold_dw_in_cluster): p = blockIdx.x / fold.
// Stage i % kStreamStages holds row i from its partial sum to its dx, then is
// refilled with row i + kStreamStages. With refill_after_dx (cluster rows) that is
// right after row i's dx, behind a CTA barrier of its own, so the refill has a whole
// row's time, cluster wait included, to land: with three stages, rows i + 1 and i + 2
// are in use across the cluster barrier, and a refill issued after the next row's
// sum (the other mode) lands only as far ahead as one dx. Rows of one CTA take that
// other mode: their rows are short and many, and the extra barrier a row costs more
// (4-11% at N = 1024 ... 8192 on an H200) than the wait it saves, which is short
// without a cluster barrier. The weight is held in registers as loaded.
template <typename T, typename W, typename AccT, int V>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    rms_norm_bwd_streamed_kernel(const T* __restrict__ dy, const T* __restrict__ x, const AccT* __restrict__ rstd,
                                 const W* __restrict__ w, T* __restrict__ dx, AccT* __restrict__ partials,
                                 W* __restrict__ dw_direct, int64_t M, int N, int cluster, int fold,
                                 bool refill_after_dx) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int Vpt = kVpt;
  using Raw = cuda::RawVec<T, V>;
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
  const auto rows = StreamedRows<T, AccT, V, 2>::make({x, dy}, M, N, cluster);
  rows.start();
  RawWeight<W, V> wv[Vpt];
  AccT dw[Vpt * V] = {};
  rows.load_weight(w, wv);
  const bool want_dw = partials != nullptr || dw_direct != nullptr;
  // Row i's partial sum of g * w * x (waiting for its stage), its dW terms added.
  const auto partial_sum = [&](int64_t i, AccT r) {
    rows.ring.wait(i);
    AccT sum = 0;
    rows.for_each_pair(i, [&](int j, Raw xv, Raw gv) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const AccT xe = cuda::raw_elem<AccT, T, V>(xv, e), ge = cuda::raw_elem<AccT, T, V>(gv, e);
        sum += ge * wv[j].template at<AccT>(e) * xe;
        if (want_dw) dw[j * V + e] += ge * xe * r;
      }
    });
    return sum;
  };
  const auto write_dx = [&](int64_t i, AccT r, AccT s) {
    if (dx == nullptr) return;
    const AccT k = r * r * r * s / static_cast<AccT>(N);
    const int64_t row = rows.row_of(i);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!rows.staged.mine(j)) continue;
      const Raw xv = rows.staged.at(i, 0, j), gv = rows.staged.at(i, 1, j);
      cuda::Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        out.v[e] = static_cast<T>(r * cuda::raw_elem<AccT, T, V>(gv, e) * wv[j].template at<AccT>(e) -
                                  cuda::raw_elem<AccT, T, V>(xv, e) * k);
      }
      cuda::store_vec<T, V>(dx + row * N + int64_t(j * rows.staged.L.row_threads + rows.staged.L.u) * V, out);
    }
  };
  rows.walk_overlapped(rstd, refill_after_dx, partial_sum, write_dx);
  if (want_dw && fold > 1) {
    fold_dw_in_cluster<Vpt, V>(reinterpret_cast<AccT*>(rows.staged.smem), rows.staged.nv, N, fold,
                               rows.staged.L.row_threads, rows.staged.L.u, partials, [&](int k) { return dw[k]; });
  } else if (want_dw) {
    store_thread_dw<Vpt, V>(rows.staged.L, cluster, rows.staged.nv, N, partials, dw_direct,
                            [&](int k) { return dw[k]; });
  }
  cg::this_cluster().sync();  // no CTA leaves while another still reads its slots or dW sums
#else
  __trap();  // clusters and bulk copies: chosen only on sm_90 and newer
#endif
}

}  // namespace
}  // namespace baracuda
