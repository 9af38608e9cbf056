// rms_norm_fused and rms_norm_quant forward, CUDA: rows in registers (register and
// decode rows) and the CTA-per-row kernels (see common.cuh; the policy:
// baracuda/rms_norm_fused_policy.h).
#include <limits>

#include "common.cuh"

namespace baracuda {
namespace {

// Pass 1 of a row: h = R(x + r) written to h_out (with a residual), and rstd = 1 / sqrt(mean(h^2) + eps)
// of h as stored, for every thread of the CTA.
template <typename T, typename R, typename AccT>
__device__ __forceinline__ AccT row_rstd(const T* __restrict__ x, const R* __restrict__ res, R* h_out, int64_t base,
                                         int64_t N, AccT eps, cuda::BlockSumScratch<AccT>& scratch) {
  AccT ss = 0;
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
    AccT v;
    if (res != nullptr) {
      const R hv = static_cast<R>(static_cast<AccT>(x[base + j]) + static_cast<AccT>(res[base + j]));
      h_out[base + j] = hv;
      v = static_cast<AccT>(hv);
    } else {
      v = static_cast<AccT>(x[base + j]);
    }
    ss += v * v;
  }
  return AccT(1) / ::sqrt(cuda::block_sum(ss, scratch) / static_cast<AccT>(N) + eps);
}

// Element i of h in a later pass: read back from h_out (written by this same thread in pass 1), or x.
template <typename T, typename R, typename AccT>
__device__ __forceinline__ AccT h_at(const T* __restrict__ x, const R* h_out, bool has_res, int64_t i) {
  return has_res ? static_cast<AccT>(h_out[i]) : static_cast<AccT>(x[i]);
}

// Max across the block (the order does not matter); every thread receives it. Ends with a barrier.
template <typename AccT>
__device__ __forceinline__ AccT block_max(AccT v, cuda::BlockSumScratch<AccT>& scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fp8_amax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) scratch.warp[threadIdx.x / 32] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) / 32;
  for (int k = 0; k < num_warps; ++k) v = fp8_amax(v, scratch.warp[k]);
  __syncthreads();
  return v;
}
// Max over the threads of one row (sub-warp butterfly, or block_max, then the cluster's CTAs
// through distributed shared memory, `slots` alternating by row parity as in row_sum); the
// order does not matter.
template <typename AccT>
__device__ __forceinline__ AccT row_max(AccT v, int group, int cluster, cuda::BlockSumScratch<AccT>& scratch,
                                        AccT* slots, int parity) {
  if (group <= 32) {
    for (int offset = group / 2; offset > 0; offset >>= 1) v = fp8_amax(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
  }
  v = block_max(v, scratch);
  if (cluster == 1) return v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) slots[parity] = v;
  cooperative_groups::this_cluster().barrier_arrive();
#endif
  return cluster_slots_fold(slots, parity, cluster, v, [](AccT a, AccT b) { return fp8_amax(a, b); });
}

// v[0 .. V) as R (exact: the values are R's already), held as raw words.
template <typename R, int V, typename AccT>
__device__ __forceinline__ cuda::RawVec<R, V> raw_of(const AccT (&v)[V]) {
  cuda::Vec<R, V> e;
#pragma unroll
  for (int i = 0; i < V; ++i) e.v[i] = static_cast<R>(v[i]);
  cuda::RawVec<R, V> raw;
  memcpy(&raw, &e, sizeof(raw));
  return raw;
}

// The forward's pointers (rms_norm_fused: y and rstd; rms_norm_quant: q and a static scale or row_scale).
template <typename T, typename R, typename W, typename OutT, typename AccT>
struct FusedForwardArgs {
  using Input = T;
  using Residual = R;
  using Weight = W;
  using Out = OutT;
  using Acc = AccT;
  const T* x;
  const R* res;  // nullptr: no residual (then R == T and h = x)
  const W* w;    // nullptr: no weight
  R* h_out;      // with a residual
  OutT* y;
  AccT* rstd;
  c10::Float8_e4m3fn* q;
  const float* static_scale;  // nullptr: a scale per row, written to row_scale
  float* row_scale;
  FusedRows s;
  AccT eps;
  AccT offset;
  bool llama;
};

