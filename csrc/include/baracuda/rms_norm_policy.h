// rms_norm's CUDA launch policy (baracuda/launch_policy.h): which kernel runs a
// problem and with what shape, as a pure function of the problem, the device's
// facts and the occupancy of the compiled kernel it picks.
//
// The input is [M, N] rows. A row is split over `group * cluster` threads:
// `group` threads of one CTA (a sub-warp when several rows share a CTA, else the
// whole CTA), times `cluster` CTAs of a thread-block cluster (sm_90) for long rows.
// Each thread holds `vpt` vectors of `vec` elements of the row in registers.
// The kernel kinds (csrc/cuda/rms_norm/):
//   kWarpRows            short rows, kRowsBlock / group rows per CTA;
//   kCtaRow              a row per CTA;
//   kClusterRow          a row per cluster of CTAs (sm_90);
//   kStreamedRow         backward rows of one CTA of a half input (two or more
//                        CTAs an SM, H200-class bandwidth): x and dy staged by
//                        bulk copies, rows ahead;
//   kStreamedClusterRow  backward cluster rows of a half input, x and dy staged by
//                        bulk copies, rows ahead (H200-class: CTAs of at most 256
//                        threads, two an SM, more rows than SMs with a 16-bit dW;
//                        elsewhere a float32 dW alone, one CTA per SM);
//   kRowClusters         forward rows past 512 × 8 vectors of 2- or 4-byte elements
//                        (H200-class bandwidth, sm_90): a row a cluster of CTAs of
//                        up to 256 threads × 8 vectors and a cluster a row (not
//                        persistent), the CTAs' sums pushed to each other;
//   kDecodeRow           no more rows than SMs (latency-bound): a CTA a row,
//                        the row and w loaded in one round;
//   kTwoPassRow          rows too long for registers: x (and dy) read twice.
// The backward's dW is written directly by the row kernel (one row group), summed
// by column CTAs beside decode rows, or written as one partial row per row group
// and summed in a fixed order by a second kernel (deterministic: no atomics).
//
// Plain C++ (compiled into CPU-only builds): the launchers call rms_launch_config
// with cuda::device_facts() and the runtime's occupancy of the kernel; the Plan
// API and the CPU tests call rms_norm_launch_view with recorded facts.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "baracuda/errors.h"
#include "baracuda/launch_policy.h"

namespace baracuda {
namespace rms {

constexpr int kVpt = 4;              // vectors each thread keeps in registers (the `vpt` of most launches)
constexpr int kMaxThreads = 1024;    // largest CTA of the forward register kernel
constexpr int kBwdMaxThreads = 512;  // backward: x and dy in registers need up to 128 per thread
constexpr int kDecodeVpt = 2;        // backward decode rows: vectors per thread, at most (4 spill at 1024 threads)
constexpr int kRowsBlock = 256;      // CTA size when several short rows share a CTA
constexpr int kMaxCluster = 8;       // portable thread-block cluster size
constexpr int kLoopedThreads = 512;  // CTA size of the two-pass kernels
constexpr int kDwColumnVectors = 32; // decode rows' dW column CTAs: column vectors each, one a lane
constexpr int kReduceCols = 32;      // dW sum of few partial rows: columns per CTA
constexpr int kReduceSlices = 8;     // dW sum of few partial rows: partial-row slices per column
constexpr int kReduceThreads = 512;  // dW sum of many partial rows: threads per CTA (columns x slices)
constexpr int kManyDwCols = 8;       // dW sum of many partial rows: columns per CTA
constexpr int kManyDwRows = 512;     // partial rows from which the dW sum spreads over every SM
constexpr int kStreamStages = 3;     // streamed kernels: rows staged in shared memory
// Streamed backward cluster rows on devices of kStreamedRowsMinBandwidth: CTAs of at most this
// many threads (the cluster widened up to kMaxCluster), whose three stages of x and dy (96 KB at
// 256 threads) leave two CTAs an SM.
constexpr int kStreamedClusterThreads = 256;
// Copy bandwidth (read + write, bytes/s) from which the backward streams half-input rows of one
// CTA and the forward takes row clusters: an H200 (4.19e12) needs more bytes in flight per SM
// than the register kernels' rows give it; on an H100 (2.97e12) the register kernels measured
// faster.
constexpr double kStreamedRowsMinBandwidth = 3.5e12;
// Forward row clusters (rms_norm and rms_norm_fused, H200-class devices): a row a cluster of
// CTAs of up to kRowClusterThreads threads holding kRowClusterVpt vectors each, a cluster a
// row (not persistent), the CTAs' sums pushed to each other (ClusterPushFold); at most
// kMaxRowCluster CTAs (sm_90's non-portable cluster size).
constexpr int kRowClusterThreads = 256;
constexpr int kRowClusterVpt = 8;
constexpr int kMaxRowCluster = 16;

// Decode spreads, tried in order: (vectors per thread, threads at most). Forward:
// at most 256 threads (Liger's CTA at N = 4096) of 1, 2, 4 or 8 vectors, then 512
// threads of 2: every load issues before any is used, and 256 threads beat 512 of
// half the vectors, 128 and 1024 threads, at the decode shapes. Backward: 512
// threads of 1 vector, then of 2, then 1024 threads of 2 (kDecodeVpt), the
// fastest spread at each decode shape.
using Spread = std::pair<int, int>;
constexpr std::array<Spread, 5> kFwdDecodeSpreads{{{1, 256}, {2, 256}, {4, 256}, {8, 256}, {2, kBwdMaxThreads}}};
constexpr std::array<Spread, 3> kBwdDecodeSpreads{
    {{1, kBwdMaxThreads}, {kDecodeVpt, kBwdMaxThreads}, {kDecodeVpt, kMaxThreads}}};

// The decode forward's vectors per thread, at most, for 16-byte vectors of `elem`-byte
// elements (rms_norm_fwd_decode_kernel is instantiated for these): float64 spills past 2.
constexpr int fwd_decode_max_vpt(int64_t elem) { return elem == 2 ? 4 : elem == 4 ? 8 : 2; }

template <typename T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

inline int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == c10::kDouble ? 8 : 4; }

}  // namespace rms

