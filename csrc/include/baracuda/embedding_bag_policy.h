// embedding_bag family, CUDA launch policy (baracuda/launch_policy.h): a pure
// function of the problem [num_embeddings, embedding_dim, num_indices, num_bags,
// mode, has_per_sample_weights], the dtype and the device's facts, shared by the
// launchers (csrc/cuda/embedding_bag/) and the Plan API. Plain C++: compiled into
// CPU-only builds too, so CI runs it with recorded facts.
//
// The backward's workspace holds the scratch of CUB's radix sort, whose size only
// CUB knows: the launcher passes it in (sort_scratch_bytes); the recorded-facts
// view (`_launch_config`) leaves it out.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>

#include "baracuda/checks.h"
#include "baracuda/embedding_bag.h"
#include "baracuda/launch_policy.h"

namespace baracuda {

constexpr int kBagThreads = 256;
constexpr int kBagWonWords = 4;            // backward, max mode: won words of a bag per warp, loads in flight together
constexpr int kBagSweepChunks = 32;        // backward: most chunks per CTA of the sweep (its shared memory)
constexpr int64_t kBagSweepSmemBytes = 48 * 1024;  // backward: the sweep's shared memory, at most (the default limit)
constexpr int64_t kBagChunk = 64;          // backward: sorted positions per chunk
constexpr int64_t kBagGroup = 32;          // backward: chunks per group partial
constexpr int64_t kBagU32Limit = 0xffffffff;  // backward: sort keys, positions and run ends are uint32
constexpr int kBagLateFillThreads = 256;   // backward, late fill: CTAs of this many threads,
constexpr int kBagLateFillCtasPerSm = 2;   //   this many per SM (it shares the GPU with the sums)
constexpr int kBagEarlyFillThreads = 1024;  // backward, early fill: one CTA of this many threads on a share
                                            //   of the SMs (the sort has the others)
constexpr int64_t kBagEarlyFillBytes = 512;  // backward: grad_weight bytes per index from which the fill starts early
constexpr int kBagGridStrideCtasPerSm = 8;   // backward: CTAs per SM of the grid-stride steps (keys, runs, won)
// Backward sort: (row, position) pairs by row, stable (a row's positions stay in
// order), CUB's onesweep radix sort. Its digits are 8 bits a pass; keys of 17 or 18
// bits take 9-bit digits instead, two passes instead of three. Where 9-bit digits
// save no pass (20 and 22 bits) 8-bit ones are faster, 10-bit digits are slower at
// every key width, and 11-bit ones do not fit in a block's static shared memory.
constexpr int kBagWideDigitBits = 9;

enum class EmbeddingBagKernel {
  kBagGather,    // forward: a team per bag gathers its rows in position order
  kSortSegment,  // backward: radix sort of (row, position), ordered sweep of the runs, unused rows zero-filled
  kPositionDot,  // per_sample_weights backward: a team (one warp at most) per position
};

struct EmbeddingBagProblem {
  int64_t num_weights, dim, num_indices, num_bags, mode;
  bool per_sample_weights;
};

// Backward scratch, byte offsets into the workspace (each 256-aligned): sort keys
// and positions (double-buffered; after the sort the spare key buffer holds each
// sorted position's bag), CUB's temporary storage, the end of each row's run in the
// sorted order, the rows some used position names (a byte per row), the chunk/group
// partials, and (max mode) the columns each position won, a bit per column.
struct BagBackwardLayout {
  int end_bit = 0;            // bits of the sort keys, which lie in [0, num_weights] (num_weights: no row)
  int64_t cub_bytes = 0;
  int64_t num_chunks = 0, num_groups = 0;
  int64_t mask_words = 0;     // max mode: 32-bit words of won columns per position
  int64_t keys[2] = {0, 0}, vals[2] = {0, 0}, cub = 0, run_end = 0, used = 0, head = 0, tail = 0, group = 0,
          mask = 0, total = 0;
};

struct EmbeddingBagLaunchConfig {
  EmbeddingBagKernel kind = EmbeddingBagKernel::kBagGather;
  int vec = 1;        // elements per thread access: 16 bytes' worth when D allows it, else 1
  int vec_bytes = 0;
  int team = 1;       // threads per bag / row / position (power of two); each owns D / (vec * team) vectors
  int threads = kBagThreads;
  int64_t blocks = 0;  // forward, per_sample_weights backward: grid size
  // Backward.
  int radix_bits = 8;             // bits per sort digit
  bool early_fill = false;        // the unused-row fill starts beside the sort (else beside the sums only)
  int fill_threads = 0;
  int64_t fill_blocks = 0;
  int fill_team = 0;              // threads per row of the fill
  int64_t grid_stride_blocks = 0;  // the keys and runs steps
  int64_t won_blocks = 0;         // max mode: the won-columns step
  int sweep_threads = 0;
  int sweep_chunks = 0;           // chunks per sweep CTA
  int64_t sweep_blocks = 0;
  bool stage_won = false;         // max mode: the sweep stages its positions' won words in shared memory
  int64_t sweep_smem = 0;
  int64_t partial_blocks = 0;     // group partials (0: no full group)
  int64_t crossing_blocks = 0;
  BagBackwardLayout layout;
  int64_t workspace_bytes = 0;
};

namespace embedding_bag_policy {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

inline void set_team(EmbeddingBagLaunchConfig& c, int64_t dim, int64_t elem_bytes, int max_team) {
  const int full = static_cast<int>(16 / elem_bytes);
  c.vec = dim % full == 0 ? full : 1;
  c.vec_bytes = static_cast<int>(c.vec * elem_bytes);
  const int64_t vectors = std::max<int64_t>(1, dim / c.vec);
  c.team = 1;
  while (c.team < vectors && c.team < max_team) c.team *= 2;
}

inline int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == c10::ScalarType::Double ? 8 : 4; }

inline int64_t grid_stride_blocks(int64_t n, const DeviceFacts& f) {
  return std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, kBagThreads), int64_t(f.num_sms) * kBagGridStrideCtasPerSm));
}

}  // namespace embedding_bag_policy