// h = R(x + r) of one vector, stored at h_out; without a residual (R == T) h = x.
template <typename T, typename R, typename AccT, int V>
__device__ __forceinline__ cuda::RawVec<R, V> residual_sum(const cuda::RawVec<T, V>& xv, const cuda::RawVec<R, V>& rv,
                                                           bool has_res, R* h_out) {
  cuda::RawVec<R, V> hv{};
  if (!has_res) {
    if constexpr (std::is_same_v<R, T>) hv = xv;
    return hv;
  }
  AccT h[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    h[i] = static_cast<AccT>(static_cast<R>(cuda::raw_elem<AccT, T, V>(xv, i) + cuda::raw_elem<AccT, R, V>(rv, i)));
  }
  store_row_slice<R, V>(h_out, h);
  return raw_of<R, V>(h);
}

// Whether a row's weight vectors are loaded before its sum (FusedRowWeight): where ptxas fits
// them beside the row without spills, i.e. row clusters (128 registers a thread) but
// rms_norm_quant's of 32-byte weight vectors, and rms_norm_fused's register rows of 4
// vectors with 16-byte weight vectors and a residual of the input's dtype.
template <bool kQuant, bool kRowClusters, typename T, typename R, typename W, int Vpt>
constexpr bool fused_weight_first() {
  constexpr bool kWeight16 = sizeof(W) * (16 / sizeof(T)) == 16;
  if constexpr (kRowClusters) return kWeight16 || !kQuant;
  return Vpt <= 4 && !kQuant && kWeight16 && std::is_same_v<R, T>;
}

// The outputs of a row whose h this thread holds (hv[j]: vector q = j * row_threads + u of
// the row, those past nv ignored), whose weight wt holds and whose rstd is r: y and rstd,
// or (kQuant) the row's scale (a static one, or reduce_max(max |y| of the thread) for the
// row's, written) and q.
template <bool kQuant, typename T, typename R, typename W, typename OutT, typename AccT, int V, int Vpt,
          bool kWeightFirst, typename RowMax>
__device__ __forceinline__ void store_fused_outputs(const FusedForwardArgs<T, R, W, OutT, AccT>& a, int64_t row,
                                                    bool live, int row_threads, int u,
                                                    const cuda::RawVec<R, V> (&hv)[Vpt],
                                                    const FusedRowWeight<W, AccT, V, Vpt, kWeightFirst>& wt, AccT r,
                                                    RowMax&& reduce_max) {
  const int64_t N = a.s.N;
  const int nv = static_cast<int>(N / V);
  // y for vector j (element i) of this thread, as OutT rounds it.
  const auto y_at = [&](int j, const AccT (&wo)[V], int i) {
    return fused_output<OutT, T>(cuda::raw_elem<AccT, R, V>(hv[j], i), r, wo[i], a.llama);
  };
  if constexpr (!kQuant) {
    if (live && u == 0) a.rstd[row] = r;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * row_threads + u;
      if (!live || q >= nv) continue;
      AccT wo[V], y[V];
      wt.at(j, q, wo);
#pragma unroll
      for (int i = 0; i < V; ++i) y[i] = static_cast<AccT>(y_at(j, wo, i));
      store_row_slice<OutT, V>(a.y + row * N + int64_t(q) * V, y);
    }
  } else {
    // Calls f(q, y) for each vector q of the row that this thread holds, y(i) its element i
    // as OutT rounds it: once for the row's max, once for q.
    const auto for_each_y = [&](auto&& f) {
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * row_threads + u;
        if (!live || q >= nv) continue;
        AccT wo[V];
        wt.at(j, q, wo);
        f(q, [&](int i) { return static_cast<AccT>(y_at(j, wo, i)); });
      }
    };
    float scale;
    if (a.static_scale != nullptr) {
      scale = *a.static_scale;
    } else {
      AccT amax = 0;
      for_each_y([&](int, auto&& y) {
#pragma unroll
        for (int i = 0; i < V; ++i) amax = fp8_amax(amax, y(i));
      });
      scale = fp8_row_scale(reduce_max(amax));
      if (live && u == 0) a.row_scale[row] = scale;
    }
    for_each_y([&](int q, auto&& y) {
      cuda::Vec<c10::Float8_e4m3fn, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = fp8_quantize(y(i), scale);
      cuda::store_vec<c10::Float8_e4m3fn, V>(a.q + row * N + int64_t(q) * V, out);
    });
  }
}