// The row clusters of a row of nv vectors: {threads a CTA, CTAs}, the fewest CTAs of at
// most kRowClusterThreads (a multiple of 32) that hold kRowClusterVpt vectors a thread, 2 to
// the device's max_cluster (at most kMaxRowCluster); {0, 0} when none fits.
inline std::pair<int, int> row_cluster_split(int64_t nv, const DeviceFacts& f) {
  using namespace rms;
  const int64_t row_threads = ceil_div<int64_t>(nv, kRowClusterVpt);
  const int64_t cluster = ceil_div<int64_t>(row_threads, kRowClusterThreads);
  if (cluster < 2 || cluster > std::min<int64_t>(f.max_cluster(), kMaxRowCluster)) return {0, 0};
  const int64_t threads = ceil_div<int64_t>(ceil_div<int64_t>(row_threads, cluster), 32) * 32;
  return {static_cast<int>(threads), static_cast<int>(cluster)};
}

struct RmsProblem {
  int64_t M = 0, N = 0;      // rows, row length
  c10::ScalarType dtype = c10::kFloat;
  bool backward = false;
  int64_t dw_elem = 0;       // backward: grad_weight's element size, 0 when it computes no dW
};

enum class RmsKernel {
  kEmpty, kWarpRows, kCtaRow, kClusterRow, kStreamedRow, kStreamedClusterRow, kRowClusters, kDecodeRow, kTwoPassRow
};
enum class RmsDwSum { kNone, kDirect, kColumns, kOrdered };

struct RmsLaunchConfig {
  RmsKernel kind = RmsKernel::kEmpty;  // M == 0 or N == 0: no kernel runs
  int vec = 1;           // elements per access: 16 bytes, or 1 when N is not a multiple
  int group = 1;         // threads per row inside a CTA
  int block = 1;         // threads per CTA
  int cluster = 1;       // CTAs per row
  int vpt = rms::kVpt;   // vectors per thread: kVpt; 1 to 8 for decode rows; 1 for backward rows
                         // spread over a cluster of 8; 2 * kVpt for forward cluster rows and
                         // row clusters
  int ctas_per_sm = 1;   // backward cluster rows: 2 (registers capped by __launch_bounds__)
  int stages = 0;        // kStreamedRow, kStreamedClusterRow (backward): rows of x and dy staged
  bool prefetch_next = false;  // backward kCtaRow: each CTA fetches its next row into L2 while on this one
  bool refill_after_dx = false;  // backward kStreamedClusterRow: a stage refilled as soon as its row's dx is
                                 // written, behind a CTA barrier of its own, not after the next row's sum
  int64_t clusters = 0;  // row groups launched (grid = clusters * cluster); backward: dW partial rows
  int64_t dw_columns = 0;  // kDecodeRow backward: CTAs after the rows that sum dW by columns
  int64_t smem = 0;      // dynamic shared memory bytes (backward dW accumulators, staged rows)
  RmsDwSum dw = RmsDwSum::kNone;
  int dw_fold = 1;       // kStreamedRow with kOrdered: CTAs of a launch cluster that add their dW sums
                         // before writing them (fold_dw_in_cluster); 1: a partial row a row group

