// rms_norm_fused backward, CUDA: rows in registers (register and cluster rows), rows
// streamed through shared memory, the CTA-per-row kernel, and the ordered sum of the dW
// partial rows (rms_dw_sum_kernel; see common.cuh; the policy:
// baracuda/rms_norm_fused_policy.h).
#include "baracuda/streamed_rows.cuh"
#include "common.cuh"

namespace baracuda {
namespace {

// Whether the backward's register rows load a row's weight vectors with its dy and h
// (FusedRowWeight): where ptxas fits them without spills, i.e. dy, h and dres of the
// input's dtype with 16-byte weight vectors, at up to 128 registers a thread (one CTA an
// SM), or float32 rows at 64.
template <typename T, typename R, typename W, typename OutT, int MinCtas>
constexpr bool fused_bwd_weight_first() {
  return std::is_same_v<R, T> && std::is_same_v<OutT, T> && sizeof(W) * (16 / sizeof(T)) == 16 &&
         (MinCtas == 1 || sizeof(T) == 4);
}

// Backward of rows in registers (register rows, and cluster rows: a row over `cluster`
// CTAs); see common.cuh. dw_partials: a row of N for each row group, gridDim.x / cluster
// (nullptr: no dW; then the weight may be per head). Cluster rows add their dW terms
// between arriving at the row's cluster barrier and waiting there. kClusterRows: `cluster` is
// read (else 1, and the kernel is the one-CTA rows' alone, which takes fewer registers: under
// 80 a thread at 256 threads × 2 vectors of bf16, three CTAs an SM, where 96 left two).
template <typename T, typename R, typename W, typename OutT, typename AccT, int Vpt, int MinCtas, bool kClusterRows>
__global__ void __launch_bounds__(kBwdMaxThreads, MinCtas)
    fused_rows_backward_kernel(const OutT* __restrict__ dy, const R* __restrict__ dres, const R* __restrict__ h,
                               const AccT* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                               R* __restrict__ dr, AccT* __restrict__ dw_partials, FusedRows s, int group,
                               int cluster_arg, AccT offset, bool llama, bool prefetch_next) {
  constexpr int V = 16 / sizeof(T);
  constexpr bool kWeightFirst = fused_bwd_weight_first<T, R, W, OutT, MinCtas>();
  const int cluster = kClusterRows ? cluster_arg : 1;
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  __shared__ AccT slots[2];  // cluster rows: the CTA's sum of a row, by row parity (row_sum)
  const RowLayout L(group, cluster);
  const int64_t N = s.N;
  const int nv = static_cast<int>(N / V);
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
  const bool want_d = dx != nullptr || dr != nullptr;
  AccT dw[Vpt][V] = {};
  int parity = 0;
  for (int64_t first = L.first; first < s.M; first += L.step, parity ^= 1) {
    const int64_t row = first + L.g;
    const bool live = row < s.M;
    // dy, h and dres of the row are loaded together: one round trip to memory per row.
    cuda::RawVec<OutT, V> dyv[Vpt] = {};
    cuda::RawVec<R, V> hv[Vpt] = {}, dresv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (!live || q >= nv) continue;
      const int64_t at = row * N + int64_t(q) * V;
      dyv[j] = load_row_raw<OutT, V>(dy + at);
      hv[j] = load_row_raw<R, V>(h + at);
      if (want_d && dres != nullptr) dresv[j] = load_row_raw<R, V>(dres + at);
    }
    FusedRowWeight<W, AccT, V, Vpt, kWeightFirst> wt;
    if constexpr (kWeightFirst) wt.load(w, s, offset, row, live, L.row_threads, L.u);
    // prefetch_next (a row a CTA, alone on its SM): the CTA's part of its next row's dy, h
    // and dres fetched into L2 before this row's sum, so the memory stays busy while the
    // CTA waits for the sum and stores dx.
    // (Compiled for one-CTA rows of 4 vectors alone, where the policy may set it: in the
    // other kernels its registers would spill.)
    if constexpr (!kClusterRows && MinCtas == 1 && Vpt == 4) {
      const int64_t next = row + L.step;
      if (prefetch_next && threadIdx.x == 0 && next < s.M) {
        const int first_q = L.u - static_cast<int>(threadIdx.x % group);
        prefetch_row_part_l2<Vpt, V>(dy + next * N, nv, L.row_threads, first_q, group);
        prefetch_row_part_l2<Vpt, V>(h + next * N, nv, L.row_threads, first_q, group);
        if (want_d && dres != nullptr) {
          prefetch_row_part_l2<Vpt, V>(dres + next * N, nv, L.row_threads, first_q, group);
        }
      }
    }
    const AccT r = live ? rstd[row] : AccT(0);
    if constexpr (!kWeightFirst) wt.load(w, s, offset, row, live, L.row_threads, L.u);
    const auto add_dw = [&] {
      if (dw_partials == nullptr || !live) return;
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
#pragma unroll
        for (int i = 0; i < V; ++i) {  // zero beyond the row: dyv[j] stays zero there
          dw[j][i] += cuda::raw_elem<AccT, OutT, V>(dyv[j], i) *
                      fused_xhat<T>(cuda::raw_elem<AccT, R, V>(hv[j], i), r, llama);
        }
      }
    };
    if (want_d) {
      AccT sg = 0;
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * L.row_threads + L.u;
        if (!live || q >= nv) continue;
        AccT wo[V];
        wt.at(j, q, wo);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          sg += cuda::raw_elem<AccT, OutT, V>(dyv[j], i) * wo[i] * cuda::raw_elem<AccT, R, V>(hv[j], i);
        }
      }
      sg = row_sum(sg, group, cluster, scratch, slots, parity, [&] {
        if (cluster > 1) add_dw();
      });
      const AccT k = r * r * r * sg / static_cast<AccT>(N);
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * L.row_threads + L.u;
        if (!live || q >= nv) continue;
        const int64_t at = row * N + int64_t(q) * V;
        AccT wo[V], d[V];
        wt.at(j, q, wo);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          d[i] = r * (cuda::raw_elem<AccT, OutT, V>(dyv[j], i) * wo[i]) - cuda::raw_elem<AccT, R, V>(hv[j], i) * k;
        }
        if (dres != nullptr) {
#pragma unroll
          for (int i = 0; i < V; ++i) d[i] += cuda::raw_elem<AccT, R, V>(dresv[j], i);
        }
        if (dx != nullptr) store_row_slice<T, V>(dx + at, d);
        if (dr != nullptr) store_row_slice<R, V>(dr + at, d);
      }
    }
    if (!want_d || cluster == 1) add_dw();
  }
  // The row group's partial row: the CTA's sub-warps add their sums in order g = 0, 1, ...
  AccT* part = dw_partials != nullptr ? dw_partials + int64_t(blockIdx.x / cluster) * N : nullptr;
  const int rows_per_cta = blockDim.x / group;
  for (int g = 0; part != nullptr && g < rows_per_cta; ++g) {
    if (L.g == g) {
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * L.row_threads + L.u;
        if (q >= nv) continue;
        AccT* to = part + int64_t(q) * V;
        if (g > 0) {
          const auto before = load_row_raw<AccT, V>(to);
#pragma unroll
          for (int i = 0; i < V; ++i) dw[j][i] = cuda::raw_elem<AccT, AccT, V>(before, i) + dw[j][i];
        }
        store_row_slice<AccT, V>(to, dw[j]);
      }
    }
    if (rows_per_cta > 1) __syncthreads();
  }
  if (cluster > 1) cluster_sync();  // no CTA leaves while another may still read its slots
}
// Backward of rows streamed through shared memory (kStreamedRows; sm_90): a row a CTA
// of blockDim.x threads × kStreamVpt vectors, thread t taking vectors q = j * blockDim.x
// + t (the register rows' map and sums: the same dx bits). The row's dy, h (and dres)
// are brought into shared memory by bulk copies `stages` rows ahead of their use, so a
// CTA's next rows are in flight while it sums and stores one. Per row (g = dy * wo):
//   s = sum g * h;  d = rstd * g - h * rstd^3 * s / N (+ dres), written to dx and dr;
//   dW: dy * x_hat summed over the CTA's rows in registers, one partial row per CTA,
//   or per launch cluster of `fold` CTAs (fold > 1: fold_dw_in_cluster).
// Stage i % stages holds row i; once every thread has stored row i's d (a barrier) it
// takes row i + stages. The weight stays in registers as loaded.
template <typename T, typename W, typename AccT>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    fused_streamed_backward_kernel(const T* __restrict__ dy, const T* __restrict__ dres, const T* __restrict__ h,
                                   const AccT* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                                   T* __restrict__ dr, AccT* __restrict__ dw_partials, FusedRows s, int stages,
                                   AccT offset, bool llama, int fold) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int V = 16 / sizeof(T);
  constexpr int Vpt = fused::kStreamVpt;
  using Raw = cuda::RawVec<T, V>;
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
  extern __shared__ __align__(16) unsigned char fused_smem[];
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  __shared__ uint64_t full[fused::kMaxStages];
  const int group = blockDim.x;
  const int64_t N = s.N;
  const int nv = static_cast<int>(N / V);
  const int streams = dres != nullptr ? 3 : 2;  // dy, h, dres
  const uint32_t row_bytes = static_cast<uint32_t>(nv * sizeof(Raw));
  const auto staged = [&](int64_t i, int stream) {
    return reinterpret_cast<Raw*>(fused_smem) + ((i % stages) * streams + stream) * Vpt * group;
  };
  const int64_t rows = blockIdx.x < s.M ? (s.M - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const auto row_of = [&](int64_t i) { return int64_t(blockIdx.x) + i * gridDim.x; };
  const cuda::BulkStageRing<fused::kMaxStages> ring{full, stages};
  const auto fetch = [&](int64_t i) {  // thread 0: row i into its stage
    uint64_t* bar = ring.bar(i);
    const int64_t from = row_of(i) * N;
    cuda::mbarrier_expect_bytes(bar, streams * row_bytes);
    cuda::bulk_copy_to_shared(staged(i, 0), dy + from, row_bytes, bar);
    cuda::bulk_copy_to_shared(staged(i, 1), h + from, row_bytes, bar);
    if (dres != nullptr) cuda::bulk_copy_to_shared(staged(i, 2), dres + from, row_bytes, bar);
  };
  ring.start(rows, fetch);
  RawWeight<W, V> wv[Vpt];
#pragma unroll
  for (int j = 0; j < Vpt; ++j) wv[j] = RawWeight<W, V>::load(w, j * group + threadIdx.x, nv);
  const auto wo = [&](int j, int e) { return wv[j].template at<AccT>(e) + offset; };  // offset 0 without w
  const auto mine = [&](int j) { return j * group + int(threadIdx.x) < nv; };
  const bool want_d = dx != nullptr || dr != nullptr;
  AccT dw[Vpt][V] = {};
  AccT r = rows > 0 ? rstd[row_of(0)] : AccT(0);
  AccT r_next = rows > 1 ? rstd[row_of(1)] : AccT(0);
  for (int64_t i = 0; i < rows; ++i) {
    const AccT r_after = i + 2 < rows ? rstd[row_of(i + 2)] : AccT(0);  // loaded two rows ahead of its use
    ring.wait(i);
    const Raw* gs = staged(i, 0) + threadIdx.x;
    const Raw* hs = staged(i, 1) + threadIdx.x;
    AccT part = 0;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!mine(j)) continue;
      const Raw gv = gs[j * group], hv = hs[j * group];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const AccT g = cuda::raw_elem<AccT, T, V>(gv, e), he = cuda::raw_elem<AccT, T, V>(hv, e);
        part += g * wo(j, e) * he;
        if (dw_partials != nullptr) dw[j][e] += g * fused_xhat<T>(he, r, llama);
      }
    }
    const AccT k = r * r * r * cuda::block_sum_once(part, scratch) / static_cast<AccT>(N);
    if (want_d) {
      const int64_t row = row_of(i);
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        if (!mine(j)) continue;
        const Raw gv = gs[j * group], hv = hs[j * group];
        AccT d[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          d[e] = r * (cuda::raw_elem<AccT, T, V>(gv, e) * wo(j, e)) - cuda::raw_elem<AccT, T, V>(hv, e) * k;
        }
        if (dres != nullptr) {
          const Raw rv = staged(i, 2)[j * group + threadIdx.x];
#pragma unroll
          for (int e = 0; e < V; ++e) d[e] += cuda::raw_elem<AccT, T, V>(rv, e);
        }
        const int64_t at = row * N + int64_t(j * group + threadIdx.x) * V;
        if (dx != nullptr) store_row_slice<T, V>(dx + at, d);
        if (dr != nullptr) store_row_slice<T, V>(dr + at, d);
      }
    }
    // Every thread is done with row i's stage and with the block sum's scratch.
    __syncthreads();
    if (threadIdx.x == 0 && i + stages < rows) ring.refill(i + stages, fetch);
    r = r_next;
    r_next = r_after;
  }
  if (dw_partials != nullptr && fold > 1) {
    fold_dw_in_cluster<Vpt, V>(reinterpret_cast<AccT*>(fused_smem), nv, N, fold, group, threadIdx.x, dw_partials,
                               [&](int k) { return dw[k / V][k % V]; });
    cooperative_groups::this_cluster().sync();  // the cluster's CTAs have read this CTA's sums
  } else if (dw_partials != nullptr) {
    AccT* part = dw_partials + int64_t(blockIdx.x) * N;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (mine(j)) store_row_slice<AccT, V>(part + int64_t(j * group + threadIdx.x) * V, dw[j]);
    }
  }
