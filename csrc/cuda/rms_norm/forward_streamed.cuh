// rms_norm forward, rows streamed through shared memory by bulk copies.
#pragma once

#include "baracuda/streamed_rows.cuh"
#include "common.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Forward of rows streamed (sm_90; the policy takes it for rows of 65536 or more over
// clusters of 512-thread CTAs, 16-byte vectors, on devices of kStreamedRowsMinBandwidth):
// per row
//   ss = sum_i x_i^2;  rstd = 1 / sqrt(ss / N + eps);  y_i = T(x_i * rstd * w_i)
// in rms_norm_fwd_kernel's order for kVpt vectors a thread (its bits at that layout),
// with x brought into shared memory by bulk copies (StagedRowSlices) kStreamStages
// rows ahead, and the rows overlapped: while row i's sum is in flight over the cluster
// (between arriving at its barrier and waiting there), the CTA sums the squares of row
// i + 1; then it scales and stores row i. Stage i % kStreamStages holds row i; past the
// barrier after row i's stores it takes row i + kStreamStages, so two rows' loads are
// in flight while one is summed and stored. The weight is held in registers as loaded.
// Two CTAs an SM (64 registers, 3 stages of 32 KB each).
// Bytes: M*N*e read + M*N*e written + M*a written (+ w, once a CTA).
template <typename T, typename W, typename AccT, int V>
__global__ void __launch_bounds__(kBwdMaxThreads, 2)
    rms_norm_fwd_streamed_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                                 AccT* __restrict__ rstd, int64_t M, int N, int cluster, AccT eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int Vpt = kVpt;
  using Raw = cuda::RawVec<T, V>;
  const auto rows = StreamedRows<T, AccT, V, 1>::make({x}, M, N, cluster);
  rows.start();
  RawWeight<W, V> wv[Vpt];
  rows.load_weight(w, wv);
  // Row i's partial sum of squares, once its stage has landed.
  const auto squares = [&](int64_t i) {
    rows.ring.wait(i);
    AccT ss = 0;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!rows.staged.mine(j)) continue;
      const Raw xv = rows.staged.at(i, 0, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const AccT a = cuda::raw_elem<AccT, T, V>(xv, e);
        ss += a * a;
      }
    }
    return ss;
  };
  const auto write_y = [&](int64_t i, AccT ss) {
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + eps);
    const int64_t row = rows.row_of(i);
    if (rows.staged.L.u == 0) rstd[row] = r;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!rows.staged.mine(j)) continue;
      const Raw xv = rows.staged.at(i, 0, j);
      cuda::Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        out.v[e] = static_cast<T>(cuda::raw_elem<AccT, T, V>(xv, e) * r * wv[j].template at<AccT>(e));
      }
      cuda::store_vec<T, V>(y + row * N + int64_t(j * rows.staged.L.row_threads + rows.staged.L.u) * V, out);
    }
  };
  AccT own = rows.count > 0 ? rows.sum.publish(squares(0), 0) : AccT(0);
  for (int64_t i = 0; i < rows.count; ++i) {
    const bool more = i + 1 < rows.count;
    const AccT next = more ? squares(i + 1) : AccT(0);
    const AccT ss = rows.sum.collect(i & 1, own);
    if (more) own = rows.sum.publish(next, (i + 1) & 1);
    write_y(i, ss);
    __syncthreads();  // every thread is done with row i's stage
    if (threadIdx.x == 0 && i + rows.kStages < rows.count) rows.refill(i + rows.kStages);
  }
  cg::this_cluster().sync();  // no CTA leaves while another still reads its slots
#else
  __trap();  // clusters and bulk copies: chosen only on sm_90 and newer
#endif
}

}  // namespace
}  // namespace baracuda