  bool decode() const { return kind == RmsKernel::kDecodeRow; }
  bool two_pass() const { return kind == RmsKernel::kTwoPassRow; }
  // The dW partial rows the kernel writes (kOrdered).
  int64_t dw_partial_rows() const { return clusters / dw_fold; }
};

// The compiled kernel's occupancy, which the grid of the kinds that walk rows by
// grid-stride needs: the row groups (CTAs, or clusters of `cluster` CTAs) that run
// at once on the whole device. The launcher reads it from the runtime
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor times the SMs, or
// cudaOccupancyMaxActiveClusters); rms_modelled_occupancy derives it for recorded facts.
struct RmsOccupancy {
  int64_t resident_row_groups = 1;
};

// Whether the grid of `c` depends on the kernel's occupancy.
inline bool rms_needs_occupancy(const RmsLaunchConfig& c, bool backward) {
  if (c.kind == RmsKernel::kEmpty || c.kind == RmsKernel::kRowClusters || c.decode()) return false;
  return backward || c.cluster > 1 || c.two_pass() || c.stages > 0;
}

// Everything but the grid: kind, thread shape, shared memory.
inline RmsLaunchConfig rms_launch_shape(const RmsProblem& p, const DeviceFacts& f) {
  using namespace rms;
  const int64_t M = p.M, N = p.N;
  const bool backward = p.backward;
  const int64_t elem = c10::elementSize(p.dtype), acc_bytes = acc_bytes_of(p.dtype);
  const bool dw = backward && p.dw_elem > 0;
  RmsLaunchConfig c;
  if (M == 0 || N == 0) return c;
  bool looped = false, decode = false;
  c.vec = N % (16 / elem) == 0 ? static_cast<int>(16 / elem) : 1;
  const int64_t nv = N / c.vec;
  // Forward rows past one CTA of 512 threads × 8 vectors (N > 32768 16-bit, 16384 float32),
  // of 2- or 4-byte elements, on devices of kStreamedRowsMinBandwidth: row clusters (sm_90,
  // kRowClusterThreads). Rows in persistent clusters, register or streamed by bulk copies,
  // wait at a cluster barrier every row: on an H200 0.89-0.94 of copy at N = 65536 and
  // [4096, 32768] float32, where row clusters reach 0.91-0.96. Rows of one 512 × 8 CTA
  // (N = 32768 16-bit, 16384 float32) stay there: as row clusters of two, 1-2% slower.
  if (!backward && f.clusters() && f.dram_bytes_per_s >= kStreamedRowsMinBandwidth && c.vec * elem == 16 &&
      elem <= 4 && nv > int64_t(2) * kVpt * kBwdMaxThreads) {
    const auto [threads, cluster] = row_cluster_split(nv, f);
    if (cluster > 0) {
      c.kind = RmsKernel::kRowClusters;
      c.block = c.group = threads;
      c.cluster = cluster;
      c.vpt = kRowClusterVpt;
      return c;
    }
  }
  if (nv <= 32 * kVpt) {
    // Short rows: a sub-warp of `group` threads per row, kRowsBlock / group rows per CTA.
    c.group = pow2_ceil(ceil_div<int64_t>(nv, kVpt));
    c.block = kRowsBlock;
  } else {
    // One row per CTA, or per cluster of CTAs; prefer CTAs of <= 512 threads
    // (several resident per SM), then (forward only) up to 1024.
    const int max_cluster = f.clusters() ? kMaxCluster : 1;
    bool found = false;
    for (int cap : {kBwdMaxThreads, backward ? kBwdMaxThreads : kMaxThreads}) {
      for (int cl = 1; cl <= max_cluster && !found; cl *= 2) {
        const int64_t threads = ceil_div<int64_t>(nv, int64_t(kVpt) * cl);
        if (threads <= cap) {
          c.cluster = cl;
          c.block = static_cast<int>(ceil_div<int64_t>(threads, 32) * 32);
          found = true;
        }
      }
    }
    looped = !found;
    if (looped) {
      c.block = kLoopedThreads;
      c.cluster = 1;
    }
    c.group = c.block;
  }
  bool streamed = false;
  // Rows that need a cluster: the CTAs of a cluster wait for each other at every
  // row's barrier. The forward holds 2 * kVpt vectors per thread (16-byte vectors:
  // 64 registers), so half as many CTAs share a row. The backward, which needs
  // more registers per vector, is held to 64 registers, two CTAs per SM, so one
  // CTA's loads run while the other waits at its barrier.
  if (!looped && !streamed && c.cluster > 1) {
    if (!backward && c.vec * elem == 16 && elem <= 4) {  // float64 spills at 2 * kVpt
      c.vpt = 2 * kVpt;
      c.cluster /= 2;
    }
    if (backward) c.ctas_per_sm = 2;
  }
  // Forward rows of one CTA of 257 to 512 threads of 16-bit elements, more rows than
  // SMs, on devices of kStreamedRowsMinBandwidth: 2 * kVpt vectors a thread in half the
  // threads, four CTAs an SM (64 registers) where two fit before, so twice the bytes of
  // x in flight an SM; 0.95 of copy against 0.93-0.94 at N = 16384 on an H200.
  if (!backward && !looped && !streamed && c.cluster == 1 && c.group == c.block && c.block > kBwdMaxThreads / 2 &&
      c.block <= kBwdMaxThreads && c.vpt == kVpt && c.vec * elem == 16 && M > f.num_sms &&
      f.dram_bytes_per_s >= kStreamedRowsMinBandwidth && elem == 2) {
    c.vpt = 2 * kVpt;
    c.block = c.group = static_cast<int>(ceil_div<int64_t>(ceil_div<int64_t>(nv, c.vpt), 32) * 32);
  }
  // Decode rows: no more rows than SMs, a CTA each, the first spread of the table
  // that fits. With more than one row (or a single row's dW past 8 KB, which would
  // move too many bytes through one SM), the backward's dW is summed by columns in
  // CTAs beside the rows rather than from partial rows by a second kernel (one
  // launch fewer on a path that launch latency bounds); those CTAs run in the same
  // wave (at most 64 registers a thread: kMaxThreads / threads CTAs an SM).
  const bool dw_by_columns = p.dw_elem > 0 && (M > 1 || N * p.dw_elem > 8192);
  if (!looped && !streamed && c.group == c.block && c.vec * elem == 16 && M <= f.num_sms) {
    const auto take_first_fitting = [&](const auto& spreads) {
      for (const auto& [vpt, cap] : spreads) {
        const int threads = static_cast<int>(ceil_div<int64_t>(ceil_div<int64_t>(nv, vpt), 32) * 32);
        const int64_t ctas = M + (dw_by_columns ? ceil_div<int64_t>(nv, kDwColumnVectors) : 0);
        if (threads <= cap && (backward || vpt <= fwd_decode_max_vpt(elem)) &&
            ctas <= int64_t(f.num_sms) * (kMaxThreads / threads)) {
          decode = true;
          c.vpt = vpt;
          c.cluster = 1;
          c.block = c.group = threads;
          return;
        }
      }
    };
    if (backward) {
      take_first_fitting(kBwdDecodeSpreads);
    } else {
      take_first_fitting(kFwdDecodeSpreads);
    }
  }
  // The backward of a single row too long for the decode kernel but not for a
  // cluster's CTAs: one vector per thread over a cluster of kMaxCluster CTAs, so
  // its loads come from that many SMs. (The forward's rows of that length stay in one
  // CTA: spread so, the cluster's barrier costs more than the loads it spreads.)
  if (!decode && backward && M == 1 && c.vpt == kVpt && !looped && c.group == c.block && c.vec * elem == 16 &&
      f.clusters() && ceil_div<int64_t>(nv, kMaxCluster) <= kBwdMaxThreads) {
    c.vpt = 1;
    c.cluster = kMaxCluster;
    c.block = c.group = static_cast<int>(ceil_div<int64_t>(ceil_div<int64_t>(nv, kMaxCluster), 32) * 32);
  }
  // The streamed backward kernel (sm_90): kStreamStages rows of the CTA's 16-byte vectors
  // of x and dy staged by bulk copies, consecutive rows overlapped, so a CTA's next rows are
  // in flight while it sums and stores one. Taken for half inputs only:
  //  - rows of one CTA where two or more of its CTAs fit an SM's shared memory (N up to
  //    8192), on devices of kStreamedRowsMinBandwidth: 0.89-0.94 of copy on an H200, where
  //    the register kernel, whose next row's loads wait for this row's dx, reaches
  //    0.76-0.83. With one CTA an SM (N = 16384) the register kernel is faster, as it is at
  //    every float32 row length;
  //  - rows of a whole warp (N = 520 ... 1024), each a CTA of 32 threads, on the same
  //    devices: the register kernel's CTAs of 8 such rows take 116-124 registers a thread,
  //    two CTAs an SM, and reach 0.85 of copy; a 32-thread CTA stages 12 KB, about 16 an SM;
  //  - cluster rows with a float32 dW (a float32 weight): the weight's 32-byte vectors cost
  //    the register kernel more than the streamed kernel's barriers cost it. On devices of
  //    kStreamedRowsMinBandwidth the row is spread over CTAs of at most
  //    kStreamedClusterThreads, twice the cluster, two CTAs an SM, so one CTA's loads run
  //    while the other waits at its barriers; elsewhere 512-thread CTAs. Each stage is
  //    refilled as soon as its row's dx is written (refill_after_dx). On an H200 0.85 of copy
  //    at N = 32768 and 0.81-0.84 at 65536, where 512-thread CTAs, one an SM, reach 0.70 and
  //    0.65, and 256-thread CTAs refilled after the next row's sum 0.78 and 0.72;
  //  - cluster rows with a 16-bit dW (or none), more rows than SMs, on those devices: the same
  //    kernel and CTAs, 0.84-0.86 of copy at N = 32768 and 65536 bf16 where two register CTAs
  //    of 512 threads an SM reach 0.76-0.80. Elsewhere, and with no more rows than SMs (a row
  //    or none a cluster: nothing to overlap), the register kernel.
  if (backward && !looped && !decode && c.vpt == kVpt && c.vec * elem == 16 && elem == 2) {
    const bool h200_class = f.clusters() && f.dram_bytes_per_s >= kStreamedRowsMinBandwidth;
    const bool warp_rows = h200_class && c.group == 32 && c.block > c.group;
    const bool cluster_rows = c.cluster > 1 && (p.dw_elem == 4 || (h200_class && M > f.num_sms));
    int block = warp_rows ? c.group : c.block, cluster = c.cluster;
    while (cluster_rows && h200_class && block > kStreamedClusterThreads && 2 * cluster <= kMaxCluster) {
      cluster *= 2;
      block = static_cast<int>(ceil_div<int64_t>(ceil_div<int64_t>(nv, int64_t(c.vpt) * cluster), 32) * 32);
    }
    const int64_t smem = kStreamStages * 2 * int64_t(c.vpt) * block * 16;
    const bool cta_rows = h200_class && c.cluster == 1 && (c.group == c.block || warp_rows) &&
                          2 * (smem + 1024) <= f.smem_per_sm;
    if ((cta_rows || cluster_rows) && smem + 1024 <= f.smem_per_block_optin) {
      streamed = true;
      c.block = c.group = block;
      c.cluster = cluster;
      c.refill_after_dx = cluster > 1;
      c.stages = kStreamStages;
      c.ctas_per_sm = 1;
      c.smem = smem;
    }
  }
  if (dw && !looped && !decode && c.vpt == kVpt && !streamed) {
    c.smem = int64_t(c.block) * c.vpt * c.vec * acc_bytes;
    if (c.smem > f.smem_per_block_optin) {  // small-smem GPUs: the two-pass kernel keeps dW in global memory
      looped = true;
      c.block = c.group = kLoopedThreads;
      c.cluster = c.ctas_per_sm = 1;
      c.smem = 0;
    }
  }
  c.kind = looped                ? RmsKernel::kTwoPassRow
           : decode              ? RmsKernel::kDecodeRow
           : c.group < c.block   ? RmsKernel::kWarpRows
           : streamed            ? (c.cluster > 1 ? RmsKernel::kStreamedClusterRow : RmsKernel::kStreamedRow)
           : c.cluster > 1       ? RmsKernel::kClusterRow
                                 : RmsKernel::kCtaRow;
  // Backward rows of one 512-thread CTA (one CTA an SM, no other to overlap), more rows
  // than SMs (a CTA has a next row), on devices of kStreamedRowsMinBandwidth: the CTA
  // fetches its next row into L2 before it sums this one, so the memory stays busy while
  // it waits for the row sum and stores dx. On an H200 0.91-0.94 of copy at N = 16384
  // bf16 and 1.01 at N = 8192 float32, where the CTA alone reaches 0.80-0.83 and 0.94.
  // Where CTAs share an SM it did not pay: cluster rows 7-21% slower, float32 rows of
  // 256 and 320 threads 4% faster and 10% slower.
  c.prefetch_next = backward && c.kind == RmsKernel::kCtaRow && c.block == kBwdMaxThreads && M > f.num_sms &&
                    f.dram_bytes_per_s >= kStreamedRowsMinBandwidth;
  if (decode) {  // a CTA each, all in flight (backward: and the dW column CTAs, no partials)
    c.clusters = M;
    if (dw_by_columns) c.dw_columns = ceil_div<int64_t>(nv, kDwColumnVectors);
  }
  return c;
}