#else
  __trap();  // bulk copies: chosen only on sm_90 and newer
#endif
}

// Backward of cluster rows streamed through shared memory (kStreamedClusterRows; sm_90):
// a row over `cluster` CTAs of blockDim.x threads × kStreamVpt vectors, thread u of the
// row taking vectors q = j * row_threads + u (the register rows' map). The CTA's slices
// of the row's dy, h (and dres: kTensors = 3) are staged by bulk copies kStreamStages
// rows ahead (StreamedRows), and the rows overlapped (StreamedRows::walk_overlapped):
// while row i's sum is in flight over the cluster (between arriving at the barrier and
// waiting there) the CTA computes row i + 1's partial sum and dW terms, and after
// publishing that, row i's d. Stage i % kStreamStages is refilled with row
// i + kStreamStages as soon as row i's d is written (behind a CTA barrier), so the
// refill has a whole row's time, cluster wait included, to land. Per row (g = dy * wo):
//   s = sum g * h;  d = rstd * g - h * rstd^3 * s / N (+ dres), written to dx and dr;
//   dW: dy * x_hat summed over the cluster's rows in registers, one partial row a
//   cluster (each CTA its columns). The weight stays in registers as loaded.
template <typename T, typename W, typename AccT, int kTensors>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    fused_streamed_cluster_backward_kernel(const T* __restrict__ dy, const T* __restrict__ dres,
                                           const T* __restrict__ h, const AccT* __restrict__ rstd,
                                           const W* __restrict__ w, T* __restrict__ dx, T* __restrict__ dr,
                                           AccT* __restrict__ dw_partials, FusedRows s, int cluster, AccT offset,
                                           bool llama) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int V = 16 / sizeof(T);
  constexpr int Vpt = fused::kStreamVpt;
  static_assert(Vpt == rms::kVpt, "StreamedRows stages rms::kVpt vectors a thread");
  using Raw = cuda::RawVec<T, V>;
  cuda::start_next_grid();  // rms_dw_sum_kernel may take its SMs' free slots now
  const auto rows = [&] {
    if constexpr (kTensors == 3) {
      return StreamedRows<T, AccT, V, 3>::make({dy, h, dres}, s.M, static_cast<int>(s.N), cluster);
    } else {
      return StreamedRows<T, AccT, V, 2>::make({dy, h}, s.M, static_cast<int>(s.N), cluster);
    }
  }();
  rows.start();
  RawWeight<W, V> wv[Vpt];
  rows.load_weight(w, wv);
  const auto wo = [&](int j, int e) { return wv[j].template at<AccT>(e) + offset; };  // offset 0 without w
  AccT dw[Vpt * V] = {};
  // Row i's partial sum of g * wo * h (waiting for its stage), its dW terms added.
  const auto partial_sum = [&](int64_t i, AccT r) {
    rows.ring.wait(i);
    AccT sum = 0;
    rows.for_each_pair(i, [&](int j, Raw gv, Raw hv) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const AccT g = cuda::raw_elem<AccT, T, V>(gv, e), he = cuda::raw_elem<AccT, T, V>(hv, e);
        sum += g * wo(j, e) * he;
        if (dw_partials != nullptr) dw[j * V + e] += g * fused_xhat<T>(he, r, llama);
      }
    });
    return sum;
  };
  const auto write_d = [&](int64_t i, AccT r, AccT sg) {
    const AccT k = r * r * r * sg / static_cast<AccT>(s.N);
    const int64_t row = rows.row_of(i);
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!rows.staged.mine(j)) continue;
      const Raw gv = rows.staged.at(i, 0, j), hv = rows.staged.at(i, 1, j);
      AccT d[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        d[e] = r * (cuda::raw_elem<AccT, T, V>(gv, e) * wo(j, e)) - cuda::raw_elem<AccT, T, V>(hv, e) * k;
      }
      const int64_t at = row * s.N + int64_t(j * rows.staged.L.row_threads + rows.staged.L.u) * V;
      if constexpr (kTensors == 3) {
        const Raw rv = rows.staged.at(i, 2, j);
#pragma unroll
        for (int e = 0; e < V; ++e) d[e] += cuda::raw_elem<AccT, T, V>(rv, e);
      }
      if (dx != nullptr) store_row_slice<T, V>(dx + at, d);
      if (dr != nullptr) store_row_slice<T, V>(dr + at, d);
    }
  };
  rows.walk_overlapped(rstd, true, partial_sum, write_d);
  if (dw_partials != nullptr) {
    AccT* part = dw_partials + int64_t(blockIdx.x / cluster) * s.N;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      if (!rows.staged.mine(j)) continue;
      AccT sums[V];
#pragma unroll
      for (int e = 0; e < V; ++e) sums[e] = dw[j * V + e];
      store_row_slice<AccT, V>(part + int64_t(j * rows.staged.L.row_threads + rows.staged.L.u) * V, sums);
    }
  }
  cooperative_groups::this_cluster().sync();  // no CTA leaves while another still reads its slots