// Bits of the backward's sort keys, which lie in [0, num_weights] (num_weights: no row).
inline int bag_sort_key_bits(int64_t num_weights) {
  int bits = 0;
  while ((uint64_t(1) << bits) <= uint64_t(num_weights)) ++bits;
  return bits;
}

// Whether the sort takes kBagWideDigitBits digits (keys of 17 or 18 bits).
inline bool bag_wide_digits(int end_bit) { return end_bit == 17 || end_bit == 18; }

// The sweep's shared memory: per chunk, kBagChunk positions' key, bag, position
// (uint32 each), aux (acc_t) and the staged won words.
inline int64_t bag_sweep_smem_bytes(int chunks, int64_t staged_won_words, int64_t acc_bytes) {
  return int64_t(chunks) * kBagChunk * ((3 + staged_won_words) * 4 + acc_bytes);
}

inline bool bag_backward_is_trivial(const EmbeddingBagProblem& p) {
  return p.num_weights == 0 || p.dim == 0 || p.num_indices == 0 || p.num_bags == 0;
}

// The backward's workspace regions; sort_scratch_bytes: CUB's temporary storage
// for num_indices keys of end_bit bits.
inline BagBackwardLayout bag_backward_layout(const EmbeddingBagProblem& p, int64_t acc_bytes,
                                             int64_t sort_scratch_bytes) {
  using embedding_bag_policy::align256;
  using embedding_bag_policy::ceil_div;
  BARACUDA_CHECK_NOT_IMPLEMENTED(p.num_weights < kBagU32Limit && p.num_indices < kBagU32Limit &&
                                     p.num_bags < kBagU32Limit,
                                 kEmbeddingBagBackwardOp, ": the CUDA kernel needs num_weights, the number of "
                                 "indices and the number of bags below 2^32 - 1, got ", p.num_weights, ", ",
                                 p.num_indices, " and ", p.num_bags);
  // Every region below is at most (N + kBagChunk) * (D + 32) * 64 bytes, plus
  // 5 bytes per row and CUB's temporary storage (< 2^36 bytes with N < 2^32).
  checked_add(kEmbeddingBagBackwardOp, "the workspace size",
              checked_mul(kEmbeddingBagBackwardOp, "the workspace size", p.num_indices + kBagChunk,
                          checked_mul(kEmbeddingBagBackwardOp, "the workspace size", p.dim + 32, 64)),
              int64_t(1) << 37);
  BagBackwardLayout l;
  l.mask_words = p.mode == kModeMax ? ceil_div(p.dim, 32) : 0;
  l.end_bit = bag_sort_key_bits(p.num_weights);
  l.cub_bytes = sort_scratch_bytes;
  l.num_chunks = ceil_div(p.num_indices, kBagChunk);
  l.num_groups = l.num_chunks / kBagGroup;  // full groups only
  const int64_t n4 = align256(p.num_indices * 4);
  int64_t at = 0;
  for (int b = 0; b < 2; ++b) { l.keys[b] = at; at += n4; }
  for (int b = 0; b < 2; ++b) { l.vals[b] = at; at += n4; }
  l.cub = at;
  at += align256(l.cub_bytes);
  l.run_end = at;
  at += align256(p.num_weights * 4);
  l.used = at;
  at += align256(p.num_weights);
  l.head = at;
  at += align256(l.num_chunks * p.dim * acc_bytes);
  l.tail = at;
  at += align256(l.num_chunks * p.dim * acc_bytes);
  l.group = at;
  at += align256(l.num_groups * p.dim * acc_bytes);
  l.mask = at;
  at += align256(p.num_indices * l.mask_words * 4);
  l.total = at;
  return l;
}