// CTAs of a launch cluster that fold their dW sums into one partial row (one-CTA rows
// of a single wave of `ctas`): all of an SM's share of the wave where that share is 4 to
// kMaxCluster CTAs, so that the dW sum reads one partial row an SM; else 1. The fold
// pays only where partial rows are many (4 or more an SM; docs/PERFORMANCE.md has the
// measurements). Past 8 CTAs an SM the clusters do not all fit: 2112 CTAs of 32 threads
// (16 an SM alone) in clusters of 8 or 16 keep 132 clusters resident on an H200 (Nsight
// Compute's Max Active Clusters), half the wave.
inline int rms_dw_fold(int64_t ctas, const DeviceFacts& f) {
  if (ctas % f.num_sms != 0) return 1;
  const int64_t per_sm = ctas / f.num_sms;
  return per_sm >= 4 && per_sm <= rms::kMaxCluster ? static_cast<int>(per_sm) : 1;
}

// The grid of a shape from rms_launch_shape, and the dW sum that follows from it.
inline RmsLaunchConfig rms_launch_grid(RmsLaunchConfig c, const RmsProblem& p, const DeviceFacts& f,
                                       const RmsOccupancy& occ) {
  if (c.kind == RmsKernel::kEmpty) return c;
  const bool backward = p.backward;
  if (!c.decode()) {
    const int64_t row_groups = rms::ceil_div<int64_t>(p.M, c.block / c.group);
    if (!rms_needs_occupancy(c, backward)) {
      // Forward rows of one CTA: a CTA per row group (the kernel's grid-stride loop
      // only past 2^31 - 1 CTAs), as Triton's kernels run: faster than a grid of 16
      // waves walking the rest by grid-stride.
      c.clusters = std::min<int64_t>(row_groups, std::numeric_limits<int32_t>::max());
    } else {
      // Otherwise row groups (CTAs or clusters) in flight: what the device runs at
      // once, and in the backward at most half the threads an SM can hold (enough
      // loads in flight, fewer dW partial rows to write and sum). A grid larger than
      // what runs at once leaves a tail wave; with clusters that can halve the speed.
      // Backward: one wave, each row group accumulating dW for the rows it visits.
      // Forward cluster rows and the two-pass kernel: up to 16 waves, the rest by
      // grid-stride (a cluster per row group is slower).
      int64_t resident = occ.resident_row_groups;
      if (backward) {
        const int64_t per_sm = std::clamp<int64_t>(1024 / c.block, 1, 32);
        resident = std::min(resident, std::max<int64_t>(1, int64_t(f.num_sms) * per_sm / c.cluster));
      }
      c.clusters = std::min(row_groups, backward || c.stages > 0 ? resident : 16 * resident);
    }
  }
  if (backward && p.dw_elem > 0) {
    // One row group, or dW by columns: the kernel writes dW itself, no partials.
    c.dw = c.dw_columns > 0 ? RmsDwSum::kColumns
           : c.clusters == 1 && !c.two_pass() ? RmsDwSum::kDirect
                                              : RmsDwSum::kOrdered;
    // Streamed rows of one CTA fold in clusters: their stages (x and dy of three rows)
    // hold a float per column several times over, which the fold's sums reuse.
    if (c.dw == RmsDwSum::kOrdered && c.kind == RmsKernel::kStreamedRow) c.dw_fold = rms_dw_fold(c.clusters, f);
  }
  return c;
}