#else
  __trap();  // clusters and bulk copies: chosen only on sm_90 and newer
#endif
}

template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    fused_backward_kernel(const OutT* __restrict__ dy, const R* __restrict__ dres, const R* __restrict__ h,
                          const AccT* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                          R* __restrict__ dr, AccT* __restrict__ dw_partials, FusedRows s, int64_t per_cta,
                          AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  const int64_t periods = s.M / s.H;
  const int64_t row_begin = blockIdx.x * per_cta * s.H;
  const int64_t row_end = std::min(periods, (int64_t(blockIdx.x) + 1) * per_cta) * s.H;
  AccT* part = dw_partials != nullptr ? dw_partials + blockIdx.x * s.H * N : nullptr;
  if (part != nullptr) {
    // Same element-to-thread map as the updates below: no barrier needed.
    for (int64_t head = 0; head < s.H; ++head) {
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) part[head * N + j] = AccT(0);
    }
  }
  const bool want_d = dx != nullptr || dr != nullptr;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t base = row * N;
    const int64_t head = row % s.H;
    const W* wr = w != nullptr ? w + head * N : nullptr;
    const AccT r = rstd[row];
    if (want_d) {
      AccT sg = 0;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        sg += static_cast<AccT>(dy[base + j]) * fused_weight<W, AccT>(wr, j, offset) * static_cast<AccT>(h[base + j]);
      }
      const AccT k = r * r * r * cuda::block_sum(sg, scratch) / static_cast<AccT>(N);
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const AccT g = static_cast<AccT>(dy[base + j]) * fused_weight<W, AccT>(wr, j, offset);
        AccT d = r * g - static_cast<AccT>(h[base + j]) * k;
        if (dres != nullptr) d += static_cast<AccT>(dres[base + j]);
        if (dx != nullptr) dx[base + j] = static_cast<T>(d);
        if (dr != nullptr) dr[base + j] = static_cast<R>(d);
      }
    }
    if (part != nullptr) {
      AccT* pr = part + head * N;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        pr[j] += static_cast<AccT>(dy[base + j]) * fused_xhat<T>(static_cast<AccT>(h[base + j]), r, llama);
      }
    }
  }
}

