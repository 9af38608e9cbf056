// rms_norm_fused family, CUDA kernels (the math: baracuda/rms_norm_fused.h).
//
// Rows in registers (forward, rms_norm_quant and backward), for rows of whole
// 16-byte vectors of the input (N % V == 0, V = 16 / sizeof(T)) that fit: a row of
// nv = N / V vectors is split over `group` threads (a power of two), thread u holding
// vectors q = j * group + u (j < Vpt) as raw 32-bit words; group <= 32: a sub-warp,
// 256 / group rows per CTA; else one row per CTA of `group` threads. Row sums: each
// thread's elements in order, then a fixed xor butterfly or cuda::block_sum (row_sum),
// the same bits in every thread of the row.
//   Forward: h = R(x + r) is written once and kept (as stored) in registers, so x and
//   r are read once; rstd = 1 / sqrt(mean(h^2) + eps), y = fused_output(h, rstd, w).
//   rms_norm_quant: the same rows, then (dynamic scale) the row's max |y|, and q.
//   Backward: dy, h (and dres) in registers; dx = rstd * g - h * k (+ dres), g = dy * wo,
//   k = rstd^3 * sum(g * h) / N. A thread's dW columns are the same for every row it
//   visits: it sums dy * x_hat over its rows in registers; the CTA's sub-warps add
//   theirs into the CTA's partial row in order, and dw_sum_kernel adds the CTAs'
//   partials in order. H > 1 (a per-head weight) with dW takes the CTA-per-row kernel.
//   Floors: forward reads x, r, writes y, h (+ rstd); backward reads dy, h (+ dres),
//   writes dx (+ dr), plus ctas * N dW partials written and read once.
// CTA per row (the general kernels: rows of any length and alignment, per-head dW):
// pass 1 reads x (and r), writes h and sums h^2; pass 2 reads h back (each thread its
// own elements) and writes y. Its backward: CTA c owns a contiguous chunk of weight
// periods (H rows each) and a dW partial [H, N] in the workspace, read and written
// on every row.
// Every sum runs in a fixed order set by the shape and the SM count: bit-identical
// reruns on the same device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/rms_norm_fused.h"
#include "baracuda/rms_rows.cuh"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using cuda::ceil_div;

constexpr int kMaxThreads = 1024;
constexpr int kBwdMaxThreads = 512;  // backward rows: dy, h and the dW sums in up to 128 registers
constexpr int kRowsBlock = 256;      // CTA size when several short rows share a CTA
constexpr int kSumThreads = 256;     // the dW partials' ordered sum: one column per thread

// ---------------------------------------------------------------------------
// Choice of launch: a pure function of the problem (rows, the input's element size,
// whether dW is summed), and the SM count, used by the launchers and by the Plan API
// (through the variant registry).

struct FusedChoice {
  int threads;        // per CTA
  int group;          // rows in registers: threads per row; 0: the CTA-per-row kernel
  int vpt;            // rows in registers: vectors a thread holds
  int64_t ctas;       // forward: CTAs in flight; backward: dW partial rows
  int64_t workspace;  // backward: bytes of dW partials
  int min_ctas = 1;   // backward rows: CTAs per SM the kernel's registers are capped for
};

int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

int cta_threads(int64_t N) {  // CTA per row: a warp per 4 elements of a row, 32 to 1024
  const int64_t want = ceil_div<int64_t>(ceil_div<int64_t>(N, 4), 32) * 32;
  return static_cast<int>(std::clamp<int64_t>(want, 32, kMaxThreads));
}

// Rows in registers for rows of nv vectors: the fewest vectors per thread of `vpts`
// (ascending) for which the row's threads fit in max_threads; group 0 when none does.
std::pair<int, int> row_split(int64_t nv, std::initializer_list<int> vpts, int max_threads) {
  for (const int vpt : vpts) {
    const int group = pow2_ceil(ceil_div<int64_t>(nv, vpt));
    if (group <= max_threads) return {group, vpt};
  }
  return {0, 0};
}