// Forward (kQuant: rms_norm_quant) of rows in registers (register rows, and cluster rows: a
// row over `cluster` CTAs); see common.cuh. kClusterRows: `cluster` is read (else 1, and the
// kernel is the one-CTA rows' alone, which takes fewer registers). kRowClusters (with
// kClusterRows): a cluster a row and a row a cluster (not persistent: clusters that finish
// make room for new ones, whose loads overlap the others' sums and stores), every load of
// the row first, and the cluster's sums (and maxima) pushed (ClusterPushFold): no cluster
// barrier a row, nor before a CTA exits, but the one that publishes the fold barriers,
// passed after the loads are issued. Where the registers allow (fused_weight_first), the
// row's weight vectors are loaded before its sum, so that their round trips to L2 overlap
// it instead of following one another between y's stores after it.
template <bool kQuant, bool kClusterRows, typename T, typename R, typename W, typename OutT, typename AccT, int Vpt,
          bool kRowClusters = false>
__global__ void __launch_bounds__(kRowClusters ? rms::kRowClusterThreads : kMaxThreads, kRowClusters ? 2 : 1)
    fused_rows_forward_kernel(const FusedForwardArgs<T, R, W, OutT, AccT> a, int group, int cluster_arg) {
  static_assert(kClusterRows || !kRowClusters);
  constexpr int V = 16 / sizeof(T);
  constexpr bool kWeightFirst = fused_weight_first<kQuant, kRowClusters, T, R, W, Vpt>();
  const int cluster = kClusterRows ? cluster_arg : 1;
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  // Cluster rows: the CTA's sum and max of a row, by row parity; row clusters: the CTAs'
  // sums and maxima, by rank, and their fold barriers.
  __shared__ AccT sum_slots[kRowClusters ? rms::kMaxRowCluster : 2], max_slots[kRowClusters ? rms::kMaxRowCluster : 2];
  __shared__ uint64_t fold_bars[2];
  const ClusterPushFold<AccT> sum_fold{sum_slots, &fold_bars[0], cluster}, max_fold{max_slots, &fold_bars[1], cluster};
  const RowLayout L(group, cluster);
  const int64_t N = a.s.N;
  const int nv = static_cast<int>(N / V);
  const bool has_res = a.res != nullptr;
  int parity = 0;
  for (int64_t first = L.first; first < a.s.M; first += L.step, parity ^= 1) {
    const int64_t row = first + L.g;
    const bool live = row < a.s.M;
    cuda::RawVec<R, V> hv[Vpt] = {};
    // Rows of 4 vectors a thread (and row clusters, whose threads have the registers):
    // every load of the row's x and r is issued before any is used, since the h stores
    // below may alias x and r for the compiler, which would keep each vector's loads after
    // the previous vector's store (one round trip to memory a vector, not one a row). Other
    // rows of 8 vectors load vector by vector: x and r of all 8 at once spill at 64 registers.
    constexpr bool kLoadsFirst = Vpt <= 4 || kRowClusters;
    cuda::RawVec<T, V> xs[kLoadsFirst ? Vpt : 1] = {};
    cuda::RawVec<R, V> rs[kLoadsFirst ? Vpt : 1] = {};
    if constexpr (kLoadsFirst) {
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * L.row_threads + L.u;
        if (!live || q >= nv) continue;
        const int64_t at = row * N + int64_t(q) * V;
        xs[j] = cuda::load_raw<T, V>(a.x + at);
        if (has_res) rs[j] = load_row_raw<R, V>(a.res + at);
      }
    }
    if constexpr (kRowClusters) {
      if (threadIdx.x == 0) {
        sum_fold.init();
        if constexpr (kQuant) max_fold.init();
      }
      ClusterPushFold<AccT>::announce();
    }
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (!live || q >= nv) continue;
      const int64_t at = row * N + int64_t(q) * V;
      cuda::RawVec<T, V> xv;
      cuda::RawVec<R, V> rv{};
      if constexpr (kLoadsFirst) {
        xv = xs[j];
        rv = rs[j];
      } else {
        xv = cuda::load_raw<T, V>(a.x + at);
        if (has_res) rv = load_row_raw<R, V>(a.res + at);
      }
      hv[j] = residual_sum<T, R, AccT, V>(xv, rv, has_res, a.h_out + at);
    }
    FusedRowWeight<W, AccT, V, Vpt, kWeightFirst> wt;
    if constexpr (kWeightFirst) wt.load(a.w, a.s, a.offset, row, live, L.row_threads, L.u);
    AccT ss;
    if constexpr (kRowClusters) {
      ss = cuda::block_sum_once(sum_of_squares<AccT, R, V>(hv), scratch);
      cuda::cluster_wait();  // the cluster's fold barriers are initialized
      ss = sum_fold.fold(ss, AccT(0), [](AccT x, AccT y) { return x + y; });
    } else {
      ss = row_sum(sum_of_squares<AccT, R, V>(hv), group, cluster, scratch, sum_slots, parity, [] {});
    }
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + a.eps);
    if constexpr (!kWeightFirst) wt.load(a.w, a.s, a.offset, row, live, L.row_threads, L.u);
    store_fused_outputs<kQuant>(a, row, live, L.row_threads, L.u, hv, wt, r, [&](AccT amax) {
      if constexpr (kRowClusters) {
        __syncthreads();  // every thread has read the scratch's sum
        return max_fold.fold(block_max(amax, scratch), AccT(0), [](AccT x, AccT y) { return fp8_amax(x, y); });
      } else {
        return row_max(amax, group, cluster, scratch, max_slots, parity);
      }
    });
  }
  if (!kRowClusters && cluster > 1) cluster_sync();  // no CTA leaves while another may still read its slots
}

