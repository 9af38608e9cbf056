// rms_norm_fused's CUDA launch policy (baracuda/launch_policy.h), shared by
// rms_norm_fused, rms_norm_quant and rms_norm_fused_backward: which kernel runs a
// problem and with what shape, as a pure function of the problem and the device's facts.
//
// The input is [M, N] rows, the weight H rows of N (a per-head weight: H > 1). Rows of
// whole 16-byte vectors (N % V == 0, V = 16 / element size) are held in registers: a
// row's nv = N / V vectors are split over `group` threads of a CTA (a power of two; a
// sub-warp when group <= 32, kRowsBlock / group rows a CTA) times `cluster` CTAs of a
// thread-block cluster, thread u holding vectors q = j * group * cluster + u (j < vpt).
// The kernel kinds (csrc/cuda/rms_norm_fused/):
//   kRegisterRows  a row in one CTA (or a sub-warp), 4 or 8 vectors a thread
//                  (forward), 2 or 4 (backward);
//   kDecodeRows    forward of no more rows than SMs: each CTA one row group, at most
//                  kDecodeMaxThreads threads of 1 or 2 vectors, the weight loaded with
//                  x and r (one round trip to memory before the stores, not two);
//   kClusterRows   rows longer than one CTA holds (sm_90; backward past 512 × 4
//                  vectors, forward past 1024 × 8 of elements of at most 4 bytes): a
//                  row a cluster of 512-thread CTAs, whose sums meet in distributed
//                  shared memory; in the backward each CTA keeps its columns' dW sums
//                  in registers;
//   kRowClusters   forward rows past 1024 × 4 vectors of an input of at most 4 bytes whose
//                  residual (if any) is of its dtype, on H200-class bandwidth (sm_90): a row a
//                  cluster of 2 to 16 CTAs of up to rms::kRowClusterThreads × 8 vectors, a cluster
//                  a row (not persistent), every load of the row first, the CTAs' sums pushed
//                  to each other (st.async on mbarriers) instead of met at a cluster barrier;
//   kStreamedRows  backward rows of one CTA of a 16-bit input whose dy, h and dres are
//                  of its dtype, one weight row (a thread holds its weight vectors for all
//                  its rows), past the decode rows, on H200-class bandwidth (sm_90): 4
//                  vectors a thread, dy, h and dres staged by bulk copies in 2 or 3 rows
//                  of shared memory ahead of their use;
//   kStreamedClusterRows  backward cluster rows of a 16-bit or float32 input whose dy, h and
//                  dres are of its dtype, one weight row, more rows than SMs, on H200-class
//                  bandwidth (sm_90): clusters of up to 16 CTAs of at most
//                  kStreamedClusterThreads × 4 vectors, dy, h and dres staged 3 rows
//                  ahead, where kStreamedClusterCtas of them fit an SM;
//   kCtaRows       everything else (rows not of whole vectors, the dW of a per-head
//                  weight, rows too long for a cluster): a CTA a row, two passes.
// Backward dW (deterministic, no atomics): each row group (CTA or cluster) writes a
// partial row, which a second kernel sums in order.
//
// Plain C++ (compiled into CPU-only builds): the launchers call rms_norm_fused_launch_config
// with cuda::device_facts(), the Plan API and the CPU tests with recorded facts.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "baracuda/errors.h"
#include "baracuda/launch_policy.h"
#include "baracuda/rms_norm_policy.h"