// The full policy: `occupancy(shape)` returns the RmsOccupancy of the kernel that a
// shape launches; it is called only where the grid needs it.
template <typename OccupancyFn>
RmsLaunchConfig rms_launch_config(const RmsProblem& p, const DeviceFacts& f, OccupancyFn&& occupancy) {
  const RmsLaunchConfig shape = rms_launch_shape(p, f);
  return rms_launch_grid(shape, p, f, rms_needs_occupancy(shape, p.backward) ? occupancy(shape) : RmsOccupancy{});
}

// The CTAs of the sum of P dW partial rows of C columns (rms_dw_sum_kernel): `cols`
// columns of `slices` partial-row slices each, C / cols of them. The sum runs after the
// row kernel ends, and its time is its longest chain of loads: a thread adds P / slices
// rows in order. Few partial rows (P < kManyDwRows, four an SM): 32 columns x 8 slices,
// whose threads read 128-byte segments and add their slices in few steps; there the
// chains are short already, and wider CTAs measured as fast or slower (decode rows,
// where the sum is a few hundred ns; 264 and 396 partial rows). Many: 8 columns x 64
// slices (32-byte segments, a sector each), so that every SM holds CTAs and each
// thread's chain is short (P = 2112 at [131072, 1024] bf16: 32 CTAs of 264 loads a
// thread against 128 CTAs of 33).
struct RmsDwSumShape {
  int cols = 0;
  int slices = 0;
  int64_t ctas = 0;
};
inline RmsDwSumShape rms_dw_sum_shape(int64_t P, int64_t C) {
  const bool many = P >= rms::kManyDwRows;
  const int cols = many ? rms::kManyDwCols : rms::kReduceCols;
  return {cols, many ? rms::kReduceThreads / cols : rms::kReduceSlices, rms::ceil_div<int64_t>(C, cols)};
}