// Forward (kQuant: rms_norm_quant) of decode rows: a CTA holds one row group (the launch has
// no more than the SMs), 2^group_shift threads a row (a sub-warp, several rows a CTA, or the
// whole CTA), Vpt vectors of V elements a thread (vector q = j * group + u):
//   h = R(x + r) (x without a residual), stored to h_out;  ss = sum h^2 (the thread's
//   elements in two chains of fused multiply-adds, then the row's threads);
//   rstd = 1 / sqrt(ss * inv_n + eps);  y = fused_output(h, rstd, w + offset), or
//   q = fp8_quantize(y, scale) (kQuant).
// x, r and the weight (and a static scale) are loaded in one round before any is used. A
// decode launch is one short wave whose time is its instruction path: no row loop, the
// thread's place by shifts and its offsets in 32 bits (decode rows hold M * N < 2^31
// elements: M <= SMs, N <= 2 * kDecodeMaxThreads * V), 1 / N from the host, a missing
// weight read as zeros plus an offset of 1 (the launcher's), y rounded once, and the block
// sum without a barrier after it (the row's max, a second sum, has scratch of its own).
template <bool kQuant, typename T, typename R, typename W, typename OutT, typename AccT, int Vpt>
__global__ void __launch_bounds__(fused::kDecodeMaxThreads)
    fused_decode_forward_kernel(const FusedForwardArgs<T, R, W, OutT, AccT> a, int group_shift, AccT inv_n) {
  constexpr int V = 16 / sizeof(T);
  __shared__ cuda::BlockSumScratch<AccT> sum_scratch, max_scratch;
  AccT* const no_slots = nullptr;  // a decode row is one CTA's (no cluster)
  const int group = 1 << group_shift;
  const int u = threadIdx.x & (group - 1);
  const int row = blockIdx.x * (blockDim.x >> group_shift) + (threadIdx.x >> group_shift);
  const int M = static_cast<int>(a.s.M);
  const bool live = row < M;
  const int N = static_cast<int>(a.s.N);
  const int nv = N / V;
  const int heads = static_cast<int>(a.s.H);  // the weight's rows; H divides M
  const W* wr = a.w != nullptr ? a.w + (heads == 1 || !live ? 0 : row % heads) * N : nullptr;
  float scale = 1.0f;
  if constexpr (kQuant) {
    if (a.static_scale != nullptr) scale = *a.static_scale;
  }
  cuda::RawVec<T, V> xv[Vpt] = {};
  cuda::RawVec<R, V> rv[Vpt] = {};
  cuda::RawVec<W, V> wv[Vpt] = {};
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * group + u;
    if (!live || q >= nv) continue;
    const int at = row * N + q * V;
    xv[j] = cuda::load_raw<T, V>(a.x + at);
    if (a.res != nullptr) rv[j] = load_row_raw<R, V>(a.res + at);
    if (wr != nullptr) wv[j] = load_row_raw<W, V>(wr + q * V);
  }
  AccT h[Vpt][V], chain[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const AccT xe = cuda::raw_elem<AccT, T, V>(xv[j], i);
      h[j][i] = a.res != nullptr ? static_cast<AccT>(static_cast<R>(xe + cuda::raw_elem<AccT, R, V>(rv[j], i))) : xe;
      chain[i % 2] += h[j][i] * h[j][i];
    }
    const int q = j * group + u;
    if (a.res != nullptr && live && q < nv) store_row_slice<R, V>(a.h_out + row * N + q * V, h[j]);
  }
  const AccT ss = row_sum<true>(chain[0] + chain[1], group, 1, sum_scratch, no_slots, 0, [] {});
  const AccT r = rsqrt_acc(ss * inv_n + a.eps);
  // y[j][i] as OutT rounds it.
  OutT y[Vpt][V];
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const AccT wo = cuda::raw_elem<AccT, W, V>(wv[j], i) + a.offset;
      y[j][i] = fused_output<OutT, T>(h[j][i], r, wo, a.llama);
    }
  }
  if constexpr (!kQuant) {
    if (live && u == 0) a.rstd[row] = r;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * group + u;
      if (live && q < nv) store_row_slice<OutT, V>(a.y + row * N + q * V, y[j]);
    }
  } else {
    if (a.static_scale == nullptr) {
      AccT amax = 0;
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + u;
        if (!live || q >= nv) continue;
#pragma unroll
        for (int i = 0; i < V; ++i) amax = fp8_amax(amax, static_cast<AccT>(y[j][i]));
      }
      scale = fp8_row_scale(row_max(amax, group, 1, max_scratch, no_slots, 0));
      if (live && u == 0) a.row_scale[row] = scale;
    }
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * group + u;
      if (!live || q >= nv) continue;
      cuda::Vec<c10::Float8_e4m3fn, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = fp8_quantize(static_cast<AccT>(y[j][i]), scale);
      cuda::store_vec<c10::Float8_e4m3fn, V>(a.q + row * N + q * V, out);
    }
  }
}