// The policy's config of a backward on the current device.
FusedLaunchConfig fused_backward_config_of(const FusedRows& rows, const at::Tensor& grad_out, const at::Tensor& h,
                                          at::ScalarType input_dtype, bool want_dw) {
  const bool streams_in_dtype = h.scalar_type() == input_dtype && grad_out.scalar_type() == input_dtype;
  return fused_config(rows, input_dtype, true, want_dw, streams_in_dtype);
}

int64_t fused_backward_workspace(const FusedRows& rows, const at::Tensor& grad_out, const at::Tensor& h,
                                 at::ScalarType input_dtype, bool want_dw) {
  const c10::cuda::CUDAGuard guard(h.device());
  return rows.M > 0 ? fused_backward_config_of(rows, grad_out, h, input_dtype, want_dw).workspace : 0;
}

void rms_norm_fused_backward_out_cuda(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out,
                                      const at::Tensor& h, at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                      const std::optional<at::Tensor>& weight, double weight_offset,
                                      c10::string_view casting_name, at::ScalarType input_dtype,
                                      std::array<bool, 3> output_mask, const at::Tensor& grad_input,
                                      const at::Tensor& grad_residual, const at::Tensor& grad_weight,
                                      const at::Tensor& workspace) {
  const char* op = kRmsNormFusedBackwardOp;
  const auto q = fused_backward_request(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset,
                                        casting_name, input_dtype, output_mask, grad_input, grad_residual, grad_weight);
  if (!q.run) return;
  const FusedRows& rows = q.rows;
  const bool want_dx = q.dx, want_dr = q.dr, want_dw = q.dw;
  const c10::cuda::CUDAGuard guard(h.device());
  const FusedLaunchConfig c = fused_backward_config_of(rows, grad_out, h, input_dtype, want_dw);
  check_workspace(op, workspace, c.workspace, 16, h.device());
  if (want_dx) cuda::check_out_aligned(op, "grad_input", grad_input);
  if (want_dr) cuda::check_out_aligned(op, "grad_residual", grad_residual);
  const auto dy = cuda::aligned_contiguous(grad_out);
  const auto dres = has_tensor(grad_residual_out) ? cuda::aligned_contiguous(*grad_residual_out) : at::Tensor();
  const auto hc = cuda::aligned_contiguous(h);
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input_dtype, h.scalar_type() != input_dtype, w.defined() && w.scalar_type() != input_dtype,
                       grad_out.scalar_type() != input_dtype, [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    const OutT* dy_p = dy.const_data_ptr<OutT>();
    const R* dres_p = dres.defined() ? dres.const_data_ptr<R>() : nullptr;
    const R* h_p = hc.const_data_ptr<R>();
    const AccT* rstd_p = r.const_data_ptr<AccT>();
    const W* w_p = w.defined() ? w.const_data_ptr<W>() : nullptr;
    T* dx = want_dx ? grad_input.mutable_data_ptr<T>() : nullptr;
    R* dr = want_dr ? grad_residual.mutable_data_ptr<R>() : nullptr;
    AccT* partials = want_dw ? static_cast<AccT*>(workspace.mutable_data_ptr()) : nullptr;
    const auto offset = static_cast<AccT>(weight_offset);
    const bool llama = q.casting == Casting::kLlama;
    int64_t partial_rows = c.ctas;
    if (!c.register_kind()) {
      const int64_t periods = rows.M / rows.H;
      const int64_t per_cta = ceil_div<int64_t>(periods, c.ctas);
      partial_rows = ceil_div<int64_t>(periods, per_cta);
      fused_backward_kernel<T, R, W, OutT, AccT><<<partial_rows, c.threads, 0, stream>>>(
          dy_p, dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, per_cta, offset, llama);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else if (c.kind == FusedKernel::kStreamedRows) {
      if constexpr (sizeof(T) == 2 && std::is_same_v<R, T> && std::is_same_v<OutT, T>) {
        // Its row groups folding dW in launch clusters of c.dw_fold CTAs where they split
        // into them.
        const auto kernel = fused_streamed_backward_kernel<T, W, AccT>;
        const int64_t groups = launched_row_groups(kernel, c);
        const int fold = groups % c.dw_fold == 0 ? c.dw_fold : 1;
        cuda::launch(kernel, {.grid = dim3(groups), .block = dim3(c.threads), .cluster = fold, .smem = c.smem}, dy_p,
                     dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, c.stages, offset, llama, fold);
        partial_rows = groups / fold;
      } else {
        TORCH_CHECK(false, op, ": no streamed kernel for these dtypes");  // the policy streams 16-bit rows only
      }
    } else if (c.kind == FusedKernel::kStreamedClusterRows) {
      if constexpr ((sizeof(T) == 2 || sizeof(T) == 4) && std::is_same_v<R, T> && std::is_same_v<OutT, T>) {
        const auto launch = [&](auto kernel) {
          return launch_register_rows(kernel, c, dy_p, dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, c.cluster,
                                      offset, llama);
        };
        partial_rows = dres_p != nullptr ? launch(fused_streamed_cluster_backward_kernel<T, W, AccT, 3>)
                                         : launch(fused_streamed_cluster_backward_kernel<T, W, AccT, 2>);
      } else {
        TORCH_CHECK(false, op, ": no streamed kernel for these dtypes");  // the policy streams them in the input's dtype
      }
    } else {
      const bool cluster_rows = c.kind == FusedKernel::kClusterRows;
      const auto kernel =
          c.vpt == 4 ? (cluster_rows ? fused_rows_backward_kernel<T, R, W, OutT, AccT, 4, 1, true>
                                     : fused_rows_backward_kernel<T, R, W, OutT, AccT, 4, 1, false>)
          : c.min_ctas == 2 ? (cluster_rows ? fused_rows_backward_kernel<T, R, W, OutT, AccT, 2, 2, true>
                                            : fused_rows_backward_kernel<T, R, W, OutT, AccT, 2, 2, false>)
                            : fused_rows_backward_kernel<T, R, W, OutT, AccT, 2, 1, false>;
      // the workspace holds c.ctas partial rows, at least as many as the launch's row groups
      partial_rows = launch_register_rows(kernel, c, dy_p, dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, c.group,
                                          c.cluster, offset, llama, c.prefetch_next);
    }
    if (want_dw) launch_rms_dw_sum(partials, grad_weight.mutable_data_ptr<W>(), partial_rows, rows.H * rows.N);
  });
}

// problem = [M, N, H, grad_weight's element size or 0: no dW]
KernelChoice rms_norm_fused_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  return fused_choice(problem, dtype, true);
}

BARACUDA_REGISTER_VARIANT("rms_norm_fused_backward", c10::DeviceType::CUDA, rms_norm_fused_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm_fused_backward",
         &baracuda::rms_norm_fused_backward_functional<baracuda::rms_norm_fused_backward_out_cuda,
                                                       baracuda::fused_backward_workspace>);
  m.impl("rms_norm_fused_backward.out", &baracuda::rms_norm_fused_backward_out_cuda);
}
