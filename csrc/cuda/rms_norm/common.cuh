// rms_norm family, CUDA: what the forward and backward kernels share (the row
// layout, fixed-order row sums, staged weights, dW stores) and the launch glue
// around the policy (baracuda/rms_norm_policy.h).
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
//   - forward rows that need a cluster: Vpt = 2 * kVpt, half the cluster;
//   - forward rows past 512 × 8 vectors on H200-class devices: row clusters, a row a
//     cluster of CTAs of up to 256 threads × 8 vectors and a cluster a row, the sums
//     pushed between the CTAs (ClusterPushFold).
// Backward rows that need a cluster run two CTAs per SM (64 registers) and add
// their dW sums while they wait at the row's cluster barrier; those of a half input
// (H200-class devices, more rows than SMs; elsewhere with a float32 weight) instead
// stage x and dy in shared memory by bulk copies and overlap consecutive rows
// (rms_norm_bwd_streamed_kernel; on H200-class devices CTAs of at most 256 threads,
// two an SM, else 512, one an SM), which
// also takes the backward of half-input rows of one CTA where two or more of its
// CTAs fit an SM. The
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
#pragma once

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
// Launch helpers of forward.cu and backward.cu.

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

// 1 / N for the decode kernels' mean, sum * (1 / N), computed once on the host.
template <typename AccT>
AccT inverse_row_length(int64_t n) {
  return AccT(1) / static_cast<AccT>(n);
}

// The smallest resident row-group count (cuda::resident_groups) over the kernels
// that `c` may launch for a `dtype` input: for half inputs over both weight types,
// so that the choice, and so the dW workspace a Plan reports, cannot depend on the
// weight. with_kernel.template operator()<T, W, AccT, V>(fn) calls fn with the kernel
// that `c` launches for those types (a two-pass kernel: one CTA a row group, no
// dynamic shared memory).
template <typename WithKernel>
int64_t min_resident_row_groups(const RmsLaunchConfig& c, c10::ScalarType dtype, WithKernel&& with_kernel) {
  const int cluster = c.two_pass() ? 1 : c.cluster;
  const int64_t smem = c.two_pass() ? 0 : c.smem;
  int64_t resident = std::numeric_limits<int64_t>::max();
  BARACUDA_DISPATCH_FLOATING(dtype, "rms_norm_resident", [&] {
    for_each_weight_type<scalar_t>([&](auto w_tag) {
      with_vec<scalar_t>(c, [&](auto v_tag) {
        with_kernel.template operator()<scalar_t, decltype(w_tag), acc_t, decltype(v_tag)::value>([&](auto kernel) {
          resident = std::min(resident, cuda::resident_groups(kernel, c.block, cluster, smem));
        });
      });
    });
  });
  return resident;
}

// The policy's config for `p` on the current device, with the runtime's occupancy
// of the kernel it picks (resident(shape): its resident row groups).
template <typename ResidentFn>
RmsLaunchConfig choose_rms(const RmsProblem& p, ResidentFn&& resident) {
  return rms_launch_config(p, cuda::device_facts(),
                           [&](const RmsLaunchConfig& shape) { return RmsOccupancy{resident(shape)}; });
}

// The Plan's variant: the launch config on the current device, kind<name=value,...>.
template <typename ResidentFn>
KernelChoice rms_choice(const RmsProblem& p, ResidentFn&& resident) {
  const LaunchConfigView view = rms_view(choose_rms(p, resident), p);
  return {describe(view), view.workspace_bytes};
}

}  // namespace
}  // namespace baracuda