int64_t resident_ctas(int threads) { return int64_t(cuda::num_sms()) * (2048 / threads); }

// Forward: 4 vectors a thread, 8 for rows of more than 4096 vectors (the held h is
// 16 or 32 registers: N up to 65536 of a 16-bit input).
FusedChoice choose_forward(const FusedRows& s, int64_t elem) {
  const int64_t V = 16 / elem;
  const auto [group, vpt] = s.N % V == 0 ? row_split(s.N / V, {4, 8}, kMaxThreads) : std::pair<int, int>{0, 0};
  if (group == 0) {
    const int threads = cta_threads(s.N);
    return {threads, 0, 0, std::max<int64_t>(1, std::min(s.M, resident_ctas(threads))), 0};
  }
  const int threads = group > 32 ? group : kRowsBlock;
  const int64_t row_groups = ceil_div<int64_t>(s.M, threads / group);
  return {threads, group, vpt, std::max<int64_t>(1, std::min(row_groups, resident_ctas(threads))), 0};
}

// Backward: 2 vectors a thread, 4 for longer rows (dy, h and dres of a 16-bit input with
// float dW sums: 80 to 128 registers), up to 512 threads a row: N up to 16384 (16-bit), 8192
// (float32), 4096 (float64); and 4 where that keeps a row within a warp (a sub-warp row
// sums by shuffles alone, no barrier). A per-head weight with dW: the CTA-per-row kernel.
// A row of 512 threads × 2 vectors (N = 8192 of a 16-bit input) takes 79–85 registers a
// thread, one CTA per SM; capped at 64 (a few bytes of spill), two CTAs fit, the loads of
// one running while the other sums its row (0.87 of copy at [16384, 8192], 0.74 uncapped).
// At 256 threads and fewer three or more CTAs fit uncapped, and the cap's spills cost 8–15%.
FusedChoice choose_backward(const FusedRows& s, int64_t elem, int64_t acc_bytes, bool want_dw) {
  const int64_t V = 16 / elem;
  const bool rows = s.N % V == 0 && (s.H == 1 || !want_dw);
  auto [group, vpt] = rows ? row_split(s.N / V, {2, 4}, kBwdMaxThreads) : std::pair<int, int>{0, 0};
  if (vpt == 2 && group == 64) std::tie(group, vpt) = std::pair<int, int>{32, 4};
  if (group == 0) {
    const int threads = cta_threads(s.N);
    const int64_t periods = s.H > 0 ? s.M / s.H : 0;
    const int64_t ctas = std::max<int64_t>(1, std::min(periods, resident_ctas(threads)));
    return {threads, 0, 0, ctas, want_dw && periods > 0 ? ctas * s.H * s.N * acc_bytes : 0};
  }
  // 80 to 128 registers a thread: at most half the forward's CTAs are resident, and as many
  // dW partial rows (the launch takes one wave of the compiled kernel, at most this many).
  const int threads = group > 32 ? group : kRowsBlock;
  const int64_t row_groups = ceil_div<int64_t>(s.M, threads / group);
  const int64_t ctas = std::max<int64_t>(1, std::min(row_groups, resident_ctas(threads) / 2));
  const int min_ctas = vpt == 2 && group == kBwdMaxThreads ? 2 : 1;
  return {threads, group, vpt, ctas, want_dw ? ctas * s.N * acc_bytes : 0, min_ctas};
}

std::string forward_variant(const FusedChoice& c) {
  if (c.group == 0) return "cta_rows<" + std::to_string(c.threads) + ">";
  return "register_rows<" + std::to_string(c.group) + "x" + std::to_string(c.vpt) +
         (c.min_ctas > 1 ? "," + std::to_string(c.min_ctas) + "_ctas_per_sm" : "") + ">";
}

std::string backward_variant(const FusedChoice& c, bool want_dw) {
  return forward_variant(c) + (want_dw ? "+ordered_dw_sum<" + std::to_string(c.ctas) + " partials>" : "");
}

// ---------------------------------------------------------------------------
// Kernels.

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