template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    fused_forward_kernel(const T* __restrict__ x, const R* __restrict__ res, const W* __restrict__ w,
                         OutT* __restrict__ y, R* h_out, AccT* __restrict__ rstd, FusedRows s, AccT eps,
                         AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  for (int64_t row = blockIdx.x; row < s.M; row += gridDim.x) {
    const int64_t base = row * N;
    const AccT r = row_rstd(x, res, h_out, base, N, eps, scratch);
    if (threadIdx.x == 0) rstd[row] = r;
    const W* wr = w != nullptr ? w + (row % s.H) * N : nullptr;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const AccT v = h_at<T, R, AccT>(x, h_out, res != nullptr, base + j);
      y[base + j] = fused_output<OutT, T>(v, r, fused_weight<W, AccT>(wr, j, offset), llama);
    }
  }
}

// rms_norm_quant: as the forward, then (dynamic scale) a pass for max|y| and the CTA's max, and a
// pass writing q = fp8_quantize(y, scale).
template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    quant_kernel(const T* __restrict__ x, const R* __restrict__ res, const W* __restrict__ w,
                 c10::Float8_e4m3fn* __restrict__ q, R* h_out, const float* __restrict__ static_scale,
                 float* __restrict__ row_scale, FusedRows s, AccT eps, AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  for (int64_t row = blockIdx.x; row < s.M; row += gridDim.x) {
    const int64_t base = row * N;
    const AccT r = row_rstd(x, res, h_out, base, N, eps, scratch);
    const W* wr = w != nullptr ? w + (row % s.H) * N : nullptr;
    auto y_at = [&](int64_t j) {
      const AccT v = h_at<T, R, AccT>(x, h_out, res != nullptr, base + j);
      return static_cast<AccT>(fused_output<OutT, T>(v, r, fused_weight<W, AccT>(wr, j, offset), llama));
    };
    float scale;
    if (static_scale != nullptr) {
      scale = *static_scale;
    } else {
      AccT amax = 0;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) amax = fp8_amax(amax, y_at(j));
      scale = fp8_row_scale(block_max(amax, scratch));
      if (threadIdx.x == 0) row_scale[row] = scale;
    }
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) q[base + j] = fp8_quantize(y_at(j), scale);
  }
}