inline EmbeddingBagLaunchConfig embedding_bag_forward_config(const EmbeddingBagProblem& p, c10::ScalarType dtype,
                                                             const DeviceFacts&) {
  EmbeddingBagLaunchConfig c;
  c.kind = EmbeddingBagKernel::kBagGather;
  embedding_bag_policy::set_team(c, p.dim, c10::elementSize(dtype), kBagThreads);
  c.blocks = embedding_bag_policy::ceil_div(p.num_bags, c.threads / c.team);
  return c;
}

inline EmbeddingBagLaunchConfig embedding_bag_psw_backward_config(const EmbeddingBagProblem& p,
                                                                  c10::ScalarType dtype, const DeviceFacts&) {
  EmbeddingBagLaunchConfig c;
  c.kind = EmbeddingBagKernel::kPositionDot;
  embedding_bag_policy::set_team(c, p.dim, c10::elementSize(dtype), 32);
  c.blocks = embedding_bag_policy::ceil_div(p.num_indices, c.threads / c.team);
  return c;
}

// Backward. The unused-row fill: where the rows with no run are told apart, and so
// when it starts. Early: the keys step marks each used position's row (a store per
// index), and the fill runs beside the sort and the sums; late: the runs step marks
// each run's row (a store per row with a run), and the fill runs beside the sums
// only. Early pays when grad_weight is large for the number of indices. Its grid:
// early, one CTA of kBagEarlyFillThreads on half the SMs (three quarters in max
// mode). Fill CTAs on every SM make CUB's sort kernels, launched after them, wait
// for room: an SM holding fill CTAs keeps the shared-memory carveout of a kernel
// that needs none, so kernels that need some do not fit there until they leave.
// Fewer SMs starve the fill, more leave the sort too little room; in max mode the
// larger share is faster. Late: kBagLateFillCtasPerSm CTAs of kBagLateFillThreads
// on every SM. 32 rows a warp.
inline EmbeddingBagLaunchConfig embedding_bag_backward_config(const EmbeddingBagProblem& p, c10::ScalarType dtype,
                                                              const DeviceFacts& f, int64_t sort_scratch_bytes) {
  using embedding_bag_policy::ceil_div;
  EmbeddingBagLaunchConfig c;
  c.kind = EmbeddingBagKernel::kSortSegment;
  const int64_t elem_bytes = c10::elementSize(dtype);
  const int64_t acc_bytes = embedding_bag_policy::acc_bytes_of(dtype);
  embedding_bag_policy::set_team(c, p.dim, elem_bytes, kBagThreads);
  c.early_fill = p.num_weights * p.dim * elem_bytes >= kBagEarlyFillBytes * p.num_indices;
  c.radix_bits = bag_wide_digits(bag_sort_key_bits(p.num_weights)) ? kBagWideDigitBits : 8;
  if (bag_backward_is_trivial(p)) return c;  // grad_weight is zeroed; nothing else runs
  c.layout = bag_backward_layout(p, acc_bytes, sort_scratch_bytes);
  c.workspace_bytes = c.layout.total;
  const int64_t sms = f.num_sms;
  c.fill_threads = c.early_fill ? kBagEarlyFillThreads : kBagLateFillThreads;
  const int64_t most = !c.early_fill ? sms * kBagLateFillCtasPerSm : p.mode == kModeMax ? sms * 3 / 4 : sms / 2;
  c.fill_blocks = std::max<int64_t>(1, std::min(ceil_div(p.num_weights, c.fill_threads), most));
  c.fill_team = std::min(c.team, 32);
  c.grid_stride_blocks = embedding_bag_policy::grid_stride_blocks(p.num_indices, f);
  if (p.mode == kModeMax) {
    c.won_blocks = embedding_bag_policy::grid_stride_blocks(
        p.num_bags * ceil_div(c.layout.mask_words, kBagWonWords) * 32, f);
  }
  c.sweep_threads = std::min(kBagThreads, kBagSweepChunks * c.team);
  c.sweep_chunks = c.sweep_threads / c.team;
  c.stage_won = p.mode == kModeMax &&
                bag_sweep_smem_bytes(c.sweep_chunks, c.layout.mask_words, acc_bytes) <= kBagSweepSmemBytes;
  c.sweep_smem = bag_sweep_smem_bytes(c.sweep_chunks, c.stage_won ? c.layout.mask_words : 0, acc_bytes);
  c.sweep_blocks = ceil_div(c.layout.num_chunks, c.sweep_chunks);
  const int64_t teams = c.threads / c.team;
  c.partial_blocks = c.layout.num_groups > 0 ? ceil_div(c.layout.num_groups, teams) : 0;
  c.crossing_blocks = ceil_div(c.layout.num_chunks, teams);
  return c;
}