namespace baracuda {
namespace fused {

constexpr int kMaxThreads = 1024;       // forward register rows: a row's threads, at most
constexpr int kBwdMaxThreads = 512;     // backward rows: dy, h and the dW sums in up to 128 registers
constexpr int kRowsBlock = 256;         // CTA size when several short rows share a CTA
constexpr int kDecodeMaxThreads = 512;  // decode rows: threads a row, at most
constexpr int kMaxCluster = 8;          // portable thread-block cluster size
constexpr int kStreamVpt = 4;           // streamed backward rows: vectors a thread
constexpr int kStreams = 3;             // streamed backward rows: dy, h and dres staged
constexpr int kMaxStages = 3;           // streamed backward rows: rows staged, at most
constexpr int kStreamedClusterThreads = 128;  // streamed backward cluster rows: a CTA's threads, at most
constexpr int kStreamedClusterCtas = 3;       // ... and the CTAs an SM's shared memory must hold
constexpr int64_t kCtaSmemReserve = 2048;  // a CTA's shared memory beside its stages: the
                                           // runtime's 1 KB, block-sum scratch, mbarriers

using rms::ceil_div;
using rms::pow2_ceil;

}  // namespace fused

struct FusedProblem {
  int64_t M = 0, N = 0, H = 1;  // rows, row length, weight rows
  int64_t elem = 2;             // the input's element size
  int64_t acc_bytes = 4;        // float32 sums (float64 for a float64 input)
  bool backward = false;
  bool dw = false;              // backward: grad_weight is computed
  bool streams_in_dtype = true; // backward: dy, h and dres of the input's dtype; forward: the
                                // residual (if any) of the input's dtype
};

enum class FusedKernel {
  kEmpty,
  kRegisterRows,
  kDecodeRows,
  kClusterRows,
  kStreamedRows,
  kStreamedClusterRows,
  kRowClusters,
  kCtaRows
};

struct FusedLaunchConfig {
  FusedKernel kind = FusedKernel::kEmpty;  // M == 0 or N == 0: no kernel runs
  int threads = 0;      // per CTA
  int group = 0;        // register kinds: threads of a row within a CTA
  int cluster = 1;      // CTAs of a row
  int vpt = 0;          // register kinds: vectors a thread holds
  int min_ctas = 1;     // backward rows: CTAs per SM the kernel's registers are capped for
  int stages = 0;       // kStreamedRows: rows of dy, h and dres staged in shared memory
  int64_t smem = 0;     // kStreamedRows: their dynamic shared-memory bytes per CTA
  int64_t ctas = 0;     // row groups (CTAs, or clusters) launched at most; backward: dW partial rows
  bool one_wave = true;  // register kinds: the launch is cut to one wave of the compiled kernel
                         // (its rows by grid stride); else a CTA (or cluster) per row group
  bool prefetch_next = false;  // backward kRegisterRows: each CTA fetches its next row into L2 (fused_prefetches_next)
  int64_t workspace = 0;  // backward: bytes of the dW partial rows
  int dw_fold = 1;        // backward kStreamedRows: CTAs of a launch cluster that add their dW sums
                          // into one partial row (rms_dw_fold)