// The register-row forward of config c: decode rows of 1 or 2 vectors a thread, register and
// cluster rows of 4 or 8.
template <bool kQuant, typename T, typename R, typename W, typename OutT, typename AccT>
void launch_rows_forward(const FusedLaunchConfig& c, const FusedForwardArgs<T, R, W, OutT, AccT>& a) {
  if (c.kind == FusedKernel::kDecodeRows) {
    TORCH_INTERNAL_ASSERT(a.s.M * a.s.N <= std::numeric_limits<int>::max(), "rms_norm_fused: decode rows past 2^31");
    const auto kernel = c.vpt == 1 ? fused_decode_forward_kernel<kQuant, T, R, W, OutT, AccT, 1>
                                   : fused_decode_forward_kernel<kQuant, T, R, W, OutT, AccT, 2>;
    int group_shift = 0;  // c.group = 2^group_shift
    while ((1 << group_shift) < c.group) ++group_shift;
    FusedForwardArgs<T, R, W, OutT, AccT> d = a;
    if (d.w == nullptr) d.offset = AccT(1);  // wo = 0 + 1 (weight_offset is 0 without a weight)
    cuda::launch(kernel, {.grid = dim3(c.ctas), .block = dim3(c.threads)}, d, group_shift,
                 AccT(1) / static_cast<AccT>(a.s.N));
    return;
  }
  if (c.kind == FusedKernel::kRowClusters) {
    // Chosen for a residual of the input's dtype (or none), kRowClusterVpt vectors a thread.
    if constexpr (std::is_same_v<R, T> && sizeof(T) <= 4) {
      TORCH_INTERNAL_ASSERT(c.vpt == rms::kRowClusterVpt && a.s.M * c.cluster <= std::numeric_limits<int>::max(),
                            "rms_norm_fused: row clusters of ", c.vpt, " vectors, ", a.s.M, " rows");
      cuda::launch(fused_rows_forward_kernel<kQuant, true, T, R, W, OutT, AccT, rms::kRowClusterVpt, true>,
                   {.grid = dim3(a.s.M * c.cluster), .block = dim3(c.threads), .cluster = c.cluster}, a, c.group,
                   c.cluster);
      return;
    }
    TORCH_INTERNAL_ASSERT(false, "rms_norm_fused: row clusters of a residual not of the input's dtype");
  }
  const auto kernel =
      c.kind == FusedKernel::kClusterRows ? fused_rows_forward_kernel<kQuant, true, T, R, W, OutT, AccT, 8>
      : c.vpt == 4                        ? fused_rows_forward_kernel<kQuant, false, T, R, W, OutT, AccT, 4>
                                          : fused_rows_forward_kernel<kQuant, false, T, R, W, OutT, AccT, 8>;
  launch_register_rows(kernel, c, a, c.group, c.cluster);
}

// The forward's tensors as the kernels read them: contiguous and 16-byte aligned (a view with an
// offset is copied once), so that the kernel choice depends on the problem alone.
struct FusedForwardInputs {
  at::Tensor x, r, w;

  FusedForwardInputs(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                     const std::optional<at::Tensor>& weight)
      : x(cuda::aligned_contiguous(input)),
        r(has_tensor(residual) ? cuda::aligned_contiguous(*residual) : at::Tensor()),
        w(has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor()) {}
};

// The part of rms_norm_fused and rms_norm_quant that is the same once their arguments are
// checked: on input's device, calls fn(a, c) under the dispatch of the four dtypes (output:
// out_dtype), with c the launch config and a the inputs' pointers (h_out: residual_out's,
// with a residual) and the row constants, its outputs null.
template <typename Fn>
void dispatch_fused_forward(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                            const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
                            Casting casting, const FusedRows& rows, c10::ScalarType out_dtype,
                            const at::Tensor& residual_out, Fn&& fn) {
  const c10::cuda::CUDAGuard guard(input.device());
  const FusedForwardInputs in(input, residual, weight);
  const auto dtype = input.scalar_type();
  const double e = eps.value_or(rms_default_eps(dtype));
  const FusedLaunchConfig c = fused_config(rows, dtype, false, false, !in.r.defined() || in.r.scalar_type() == dtype);
  dispatch_fused_types(dtype, in.r.defined() && in.r.scalar_type() != dtype,
                       in.w.defined() && in.w.scalar_type() != dtype, out_dtype != dtype,
                       [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using AccT = at::opmath_type<T>;
    FusedForwardArgs<T, R, W, decltype(o_tag), AccT> a{};
    a.x = in.x.const_data_ptr<T>();
    a.res = in.r.defined() ? in.r.const_data_ptr<R>() : nullptr;
    a.w = in.w.defined() ? in.w.const_data_ptr<W>() : nullptr;
    a.h_out = a.res != nullptr ? residual_out.mutable_data_ptr<R>() : nullptr;
    a.s = rows;
    a.eps = static_cast<AccT>(e);
    a.offset = static_cast<AccT>(weight_offset);
    a.llama = casting == Casting::kLlama;
    fn(a, c);
  });
}