// problem = [num_embeddings, embedding_dim, num_indices, num_bags, mode, has_per_sample_weights]
inline EmbeddingBagProblem embedding_bag_problem(const char* op, c10::IntArrayRef problem) {
  BARACUDA_CHECK_VALUE(problem.size() == 6 && problem[0] >= 0 && problem[1] >= 0 && problem[2] >= 0 &&
                           problem[3] >= 0,
                       op, ": malformed problem ", shape_str(problem));
  return {problem[0], problem[1], problem[2], problem[3], problem[4], problem[5] != 0};
}

inline LaunchConfigView embedding_bag_view(const EmbeddingBagLaunchConfig& c) {
  LaunchConfigView v;
  v.workspace_bytes = c.workspace_bytes;
  v.params = {{"team", c.team}, {"vec_bytes", c.vec_bytes}, {"threads", c.threads}};
  switch (c.kind) {
    case EmbeddingBagKernel::kBagGather:
      v.kind = "bag_gather";
      v.params.emplace_back("blocks", c.blocks);
      break;
    case EmbeddingBagKernel::kPositionDot:
      v.kind = "position_dot";
      v.params.emplace_back("blocks", c.blocks);
      break;
    case EmbeddingBagKernel::kSortSegment:
      v.kind = "sort_segment";
      v.params.insert(v.params.end(), {{"radix_bits", c.radix_bits},
                                       {"chunk", kBagChunk},
                                       {"group", kBagGroup},
                                       {"early_fill", c.early_fill},
                                       {"fill_blocks", c.fill_blocks},
                                       {"fill_threads", c.fill_threads},
                                       {"sweep_threads", c.sweep_threads},
                                       {"sweep_blocks", c.sweep_blocks},
                                       {"stage_won", c.stage_won},
                                       {"sweep_smem", c.sweep_smem}});
      break;
  }
  return v;
}

inline LaunchConfigView embedding_bag_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                  const DeviceFacts& f) {
  return embedding_bag_view(embedding_bag_forward_config(embedding_bag_problem(kEmbeddingBagOp, problem), dtype, f));
}

// Without CUB's sort scratch (see the top of this file).
inline LaunchConfigView embedding_bag_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                           const DeviceFacts& f) {
  return embedding_bag_view(
      embedding_bag_backward_config(embedding_bag_problem(kEmbeddingBagBackwardOp, problem), dtype, f, 0));
}

inline LaunchConfigView embedding_bag_psw_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                               const DeviceFacts& f) {
  return embedding_bag_view(
      embedding_bag_psw_backward_config(embedding_bag_problem(kEmbeddingBagPswBackwardOp, problem), dtype, f));
}

}  // namespace baracuda
