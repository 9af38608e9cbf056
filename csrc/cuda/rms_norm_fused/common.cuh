// rms_norm_fused family, CUDA: what the forward (forward.cu: rms_norm_fused and
// rms_norm_quant) and the backward (backward.cu) share. The math:
// baracuda/rms_norm_fused.h; the launch policy: baracuda/rms_norm_fused_policy.h.
//
// Rows in registers, for rows of whole 16-byte vectors of the input (N % V == 0,
// V = 16 / sizeof(T)): a row of nv = N / V vectors is split over `group` threads of a
// CTA (a power of two) times `cluster` CTAs (backward rows longer than a CTA holds),
// thread u of the row holding vectors q = j * group * cluster + u (j < Vpt) as raw
// 32-bit words; group <= 32: a sub-warp, 256 / group rows per CTA; else one row per
// CTA (or cluster). Row sums: each thread's elements in order, then a fixed xor
// butterfly, cuda::block_sum, and the cluster's CTAs in rank order (row_sum), the same
// bits in every thread of the row.
//   Forward: h = R(x + r) is written once and kept (as stored) in registers, so x and
//   r are read once; rstd = 1 / sqrt(mean(h^2) + eps), y = fused_output(h, rstd, w).
//   rms_norm_quant: the same rows, then (dynamic scale) the row's max |y|, and q.
//   Backward: dy, h (and dres) in registers; dx = rstd * g - h * k (+ dres), g = dy * wo,
//   k = rstd^3 * sum(g * h) / N. A thread's dW columns are the same for every row it
//   visits: it sums dy * x_hat over its rows in registers; the CTA's sub-warps add
//   theirs into the row group's partial row in order, and rms_dw_sum_kernel adds the
//   row groups' partials in order. H > 1 (a per-head weight) with dW takes the
//   CTA-per-row kernel. Streamed rows (backward.cu) are the same rows with dy, h and
//   dres staged in shared memory by bulk copies, rows ahead.
//   Floors: forward reads x, r, writes y, h (+ rstd); backward reads dy, h (+ dres),
//   writes dx (+ dr), plus row-group * N dW partials written and read once.
// CTA per row (the general kernels: rows of any length and alignment, per-head dW):
// pass 1 reads x (and r), writes h and sums h^2; pass 2 reads h back (each thread its
// own elements) and writes y. Its backward: CTA c owns a contiguous chunk of weight
// periods (H rows each) and a dW partial [H, N] in the workspace, read and written
// on every row.
// Every sum runs in a fixed order set by the shape and the SM count: bit-identical
// reruns on the same device.
#pragma once

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
#include "baracuda/rms_norm_fused_policy.h"
#include "baracuda/rms_rows.cuh"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using cuda::ceil_div;
using fused::kBwdMaxThreads;
using fused::kMaxThreads;

// wo = w[col .. col + V) + offset as AccT (1 without a weight).
template <typename AccT, typename W, int V>
__device__ __forceinline__ void load_weight_offset(const W* __restrict__ w, int64_t col, AccT offset, AccT (&wo)[V]) {
  load_weight<AccT, W, V>(w, col, wo);
  if (w != nullptr) {
#pragma unroll
    for (int i = 0; i < V; ++i) wo[i] += offset;
  }
}

// A thread's weight vectors of one row, wo = w + offset (1 without a weight), for its
// vectors q = j * row_threads + u: loaded where each is used, or (kFirst) all of them when
// the row's loads are issued, before its sum. Loaded where used, each vector's load follows
// the previous vector's store, or in a branch of its own: one round trip to L2 a vector,
// not one a row overlapped with the row's loads and sum.
template <typename W, typename AccT, int V, int Vpt, bool kFirst>
struct FusedRowWeight {
  const W* wr = nullptr;  // the row's weight (its head's), or nullptr
  AccT offset = 0;
  RawWeight<W, V> raw[kFirst ? Vpt : 1];

  // The row's weight pointer (and, kFirst, its vectors): called before the row's sum
  // with kFirst, else after it (the pointer held across the sum cost registers there).
  __device__ __forceinline__ void load(const W* w, const FusedRows& s, AccT offset_, int64_t row, bool live,
                                       int row_threads, int u) {
    wr = w != nullptr ? w + (live ? row % s.H : 0) * s.N : nullptr;
    offset = offset_;
    if constexpr (kFirst) {
      const int nv = static_cast<int>(s.N / V);
#pragma unroll
      for (int j = 0; j < Vpt; ++j) raw[j] = RawWeight<W, V>::load(wr, j * row_threads + u, nv);
    }
  }

  // wo of this thread's vector j (column vector q).
  __device__ __forceinline__ void at(int j, int q, AccT (&wo)[V]) const {
    if constexpr (kFirst) {
#pragma unroll
      for (int i = 0; i < V; ++i) wo[i] = wr != nullptr ? raw[j].template at<AccT>(i) + offset : AccT(1);
    } else {
      load_weight_offset<AccT, W, V>(wr, int64_t(q) * V, offset, wo);
    }
  }
};

// The policy's config on the current device (streams_in_dtype: the backward's dy, h and
// dres are of the input's dtype).
inline FusedLaunchConfig fused_config(const FusedRows& s, c10::ScalarType dtype, bool backward, bool want_dw,
                                      bool streams_in_dtype = true) {
  const std::array<int64_t, 4> problem{s.M, s.N, s.H, want_dw ? 1 : 0};  // [M, N, H(, dW)]
  FusedProblem p = fused_problem(c10::IntArrayRef(problem.data(), backward ? 4 : 3), dtype, backward);
  p.streams_in_dtype = streams_in_dtype;
  return rms_norm_fused_launch_config(p, cuda::device_facts());
}

// The Plan's variant on the current device: kind<name=value,...>.
inline KernelChoice fused_choice(c10::IntArrayRef problem, c10::ScalarType dtype, bool backward) {
  const LaunchConfigView view = fused_view(
      rms_norm_fused_launch_config(fused_problem(problem, dtype, backward), cuda::device_facts()));
  return {describe(view), view.workspace_bytes};
}

// The row groups a row kernel of config c (register, cluster or streamed rows) launches:
// c.ctas, where c.one_wave cut to one wave of the compiled kernel (its registers can hold
// fewer CTAs per SM than the policy's count; the CTAs past one wave would start only as the
// first finish, and their rows end the launch on idle SMs).
template <typename... KernelArgs>
int64_t launched_row_groups(void (*kernel)(KernelArgs...), const FusedLaunchConfig& c) {
  return c.one_wave ? std::min(c.ctas, cuda::resident_groups(kernel, c.threads, c.cluster, c.smem)) : c.ctas;
}

// Launches a register or cluster row kernel of config c (launched_row_groups of them).
// Returns the row groups launched.
template <typename... KernelArgs, typename... Args>
int64_t launch_register_rows(void (*kernel)(KernelArgs...), const FusedLaunchConfig& c, Args... args) {
  const int64_t groups = launched_row_groups(kernel, c);
  cuda::launch(kernel,
               {.grid = dim3(groups * c.cluster), .block = dim3(c.threads), .cluster = c.cluster, .smem = c.smem},
               args...);
  return groups;
}

}  // namespace
}  // namespace baracuda