// Bytes of the dW partial rows (RmsDwSum::kOrdered), else 0.
inline int64_t rms_dw_workspace_bytes(const RmsLaunchConfig& c, const RmsProblem& p) {
  return c.dw == RmsDwSum::kOrdered ? c.dw_partial_rows() * p.N * rms::acc_bytes_of(p.dtype) : 0;
}

// The occupancy of the kernel a shape launches, modelled from the facts for a
// device that is not at hand: CTAs per SM bounded by threads, by shared memory
// (1 KB reserved per CTA) and by registers at the kernel's __launch_bounds__
// budget (forward register kernel 64 a thread; backward register kernel 128, or 64
// at two CTAs per SM; streamed and two-pass kernels 128); clusters as the SMs'
// CTAs taken `cluster` at a time. The runtime's count can differ (a compiled
// kernel using fewer registers than its budget, clusters placed GPC by GPC): the
// launchers ask the runtime instead.
inline RmsOccupancy rms_modelled_occupancy(const RmsLaunchConfig& c, bool backward, const DeviceFacts& f) {
  const int64_t bound_threads = c.two_pass() || backward ? rms::kBwdMaxThreads : rms::kMaxThreads;
  const int64_t min_blocks = backward && c.ctas_per_sm == 2 ? 2 : 1;
  const int64_t regs = std::min<int64_t>(255, f.regs_per_sm / (bound_threads * min_blocks)) / 8 * 8;
  int64_t per_sm = std::min<int64_t>(f.max_threads_per_sm / c.block, 32);
  per_sm = std::min<int64_t>(per_sm, f.regs_per_sm / (regs * c.block));
  per_sm = std::min<int64_t>(per_sm, f.smem_per_sm / (c.smem + 1024));
  return {std::max<int64_t>(1, int64_t(f.num_sms) * per_sm / c.cluster)};
}