// Rows in registers: this thread's row within the CTA (g), its index among the row's
// threads (u), and the grid-stride loop's first row and stride.
struct RowSlot {
  int g;
  int u;
  int64_t first;
  int64_t step;

  __device__ explicit RowSlot(int group) {
    const int rows_per_cta = blockDim.x / group;
    g = threadIdx.x / group;
    u = threadIdx.x % group;
    first = int64_t(blockIdx.x) * rows_per_cta;
    step = int64_t(gridDim.x) * rows_per_cta;
  }
};

// Sum over the threads of one row (row_sum without a cluster), the same bits in each.
template <typename AccT>
__device__ __forceinline__ AccT sum_in_row(AccT v, int group, cuda::BlockSumScratch<AccT>& scratch) {
  return row_sum(v, group, 1, scratch, static_cast<AccT*>(nullptr), 0, [] {});
}

// Max over the threads of one row (sub-warp butterfly, or block_max); the order does not matter.
template <typename AccT>
__device__ __forceinline__ AccT row_max(AccT v, int group, cuda::BlockSumScratch<AccT>& scratch) {
  if (group > 32) return block_max(v, scratch);
  for (int offset = group / 2; offset > 0; offset >>= 1) v = fp8_amax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// wo = w[col .. col + V) + offset as AccT (1 without a weight).
template <typename AccT, typename W, int V>
__device__ __forceinline__ void load_weight_offset(const W* __restrict__ w, int64_t col, AccT offset, AccT (&wo)[V]) {
  load_weight<AccT, W, V>(w, col, wo);
  if (w != nullptr) {
#pragma unroll
    for (int i = 0; i < V; ++i) wo[i] += offset;
  }
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

// Forward (kQuant: rms_norm_quant) of rows in registers; see the top of the file.
template <bool kQuant, typename T, typename R, typename W, typename OutT, typename AccT, int Vpt>
__global__ void __launch_bounds__(kMaxThreads)
    fused_rows_forward_kernel(const FusedForwardArgs<T, R, W, OutT, AccT> a, int group) {
  constexpr int V = 16 / sizeof(T);
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const RowSlot L(group);
  const int64_t N = a.s.N;
  const int nv = static_cast<int>(N / V);
  for (int64_t first = L.first; first < a.s.M; first += L.step) {
    const int64_t row = first + L.g;
    const bool live = row < a.s.M;
    cuda::RawVec<R, V> hv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * group + L.u;
      if (!live || q >= nv) continue;
      const int64_t at = row * N + int64_t(q) * V;
      const auto xv = cuda::load_raw<T, V>(a.x + at);
      if (a.res == nullptr) {
        if constexpr (std::is_same_v<R, T>) hv[j] = xv;
      } else {
        const auto rv = load_row_raw<R, V>(a.res + at);
        AccT h[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          h[i] = static_cast<AccT>(static_cast<R>(cuda::raw_elem<AccT, T, V>(xv, i) +
                                                  cuda::raw_elem<AccT, R, V>(rv, i)));
        }
        store_row_slice<R, V>(a.h_out + at, h);
        hv[j] = raw_of<R, V>(h);
      }
    }
    const AccT ss = sum_in_row(sum_of_squares<AccT, R, V>(hv), group, scratch);
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + a.eps);
    const W* wr = a.w != nullptr ? a.w + (live ? row % a.s.H : 0) * N : nullptr;
    // y for vector j (element i) of this thread, as OutT rounds it.
    const auto y_at = [&](int j, const AccT (&wo)[V], int i) {
      return fused_output<OutT, T>(cuda::raw_elem<AccT, R, V>(hv[j], i), r, wo[i], a.llama);
    };
    if constexpr (!kQuant) {
      if (live && L.u == 0) a.rstd[row] = r;
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + L.u;
        if (!live || q >= nv) continue;
        AccT wo[V], y[V];
        load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, a.offset, wo);
#pragma unroll
        for (int i = 0; i < V; ++i) y[i] = static_cast<AccT>(y_at(j, wo, i));
        store_row_slice<OutT, V>(a.y + row * N + int64_t(q) * V, y);
      }
    } else {
      float scale;
      if (a.static_scale != nullptr) {
        scale = *a.static_scale;
      } else {
        AccT amax = 0;
#pragma unroll
        for (int j = 0; j < Vpt; ++j) {
          const int q = j * group + L.u;
          if (!live || q >= nv) continue;
          AccT wo[V];
          load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, a.offset, wo);
#pragma unroll
          for (int i = 0; i < V; ++i) amax = fp8_amax(amax, static_cast<AccT>(y_at(j, wo, i)));
        }
        scale = fp8_row_scale(row_max(amax, group, scratch));
        if (live && L.u == 0) a.row_scale[row] = scale;
      }
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + L.u;
        if (!live || q >= nv) continue;
        AccT wo[V];
        load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, a.offset, wo);
        cuda::Vec<c10::Float8_e4m3fn, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = fp8_quantize(static_cast<AccT>(y_at(j, wo, i)), scale);
        cuda::store_vec<c10::Float8_e4m3fn, V>(a.q + row * N + int64_t(q) * V, out);
      }
    }
  }
}