void rms_norm_fused_out_cuda(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                             const at::Tensor& output, const at::Tensor& residual_out, const at::Tensor& rstd) {
  const char* op = kRmsNormFusedOp;
  const Casting casting = parse_casting(op, casting_name);
  const auto rows = check_rms_norm_fused(op, input, residual, normalized_shape, weight, weight_offset);
  check_fused_forward_outputs(input, residual, normalized_shape, weight, casting, output, residual_out, rstd);
  cuda::check_out_aligned(op, "output", output);
  if (has_tensor(residual)) cuda::check_out_aligned(op, "residual_out", residual_out);
  if (rows.M == 0) return;
  dispatch_fused_forward(input, residual, weight, eps, weight_offset, casting, rows, output.scalar_type(), residual_out,
                         [&](auto a, const FusedLaunchConfig& c) {
    using Args = decltype(a);
    a.y = output.mutable_data_ptr<typename Args::Out>();
    a.rstd = rstd.mutable_data_ptr<typename Args::Acc>();
    if (!c.register_kind()) {
      fused_forward_kernel<typename Args::Input, typename Args::Residual, typename Args::Weight, typename Args::Out,
                           typename Args::Acc><<<c.ctas, c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          a.x, a.res, a.w, a.y, a.h_out, a.rstd, a.s, a.eps, a.offset, a.llama);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_rows_forward<false>(c, a);
    }
  });
}

void rms_norm_quant_out_cuda(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                             const std::optional<at::Tensor>& scale, const at::Tensor& output,
                             const at::Tensor& residual_out, const at::Tensor& scale_out) {
  const char* op = kRmsNormQuantOp;
  const Casting casting = parse_casting(op, casting_name);
  const auto rows = check_rms_norm_fused(op, input, residual, normalized_shape, weight, weight_offset);
  if (has_tensor(scale)) check_fp8_scale(op, input, *scale);
  check_quant_outputs(input, residual, normalized_shape, !has_tensor(scale), output, residual_out, scale_out);
  cuda::check_out_aligned(op, "output", output);
  if (has_tensor(residual)) cuda::check_out_aligned(op, "residual_out", residual_out);
  if (rows.M == 0) return;
  const auto out_dtype = fused_output_dtype(input.scalar_type(), weight, casting);
  dispatch_fused_forward(input, residual, weight, eps, weight_offset, casting, rows, out_dtype, residual_out,
                         [&](auto a, const FusedLaunchConfig& c) {
    using Args = decltype(a);
    a.q = output.mutable_data_ptr<c10::Float8_e4m3fn>();
    a.static_scale = has_tensor(scale) ? scale->const_data_ptr<float>() : nullptr;
    a.row_scale = has_tensor(scale) ? nullptr : scale_out.mutable_data_ptr<float>();
    if (!c.register_kind()) {
      quant_kernel<typename Args::Input, typename Args::Residual, typename Args::Weight, typename Args::Out,
                   typename Args::Acc><<<c.ctas, c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          a.x, a.res, a.w, a.q, a.h_out, a.static_scale, a.row_scale, a.s, a.eps, a.offset, a.llama);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_rows_forward<true>(c, a);
    }
  });
}

// problem = [M, N, H]
KernelChoice rms_norm_fused_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  return fused_choice(problem, dtype, false);
}

BARACUDA_REGISTER_VARIANT("rms_norm_fused", c10::DeviceType::CUDA, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_quant", c10::DeviceType::CUDA, rms_norm_fused_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm_fused", &baracuda::rms_norm_fused_functional<baracuda::rms_norm_fused_out_cuda>);
  m.impl("rms_norm_fused.out", &baracuda::rms_norm_fused_out_cuda);
  m.impl("rms_norm_quant", &baracuda::rms_norm_quant_functional<baracuda::rms_norm_quant_out_cuda>);
  m.impl("rms_norm_quant.out", &baracuda::rms_norm_quant_out_cuda);
}