// problem = [M, N] (forward), [M, N, grad_weight's element size or 0: no dW] (backward).
inline RmsProblem rms_problem(c10::IntArrayRef problem, c10::ScalarType dtype, bool backward) {
  const char* op = backward ? "baracuda::rms_norm_backward" : "baracuda::rms_norm";
  BARACUDA_CHECK_VALUE(problem.size() == (backward ? 3u : 2u) && problem[0] >= 0 && problem[1] >= 0, op,
                       ": malformed problem ", problem, ", expected [M, N", backward ? ", dW element size]" : "]");
  BARACUDA_CHECK_VALUE(dtype == c10::kHalf || dtype == c10::kBFloat16 || dtype == c10::kFloat ||
                           dtype == c10::kDouble,
                       op, ": dtype must be float16, bfloat16, float32 or float64, got ", dtype);
  return {problem[0], problem[1], dtype, backward, backward ? problem[2] : 0};
}

inline const char* rms_kernel_name(RmsKernel k) {
  switch (k) {
    case RmsKernel::kEmpty: return "empty";
    case RmsKernel::kWarpRows: return "warp_rows";
    case RmsKernel::kCtaRow: return "cta_row";
    case RmsKernel::kClusterRow: return "cluster_row";
    case RmsKernel::kStreamedRow: return "streamed_row";
    case RmsKernel::kStreamedClusterRow: return "streamed_cluster_row";
    case RmsKernel::kRowClusters: return "row_clusters";
    case RmsKernel::kDecodeRow: return "decode_row";
    case RmsKernel::kTwoPassRow: return "two_pass_row";
  }
  return "?";
}