  bool register_kind() const {
    return kind == FusedKernel::kRegisterRows || kind == FusedKernel::kDecodeRows ||
           kind == FusedKernel::kClusterRows || kind == FusedKernel::kStreamedRows ||
           kind == FusedKernel::kStreamedClusterRows || kind == FusedKernel::kRowClusters;
  }
};

// Rows in registers for rows of nv vectors: the fewest vectors per thread of `vpts`
// (ascending) for which the row's threads (a power of two) fit in max_threads;
// {0, 0} when none does.
inline std::pair<int, int> fused_row_split(int64_t nv, std::initializer_list<int> vpts, int max_threads) {
  for (const int vpt : vpts) {
    const int group = fused::pow2_ceil(fused::ceil_div<int64_t>(nv, vpt));
    if (group <= max_threads) return {group, vpt};
  }
  return {0, 0};
}

// CTAs of `threads` the device holds at once, by threads alone.
inline int64_t fused_resident_ctas(int threads, const DeviceFacts& f) {
  return int64_t(f.num_sms) * (f.max_threads_per_sm / threads);
}

// CTA per row: a warp per 4 elements of a row, 32 to 1024 threads.
inline int fused_cta_threads(int64_t N) {
  const int64_t want = fused::ceil_div<int64_t>(fused::ceil_div<int64_t>(N, 4), 32) * 32;
  return static_cast<int>(std::clamp<int64_t>(want, 32, fused::kMaxThreads));
}

// Backward register rows of 16-bit inputs of one 512-thread CTA (512 x 4 vectors, one CTA
// an SM at up to 128 registers), more rows than SMs, on devices of
// kStreamedRowsMinBandwidth: each CTA fetches its next row's dy, h and dres into L2 before
// it sums this one, so the memory stays busy while it waits for the sum and stores dx
// (0.94 of copy at [8192, 16384] bf16 on an H200, where the same kernel without it
// reaches 0.90). Float32 rows of 512 x 4 were 5% slower with it, the forward's 1024 x 8
// rows 14-20% slower.
inline bool fused_prefetches_next(const FusedLaunchConfig& c, const FusedProblem& p, const DeviceFacts& f) {
  return p.backward && p.elem == 2 && c.kind == FusedKernel::kRegisterRows && c.threads == c.group &&
         c.threads == fused::kBwdMaxThreads && c.vpt == 4 && p.M > f.num_sms &&
         f.dram_bytes_per_s >= rms::kStreamedRowsMinBandwidth;
}

// Forward (rms_norm_fused, rms_norm_quant): 4 vectors a thread in CTAs of up to 1024
// threads, then 1024 threads × 8 (the held h is 16 or 32 registers); rows longer than that a
// cluster of 512 × 8 (sm_90): at N = 65536 float32 0.80 of copy, where the CTA-per-row kernel
// reaches 0.64 (at 8192 vectors, 1024 × 8 measured 2–4% faster than a cluster of two 512 × 8).
// float64 rows: no clusters (they would spill), past 1024 × 8 the CTA-per-row kernel.
// Rows of 4 vectors a thread load all of a row's x and r before the first use and launch a
// CTA per row group: CTAs that finish make room for new ones, whose loads overlap the others'
// sums and stores (on an H200 0.96–1.00 of copy at N = 1024 … 32768 bf16, where row groups
// persisting for one wave and loading vector by vector reached 0.87–0.96, and either change
// alone 0.88–1.00; at N = 32768 bf16, 1024 × 4 reach 0.96 where 512 × 8 reached 0.87–0.91).
// Rows of 8 vectors (x and r of all 8 would spill) load vector by vector, a CTA (or cluster)
// per row group while the device holds them, the rest by grid stride (a CTA per row group
// was 1–6% slower there). Decode rows: the fewest vectors (1 or 2) that keep a row within
// kDecodeMaxThreads. A decode launch is one short wave of a CTA an SM, whose time is the
// instruction path of its warps (each an instruction every 5–6 cycles, Nsight Compute at
// [1, 4096] bf16), so the row goes to as many threads as hold it whole.
// Row clusters: rows that would take 8 vectors a thread (or a cluster of 512 x 8) wait for
// each vector's loads, or at each row's cluster barrier, with too few bytes in flight for an
// H200 (0.80-0.86 of copy at [4096, 32768] float32 and N = 65536). On devices of its
// bandwidth, rows of an input of at most 4 bytes whose residual is of its dtype instead go a
// row a cluster of 256-thread CTAs of 8 vectors (two CTAs an SM at up to 128 registers), every
// load first (the weight's too), a cluster a row (not persistent), the CTAs' sums pushed into
// each other's shared memory: 0.97-1.01 of copy at [4096, 32768] float32 and N = 65536. x and r
// staged in shared memory by asynchronous copies instead reached
// 0.72-0.85, so staged and met at a cluster barrier (and one before a CTA exits) 0.61-0.72;
// 4 vectors a thread (three CTAs an SM), 1-3% slower; rows of 1024 x 4 as row clusters, 5-10%
// slower than their register rows. A float32 residual on a 16-bit input keeps
// the register rows (its 8 vectors of r spill).
inline FusedLaunchConfig fused_forward_config(const FusedProblem& p, const DeviceFacts& f) {
  using namespace fused;
  FusedLaunchConfig c;
  if (p.M == 0 || p.N == 0) return c;
  const int64_t V = 16 / p.elem;
  if (p.N % V != 0) {
    c.kind = FusedKernel::kCtaRows;
    c.threads = fused_cta_threads(p.N);
    c.ctas = std::max<int64_t>(1, std::min(p.M, fused_resident_ctas(c.threads, f)));
    return c;
  }
  const int64_t nv = p.N / V;
  auto [group, vpt] = fused_row_split(nv, {4, 8}, kMaxThreads);
  c.kind = FusedKernel::kRegisterRows;
  if (group == 0 && f.clusters() && p.elem <= 4) {
    const int64_t cluster = ceil_div<int64_t>(ceil_div<int64_t>(nv, 8), kBwdMaxThreads);
    if (cluster <= kMaxCluster) {
      std::tie(group, vpt) = std::pair<int, int>{kBwdMaxThreads, 8};
      c.kind = FusedKernel::kClusterRows;
      c.cluster = static_cast<int>(cluster);
    }
  }
  if ((vpt == 8 || group == 0) && f.clusters() && p.elem <= 4 && p.streams_in_dtype &&
      f.dram_bytes_per_s >= rms::kStreamedRowsMinBandwidth) {
    const auto [threads, cluster] = row_cluster_split(nv, f);
    if (cluster > 0) {
      c.kind = FusedKernel::kRowClusters;
      c.cluster = cluster;
      c.group = c.threads = threads;
      c.vpt = rms::kRowClusterVpt;
      c.ctas = p.M;
      c.one_wave = false;
      return c;
    }
  }
  if (p.M <= f.num_sms) {
    const auto [dgroup, dvpt] = fused_row_split(nv, {1, 2}, kDecodeMaxThreads);
    if (dgroup > 0) {
      std::tie(group, vpt) = std::pair<int, int>{dgroup, dvpt};
      c.kind = FusedKernel::kDecodeRows;
      c.cluster = 1;
    }
  }
  if (group == 0) {
    c.kind = FusedKernel::kCtaRows;
    c.threads = fused_cta_threads(p.N);
    c.ctas = std::max<int64_t>(1, std::min(p.M, fused_resident_ctas(c.threads, f)));
    return c;
  }
  c.group = group;
  c.vpt = vpt;
  c.threads = group > 32 ? group : kRowsBlock;
  const int64_t row_groups = ceil_div<int64_t>(p.M, c.threads / group);
  c.one_wave = vpt > 4;
  c.ctas = c.one_wave ? std::max<int64_t>(1, std::min(row_groups, fused_resident_ctas(c.threads, f) / c.cluster))
                      : row_groups;
  return c;
}

// Backward: 2 vectors a thread, 4 for longer rows (dy, h and dres of a 16-bit input with
// float dW sums: 80 to 128 registers), up to 512 threads a row; and 4 where that keeps a
// row within a warp (a sub-warp row sums by shuffles alone, no barrier). A row of 512
// threads × 2 vectors takes 79–85 registers a thread, one CTA per SM; capped at 64 (a few
// bytes of spill), two CTAs fit, the loads of one running while the other sums its row
// (0.87 of copy at [16384, 8192] bf16 on an H200, 0.74 uncapped). At 256 threads and fewer
// three or more CTAs fit uncapped, and the cap's spills cost 8–15%.
// Rows longer than 512 threads × 4 vectors (N > 16384 of a 16-bit input, 8192 of float32):
// cluster rows of 512 × 2 vectors, capped for two CTAs an SM as above (4 vectors, one CTA
// an SM, where 2 would need more than kMaxCluster CTAs): 0.68–0.81 of copy on an H200, where
// the CTA-per-row kernel, which reads and writes a dW partial row per input row, reached
// 0.22–0.38. The dW of a per-head weight, and rows not of whole vectors: the CTA-per-row kernel.
// Row groups: at most half the CTAs the device holds by threads (a wave of the compiled
// kernel, which the launcher takes), and as many dW partial rows.
// Streamed rows: a register row's next loads wait for the row's stores; on a device of an
// H200's bandwidth that leaves too few bytes in flight (0.82-0.88 of copy at N = 2048 ...
// 8192 bf16). 16-bit rows of 64 to 512 threads × 4 vectors (N = 2048 ... 16384) with more
// rows than SMs instead stage dy, h and dres (sized for all three) by bulk copies, as many
// rows ahead (2 or 3) as leave two CTAs an SM; N = 16384 fits one stage and stays in
// registers. As many CTAs as shared memory holds, a dW partial row each.
// Streamed cluster rows: the register cluster rows wait at every row's cluster barrier with
// their next loads not yet issued (0.70-0.85 of copy). Rows of an input (16-bit or
// float32, dy, h and dres of its dtype, one weight row, more rows than SMs, H200-class
// bandwidth) instead go over the fewest CTAs (2 to the device's max_cluster: 16, past the
// portable 8) of at most kStreamedClusterThreads, 3 rows of their slices of dy, h and dres
// staged by bulk copies, rows overlapped around the cluster barrier, where
// kStreamedClusterCtas such CTAs fit an SM's shared memory: on an H200 0.84 of copy at
// [4096, 32768] bf16 (register: 0.73-0.77), 0.97 at [8192, 16384] float32 (0.85), and in
// clusters of 16 0.78-0.79 at [2048, 65536] bf16 (0.68-0.70) and 0.90 at [4096, 32768]
// float32 (0.81). With one CTA an SM (256 threads, 144 KB) it ran 5-18% slower than the
// register kernel; with dres read from L2 instead of staged, 6-14% slower at two CTAs an SM
// of 256 threads and 22-32% slower than staging it at 128; so rows that would need 256
// threads (N = 65536 float32) keep the register kernel.
inline FusedLaunchConfig fused_backward_config(const FusedProblem& p, const DeviceFacts& f) {
  using namespace fused;
  FusedLaunchConfig c;
  if (p.M == 0 || p.N == 0) return c;
  const int64_t V = 16 / p.elem;
  const bool rows = p.N % V == 0 && (p.H == 1 || !p.dw);
  const int64_t nv = p.N / V;
  auto [group, vpt] = rows ? fused_row_split(nv, {2, 4}, kBwdMaxThreads) : std::pair<int, int>{0, 0};
  if (vpt == 2 && group == 64) std::tie(group, vpt) = std::pair<int, int>{32, 4};
  if (group > 0) {
    c.kind = FusedKernel::kRegisterRows;
    c.min_ctas = vpt == 2 && group == kBwdMaxThreads ? 2 : 1;
  } else if (rows && f.clusters()) {
    for (const int v : {2, 4}) {
      const int64_t cluster = ceil_div<int64_t>(ceil_div<int64_t>(nv, v), kBwdMaxThreads);
      if (cluster <= kMaxCluster) {
        c.kind = FusedKernel::kClusterRows;
        group = kBwdMaxThreads;
        vpt = v;
        c.cluster = static_cast<int>(cluster);
        c.min_ctas = v == 2 ? 2 : 1;
        break;
      }
    }
  }
  if (c.kind == FusedKernel::kClusterRows && p.elem <= 4 && p.H == 1 && p.streams_in_dtype && p.M > f.num_sms &&
      f.dram_bytes_per_s >= rms::kStreamedRowsMinBandwidth) {
    const int64_t row_threads = ceil_div<int64_t>(nv, kStreamVpt);
    const int cluster = static_cast<int>(
        std::clamp<int64_t>(ceil_div<int64_t>(row_threads, kStreamedClusterThreads), 2, f.max_cluster()));
    const int threads = static_cast<int>(ceil_div<int64_t>(ceil_div<int64_t>(row_threads, cluster), 32) * 32);
    const int64_t smem = int64_t(rms::kStreamStages) * kStreams * kStreamVpt * threads * 16;
    if (kStreamedClusterCtas * (smem + kCtaSmemReserve) <= f.smem_per_sm) {
      c.kind = FusedKernel::kStreamedClusterRows;
      c.group = c.threads = threads;
      c.cluster = cluster;
      c.vpt = kStreamVpt;
      c.min_ctas = 1;
      c.stages = rms::kStreamStages;
      c.smem = smem;
      const int64_t per_sm =
          std::min<int64_t>(f.smem_per_sm / (c.smem + kCtaSmemReserve), f.max_threads_per_sm / c.threads);
      c.ctas = std::max<int64_t>(1, std::min(p.M, per_sm * f.num_sms / cluster));
      c.workspace = p.dw ? c.ctas * p.N * p.acc_bytes : 0;
      return c;
    }
  }
  if (c.kind == FusedKernel::kRegisterRows && p.elem == 2 && p.H == 1 && p.streams_in_dtype && p.M > f.num_sms &&
      f.clusters() && f.dram_bytes_per_s >= rms::kStreamedRowsMinBandwidth) {
    const int sgroup = pow2_ceil(ceil_div<int64_t>(nv, kStreamVpt));
    const int64_t stage = int64_t(kStreams) * kStreamVpt * sgroup * 16;
    const int64_t stages = std::min<int64_t>(kMaxStages, (f.smem_per_sm / 2 - kCtaSmemReserve) / stage);
    if (sgroup >= 64 && sgroup <= kBwdMaxThreads && stages >= 2) {
      c.kind = FusedKernel::kStreamedRows;
      c.group = c.threads = sgroup;
      c.vpt = kStreamVpt;
      c.min_ctas = 1;
      c.stages = static_cast<int>(stages);
      c.smem = stages * stage;
      const int64_t per_sm =
          std::min<int64_t>(f.smem_per_sm / (c.smem + kCtaSmemReserve), f.max_threads_per_sm / c.threads);
      c.ctas = std::max<int64_t>(1, std::min(p.M, per_sm * f.num_sms));
      c.dw_fold = p.dw ? rms_dw_fold(c.ctas, f) : 1;  // the stages hold a float per column twice over
      c.workspace = p.dw ? c.ctas / c.dw_fold * p.N * p.acc_bytes : 0;
      return c;
    }
  }
  if (c.kind == FusedKernel::kEmpty) {
    c.kind = FusedKernel::kCtaRows;
    c.threads = fused_cta_threads(p.N);
    const int64_t periods = p.M / p.H;
    c.ctas = std::max<int64_t>(1, std::min(periods, fused_resident_ctas(c.threads, f)));
    c.workspace = p.dw && periods > 0 ? c.ctas * p.H * p.N * p.acc_bytes : 0;
    return c;
  }
  c.group = group;
  c.vpt = vpt;
  c.threads = group > 32 ? group : kRowsBlock;
  const int64_t row_groups = ceil_div<int64_t>(p.M, c.threads / group);
  const int64_t resident = std::max<int64_t>(1, fused_resident_ctas(c.threads, f) / 2 / c.cluster);
  c.ctas = std::max<int64_t>(1, std::min(row_groups, resident));
  c.workspace = p.dw ? c.ctas * p.N * p.acc_bytes : 0;
  c.prefetch_next = fused_prefetches_next(c, p, f);
  return c;
}

// problem = [M, N, H] (forward), [M, N, H, grad_weight's element size or 0: no dW] (backward),
// and optionally a last entry: 1 when the residual (forward) or grad_out, h and
// grad_residual_out (backward) are of the input's dtype (the default), 0 when not (then no
// row clusters, no streamed rows).
inline FusedProblem fused_problem(c10::IntArrayRef problem, c10::ScalarType dtype, bool backward) {
  const char* op = backward ? "baracuda::rms_norm_fused_backward" : "baracuda::rms_norm_fused";
  const size_t flag = backward ? 4u : 3u;  // where the optional "of the input's dtype" entry sits
  const bool sized = problem.size() == flag || problem.size() == flag + 1;
  BARACUDA_CHECK_VALUE(sized && problem[0] >= 0 && problem[1] >= 0 && problem[2] >= 1 &&
                           (problem.size() == flag || problem[flag] == 0 || problem[flag] == 1),
                       op, ": malformed problem ", problem, ", expected [M, N, H",
                       backward ? ", dW element size(, streams in the input's dtype: 0 or 1)]"
                                : "(, residual in the input's dtype: 0 or 1)]");
  BARACUDA_CHECK_VALUE(dtype == c10::kHalf || dtype == c10::kBFloat16 || dtype == c10::kFloat ||
                           dtype == c10::kDouble,
                       op, ": dtype must be float16, bfloat16, float32 or float64, got ", dtype);
  FusedProblem p;
  p.M = problem[0];
  p.N = problem[1];
  p.H = problem[2];
  p.elem = static_cast<int64_t>(c10::elementSize(dtype));
  p.acc_bytes = dtype == c10::kDouble ? 8 : 4;
  p.backward = backward;
  p.dw = backward && problem[3] > 0;
  p.streams_in_dtype = problem.size() == flag || problem[flag] == 1;
  return p;
}

inline FusedLaunchConfig rms_norm_fused_launch_config(const FusedProblem& p, const DeviceFacts& f) {
  return p.backward ? fused_backward_config(p, f) : fused_forward_config(p, f);
}

inline const char* fused_kernel_name(FusedKernel k) {
  switch (k) {
    case FusedKernel::kEmpty: return "empty";
    case FusedKernel::kRegisterRows: return "register_rows";
    case FusedKernel::kDecodeRows: return "decode_rows";
    case FusedKernel::kClusterRows: return "cluster_rows";
    case FusedKernel::kStreamedRows: return "streamed_rows";
    case FusedKernel::kStreamedClusterRows: return "streamed_cluster_rows";
    case FusedKernel::kRowClusters: return "row_clusters";
    case FusedKernel::kCtaRows: return "cta_rows";
  }
  return "?";
}

inline LaunchConfigView fused_view(const FusedLaunchConfig& c) {
  LaunchConfigView v;
  v.kind = fused_kernel_name(c.kind);
  v.params = {{"threads", c.threads}, {"group", c.group},         {"cluster", c.cluster},
              {"vpt", c.vpt},         {"ctas_per_sm", c.min_ctas}, {"stages", c.stages},
              {"smem", c.smem},       {"row_groups", c.ctas},        {"one_wave", c.one_wave},
              {"prefetch_next", c.prefetch_next}, {"dw_fold", c.dw_fold}};
  v.workspace_bytes = c.workspace;
  return v;
}

inline LaunchConfigView rms_norm_fused_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                   const DeviceFacts& facts) {
  return fused_view(rms_norm_fused_launch_config(fused_problem(problem, dtype, false), facts));
}

inline LaunchConfigView rms_norm_fused_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                            const DeviceFacts& facts) {
  return fused_view(rms_norm_fused_launch_config(fused_problem(problem, dtype, true), facts));
}

}  // namespace baracuda