// Backward of rows in registers; see the top of the file. dw_partials: gridDim.x rows of N
// (nullptr: no dW; then the weight may be per head).
template <typename T, typename R, typename W, typename OutT, typename AccT, int Vpt, int MinCtas>
__global__ void __launch_bounds__(kBwdMaxThreads, MinCtas)
    fused_rows_backward_kernel(const OutT* __restrict__ dy, const R* __restrict__ dres, const R* __restrict__ h,
                               const AccT* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                               R* __restrict__ dr, AccT* __restrict__ dw_partials, FusedRows s, int group,
                               AccT offset, bool llama) {
  constexpr int V = 16 / sizeof(T);
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const RowSlot L(group);
  const int64_t N = s.N;
  const int nv = static_cast<int>(N / V);
  const bool want_d = dx != nullptr || dr != nullptr;
  AccT dw[Vpt][V] = {};
  for (int64_t first = L.first; first < s.M; first += L.step) {
    const int64_t row = first + L.g;
    const bool live = row < s.M;
    // dy, h and dres of the row are loaded together: one round trip to memory per row.
    cuda::RawVec<OutT, V> dyv[Vpt] = {};
    cuda::RawVec<R, V> hv[Vpt] = {}, dresv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * group + L.u;
      if (!live || q >= nv) continue;
      const int64_t at = row * N + int64_t(q) * V;
      dyv[j] = load_row_raw<OutT, V>(dy + at);
      hv[j] = load_row_raw<R, V>(h + at);
      if (want_d && dres != nullptr) dresv[j] = load_row_raw<R, V>(dres + at);
    }
    const AccT r = live ? rstd[row] : AccT(0);
    const W* wr = w != nullptr ? w + (live ? row % s.H : 0) * N : nullptr;
    if (want_d) {
      AccT sg = 0;
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + L.u;
        if (!live || q >= nv) continue;
        AccT wo[V];
        load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, offset, wo);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          sg += cuda::raw_elem<AccT, OutT, V>(dyv[j], i) * wo[i] * cuda::raw_elem<AccT, R, V>(hv[j], i);
        }
      }
      const AccT k = r * r * r * sum_in_row(sg, group, scratch) / static_cast<AccT>(N);
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + L.u;
        if (!live || q >= nv) continue;
        const int64_t at = row * N + int64_t(q) * V;
        AccT wo[V], d[V];
        load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, offset, wo);
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
    if (dw_partials != nullptr && live) {
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
#pragma unroll
        for (int i = 0; i < V; ++i) {  // zero beyond the row: dyv[j] stays zero there
          dw[j][i] += cuda::raw_elem<AccT, OutT, V>(dyv[j], i) *
                      fused_xhat<T>(cuda::raw_elem<AccT, R, V>(hv[j], i), r, llama);
        }
      }
    }
  }
  if (dw_partials == nullptr) return;
  // The CTA's partial row: its rows' sub-warps add their sums in order g = 0, 1, ...
  AccT* part = dw_partials + int64_t(blockIdx.x) * N;
  const int rows_per_cta = blockDim.x / group;
  for (int g = 0; g < rows_per_cta; ++g) {
    if (L.g == g) {
#pragma unroll
      for (int j = 0; j < Vpt; ++j) {
        const int q = j * group + L.u;
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

// partials: gridDim.x rows of H * N (only with dw_partials != nullptr).
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

// dw[col] = sum over c of partials[c][col], c in order.
template <typename W, typename AccT>
__global__ void __launch_bounds__(kSumThreads)
    dw_sum_kernel(const AccT* __restrict__ partials, W* __restrict__ dw, int64_t chunks, int64_t cols) {
  const int64_t col = int64_t(blockIdx.x) * kSumThreads + threadIdx.x;
  if (col >= cols) return;
  AccT sum = 0;
  for (int64_t c = 0; c < chunks; ++c) sum += partials[c * cols + col];
  dw[col] = static_cast<W>(sum);
}

// ---------------------------------------------------------------------------
// Glue.

// The register-row kernels' grid: the choice's, cut to one wave of the compiled kernel. Its
// registers can hold fewer CTAs per SM than the choice's 2048-thread count; the CTAs past one
// wave would start only as the first finish, and their rows end the launch on idle SMs.
template <typename... Args>
int64_t one_wave(void (*kernel)(Args...), const FusedChoice& c) {
  return std::min(c.ctas, cuda::resident_groups(kernel, c.threads, 1, 0));
}

template <bool kQuant, typename T, typename R, typename W, typename OutT, typename AccT>
void launch_rows_forward(const FusedChoice& c, const FusedForwardArgs<T, R, W, OutT, AccT>& a, cudaStream_t stream) {
  const auto kernel = c.vpt == 4 ? fused_rows_forward_kernel<kQuant, T, R, W, OutT, AccT, 4>
                                 : fused_rows_forward_kernel<kQuant, T, R, W, OutT, AccT, 8>;
  kernel<<<one_wave(kernel, c), c.threads, 0, stream>>>(a, c.group);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  const c10::cuda::CUDAGuard guard(input.device());
  const FusedForwardInputs in(input, residual, weight);
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const FusedChoice c = choose_forward(rows, input.element_size());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input.scalar_type(), in.r.defined() && in.r.scalar_type() != input.scalar_type(),
                       in.w.defined() && in.w.scalar_type() != input.scalar_type(),
                       output.scalar_type() != input.scalar_type(), [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    const T* x = in.x.const_data_ptr<T>();
    const R* r = in.r.defined() ? in.r.const_data_ptr<R>() : nullptr;
    const W* w = in.w.defined() ? in.w.const_data_ptr<W>() : nullptr;
    R* h_out = r != nullptr ? residual_out.mutable_data_ptr<R>() : nullptr;
    const auto e_acc = static_cast<AccT>(e), offset = static_cast<AccT>(weight_offset);
    const bool llama = casting == Casting::kLlama;
    if (c.group == 0) {
      fused_forward_kernel<T, R, W, OutT, AccT><<<c.ctas, c.threads, 0, stream>>>(
          x, r, w, output.mutable_data_ptr<OutT>(), h_out, rstd.mutable_data_ptr<AccT>(), rows, e_acc, offset, llama);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_rows_forward<false>(c, FusedForwardArgs<T, R, W, OutT, AccT>{
          x, r, w, h_out, output.mutable_data_ptr<OutT>(), rstd.mutable_data_ptr<AccT>(), nullptr, nullptr, nullptr,
          rows, e_acc, offset, llama}, stream);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name) {
  const Casting casting = parse_casting(kRmsNormFusedOp, casting_name);
  check_rms_norm_fused(kRmsNormFusedOp, input, residual, normalized_shape, weight, weight_offset);
  auto [output, residual_out, rstd] = empty_rms_norm_fused_outputs(input, residual, normalized_shape, weight, casting);
  rms_norm_fused_out_cuda(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, output,
                          residual_out, rstd);
  return {output, residual_out, rstd};
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
  const c10::cuda::CUDAGuard guard(input.device());
  const FusedForwardInputs in(input, residual, weight);
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const auto out_dtype = fused_output_dtype(input.scalar_type(), weight, casting);
  const FusedChoice c = choose_forward(rows, input.element_size());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input.scalar_type(), in.r.defined() && in.r.scalar_type() != input.scalar_type(),
                       in.w.defined() && in.w.scalar_type() != input.scalar_type(), out_dtype != input.scalar_type(),
                       [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    const T* x = in.x.const_data_ptr<T>();
    const R* r = in.r.defined() ? in.r.const_data_ptr<R>() : nullptr;
    const W* w = in.w.defined() ? in.w.const_data_ptr<W>() : nullptr;
    R* h_out = r != nullptr ? residual_out.mutable_data_ptr<R>() : nullptr;
    auto* q = output.mutable_data_ptr<c10::Float8_e4m3fn>();
    const float* static_scale = has_tensor(scale) ? scale->const_data_ptr<float>() : nullptr;
    float* row_scale = has_tensor(scale) ? nullptr : scale_out.mutable_data_ptr<float>();
    const auto e_acc = static_cast<AccT>(e), offset = static_cast<AccT>(weight_offset);
    const bool llama = casting == Casting::kLlama;
    if (c.group == 0) {
      quant_kernel<T, R, W, OutT, AccT><<<c.ctas, c.threads, 0, stream>>>(x, r, w, q, h_out, static_scale, row_scale,
                                                                          rows, e_acc, offset, llama);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_rows_forward<true>(c, FusedForwardArgs<T, R, W, OutT, AccT>{
          x, r, w, h_out, nullptr, nullptr, q, static_scale, row_scale, rows, e_acc, offset, llama}, stream);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_quant_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name, const std::optional<at::Tensor>& scale) {
  parse_casting(kRmsNormQuantOp, casting_name);
  check_rms_norm_fused(kRmsNormQuantOp, input, residual, normalized_shape, weight, weight_offset);
  auto [output, residual_out, scale_out] = empty_rms_norm_quant_outputs(input, residual, normalized_shape, scale);
  rms_norm_quant_out_cuda(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, scale, output,
                          residual_out, scale_out);
  return {output, residual_out, scale_out};
}

int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == at::kDouble ? 8 : 4; }

void rms_norm_fused_backward_out_cuda(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out,
                                      const at::Tensor& h, at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                      const std::optional<at::Tensor>& weight, double weight_offset,
                                      c10::string_view casting_name, at::ScalarType input_dtype,
                                      std::array<bool, 3> output_mask, const at::Tensor& grad_input,
                                      const at::Tensor& grad_residual, const at::Tensor& grad_weight,
                                      const at::Tensor& workspace) {
  const char* op = kRmsNormFusedBackwardOp;
  const Casting casting = parse_casting(op, casting_name);
  const auto rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                  weight_offset, casting, input_dtype);
  const bool want_dx = output_mask[0], want_dr = output_mask[1];
  const bool want_dw = output_mask[2] && has_tensor(weight);
  check_fused_backward_outputs(h, weight, input_dtype, output_mask, grad_input, grad_residual, grad_weight);
  if (rows.N == 0 || (!want_dx && !want_dr && !want_dw)) return;
  const c10::cuda::CUDAGuard guard(h.device());
  if (rows.M == 0) {
    if (want_dw) grad_weight.zero_();
    return;
  }
  const FusedChoice c = choose_backward(rows, c10::elementSize(input_dtype), acc_bytes_of(input_dtype), want_dw);
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
    const bool llama = casting == Casting::kLlama;
    int64_t partial_rows = c.ctas;
    if (c.group == 0) {
      const int64_t periods = rows.M / rows.H;
      const int64_t per_cta = ceil_div<int64_t>(periods, c.ctas);
      partial_rows = ceil_div<int64_t>(periods, per_cta);
      fused_backward_kernel<T, R, W, OutT, AccT><<<partial_rows, c.threads, 0, stream>>>(
          dy_p, dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, per_cta, offset, llama);
    } else {
      const auto kernel = c.vpt == 4      ? fused_rows_backward_kernel<T, R, W, OutT, AccT, 4, 1>
                          : c.min_ctas == 2 ? fused_rows_backward_kernel<T, R, W, OutT, AccT, 2, 2>
                                            : fused_rows_backward_kernel<T, R, W, OutT, AccT, 2, 1>;
      partial_rows = one_wave(kernel, c);  // the workspace holds c.ctas partial rows, at least these
      kernel<<<partial_rows, c.threads, 0, stream>>>(dy_p, dres_p, h_p, rstd_p, w_p, dx, dr, partials, rows, c.group,
                                                     offset, llama);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (want_dw) {
      const int64_t cols = rows.H * rows.N;
      dw_sum_kernel<W, AccT><<<ceil_div<int64_t>(cols, kSumThreads), kSumThreads, 0, stream>>>(
          partials, grad_weight.mutable_data_ptr<W>(), partial_rows, cols);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_backward_cuda(
    const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out, const at::Tensor& h,
    at::IntArrayRef normalized_shape, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    double weight_offset, c10::string_view casting_name, at::ScalarType input_dtype, std::array<bool, 3> output_mask) {
  const Casting casting = parse_casting(kRmsNormFusedBackwardOp, casting_name);
  const auto rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                  weight_offset, casting, input_dtype);
  const c10::cuda::CUDAGuard guard(h.device());
  auto [grad_input, grad_residual, grad_weight] = empty_rms_norm_fused_grads(h, weight, input_dtype, output_mask);
  const bool want_dw = grad_weight.defined();
  const auto none = at::empty({0}, h.options());
  const int64_t need =
      rows.M > 0 ? choose_backward(rows, c10::elementSize(input_dtype), acc_bytes_of(input_dtype), want_dw).workspace
                 : 0;
  rms_norm_fused_backward_out_cuda(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset,
                                   casting_name, input_dtype, output_mask, grad_input.defined() ? grad_input : none,
                                   grad_residual.defined() ? grad_residual : none,
                                   grad_weight.defined() ? grad_weight : none,
                                   at::empty({need}, h.options().dtype(at::kByte)));
  return {grad_input, grad_residual, grad_weight};
}

// problem = [M, N, H] (forward), [M, N, H, grad_weight's element size or 0: no dW] (backward)
KernelChoice rms_norm_fused_choice(c10::IntArrayRef p, c10::ScalarType dtype) {
  return {forward_variant(choose_forward({p[0], p[1], p[2]}, c10::elementSize(dtype))), 0};
}

KernelChoice rms_norm_fused_backward_choice(c10::IntArrayRef p, c10::ScalarType dtype) {
  const bool want_dw = p[3] > 0;
  const FusedChoice c = choose_backward({p[0], p[1], p[2]}, c10::elementSize(dtype), acc_bytes_of(dtype), want_dw);
  return {backward_variant(c, want_dw), p[0] > 0 && p[1] > 0 ? c.workspace : 0};
}

BARACUDA_REGISTER_VARIANT("rms_norm_fused", c10::DeviceType::CUDA, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_quant", c10::DeviceType::CUDA, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_fused_backward", c10::DeviceType::CUDA, rms_norm_fused_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm_fused", &baracuda::rms_norm_fused_cuda);
  m.impl("rms_norm_fused.out", &baracuda::rms_norm_fused_out_cuda);
  m.impl("rms_norm_quant", &baracuda::rms_norm_quant_cuda);
  m.impl("rms_norm_quant.out", &baracuda::rms_norm_quant_out_cuda);
  m.impl("rms_norm_fused_backward", &baracuda::rms_norm_fused_backward_cuda);
  m.impl("rms_norm_fused_backward.out", &baracuda::rms_norm_fused_backward_out_cuda);
}