// The config as the Plan API and the tests read it. dw_sum: RmsDwSum's value
// (0 none, 1 direct, 2 by columns, 3 ordered sum of partial rows); dw_fold: CTAs a
// partial row (rms_dw_fold); dw_sum_cols, dw_sum_slices: the sum's CTA
// (rms_dw_sum_shape), 0 without partial rows.
inline LaunchConfigView rms_view(const RmsLaunchConfig& c, const RmsProblem& p) {
  const RmsDwSumShape sum = c.dw == RmsDwSum::kOrdered ? rms_dw_sum_shape(c.dw_partial_rows(), p.N) : RmsDwSumShape{};
  LaunchConfigView v;
  v.kind = rms_kernel_name(c.kind);
  v.params = {{"vec_bytes", int64_t(c.vec) * int64_t(c10::elementSize(p.dtype))},
              {"group", c.group},
              {"block", c.block},
              {"cluster", c.cluster},
              {"vpt", c.vpt},
              {"ctas_per_sm", c.ctas_per_sm},
              {"stages", c.stages},
              {"prefetch_next", c.prefetch_next},
              {"refill_after_dx", c.refill_after_dx},
              {"row_groups", c.clusters},
              {"dw_columns", c.dw_columns},
              {"smem", c.smem},
              {"dw_sum", static_cast<int64_t>(c.dw)},
              {"dw_fold", c.dw_fold},
              {"dw_sum_cols", sum.cols},
              {"dw_sum_slices", sum.slices}};
  v.workspace_bytes = rms_dw_workspace_bytes(c, p);
  return v;
}

// The launch view with the occupancy modelled from the facts (the launchers and
// the variant a Plan reports on a GPU use the runtime's).
inline LaunchConfigView rms_modelled_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                 const DeviceFacts& facts, bool backward) {
  const RmsProblem p = rms_problem(problem, dtype, backward);
  return rms_view(rms_launch_config(p, facts, [&](const RmsLaunchConfig& s) {
                    return rms_modelled_occupancy(s, backward, facts);
                  }),
                  p);
}

inline LaunchConfigView rms_norm_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                             const DeviceFacts& facts) {
  return rms_modelled_launch_view(problem, dtype, facts, false);
}

inline LaunchConfigView rms_norm_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                      const DeviceFacts& facts) {
  return rms_modelled_launch_view(problem, dtype, facts, true);
}

}  // namespace baracuda
