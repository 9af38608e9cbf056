// alibi family, CUDA launch policy (baracuda/launch_policy.h): a pure function of
// the problem [B, H, Q, K], the dtype and the device's facts, shared by the
// launchers (csrc/cuda/alibi.cu) and the Plan API. Plain C++: compiled into
// CPU-only builds too, so CI runs it with recorded facts.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>

#include "baracuda/alibi.h"
#include "baracuda/launch_policy.h"

namespace baracuda {

constexpr int kAlibiThreads = 256;  // threads per block, both directions
constexpr int kAlibiUnroll = 4;     // backward: vectors whose loads a thread issues together

enum class AlibiKernel {
  kBiasStream,     // forward: y = x + slopes[h] * (j - i), one pass over the tensor
  kSlopeGradRows,  // backward: grad_slopes[h] = sum grad * (j - i), rows of a head per block
};

struct AlibiLaunchConfig {
  AlibiKernel kind = AlibiKernel::kBiasStream;
  int vec_bytes = 16;            // bytes per access: 16 when a row of K elements is a whole number of vectors
  bool index32 = true;           // 32-bit index math (fast division) when the tensor has < 2^31 elements
  int threads = kAlibiThreads;
  int vectors_per_thread = 1;    // forward: vectors a thread loads before its first store (4 or 1)
  int64_t blocks = 0;            // forward: grid size (no grid-stride loop)
  int segments_log2 = 0;         // backward: each row is cut into 2^segments_log2 segments (one warp each)
  int64_t chunks = 1;            // backward: blocks per head; > 1 adds the ordered combine of the partials
  int64_t workspace_bytes = 0;   // backward: an acc_t partial per (head, chunk) when chunks > 1
};

namespace alibi_policy {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline AlibiLaunchConfig common(const AlibiShape& s, int64_t elem_bytes) {
  AlibiLaunchConfig c;
  c.vec_bytes = (s.keys * elem_bytes) % 16 == 0 ? 16 : static_cast<int>(elem_bytes);
  c.index32 = s.numel() < (int64_t(1) << 31);
  return c;
}

}  // namespace alibi_policy

// Forward: a tensor that takes at most half the GPU's threads at 4 vectors a
// thread runs so, one wave of CTAs that issue all their loads at once; a larger
// one takes 1 vector a thread, short CTAs whose reads and writes overlap those of
// the CTAs before and after them. The bound lies between a decode [64, 16, 1,
// 4096] float32 tensor (a full wave at 4 vectors, faster at 1) and its bf16 half
// (half a wave, faster at 4).
inline AlibiLaunchConfig alibi_forward_config(const AlibiShape& s, c10::ScalarType dtype, const DeviceFacts& f) {
  const int64_t elem_bytes = c10::elementSize(dtype);
  AlibiLaunchConfig c = alibi_policy::common(s, elem_bytes);
  c.kind = AlibiKernel::kBiasStream;
  const int64_t vectors = s.numel() * elem_bytes / c.vec_bytes;
  const int64_t half_the_threads = int64_t(f.num_sms) * f.max_threads_per_sm / 2;
  c.vectors_per_thread = vectors <= half_the_threads * 4 ? 4 : 1;
  c.blocks = alibi_policy::ceil_div(vectors, int64_t(c.threads) * c.vectors_per_thread);
  return c;
}

// Backward work items are (row, segment) pairs, one warp each. Rows are cut into
// segments (a power of two, each at least one unrolled warp pass long) only when
// whole rows give fewer warps than two waves of the GPU; the items of a head are
// then split evenly into chunks, about two waves of blocks in all.
inline AlibiLaunchConfig alibi_backward_config(const AlibiShape& s, c10::ScalarType dtype, const DeviceFacts& f) {
  using alibi_policy::ceil_div;
  const int64_t elem_bytes = c10::elementSize(dtype);
  AlibiLaunchConfig c = alibi_policy::common(s, elem_bytes);
  c.kind = AlibiKernel::kSlopeGradRows;
  const int64_t row_vectors = s.keys / (c.vec_bytes / elem_bytes);
  const int64_t rows_per_head = s.batch * s.queries;
  if (s.heads == 0 || rows_per_head == 0 || row_vectors == 0) return c;
  const int64_t want_warps = 2 * int64_t(f.num_sms) * (f.max_threads_per_sm / 32);
  while (int64_t(32 * kAlibiUnroll) << (c.segments_log2 + 1) <= row_vectors &&
         (s.heads * rows_per_head << c.segments_log2) < want_warps) {
    ++c.segments_log2;
  }
  const int64_t items = rows_per_head << c.segments_log2;
  const int64_t want_blocks = int64_t(f.num_sms) * (f.max_threads_per_sm / c.threads) * 2;
  int64_t chunks = std::min(ceil_div(want_blocks, s.heads), ceil_div(items, c.threads / 32));
  chunks = std::clamp<int64_t>(chunks, 1, 65535);
  c.chunks = ceil_div(items, ceil_div(items, chunks));
  const int64_t acc_bytes = dtype == c10::ScalarType::Double ? 8 : 4;
  c.workspace_bytes = c.chunks > 1 ? s.heads * c.chunks * acc_bytes : 0;
  return c;
}

inline LaunchConfigView alibi_view(const AlibiLaunchConfig& c) {
  LaunchConfigView v;
  v.workspace_bytes = c.workspace_bytes;
  if (c.kind == AlibiKernel::kBiasStream) {
    v.kind = "bias_stream";
    v.params = {{"vec_bytes", c.vec_bytes},
                {"index32", c.index32},
                {"threads", c.threads},
                {"vectors_per_thread", c.vectors_per_thread},
                {"blocks", c.blocks}};
  } else {
    v.kind = "slope_grad_rows";
    v.params = {{"vec_bytes", c.vec_bytes},
                {"index32", c.index32},
                {"threads", c.threads},
                {"segments", int64_t(1) << c.segments_log2},
                {"chunks", c.chunks}};
  }
  return v;
}

// problem = [B, H, Q, K]
inline LaunchConfigView alibi_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype, const DeviceFacts& f) {
  return alibi_view(alibi_forward_config(alibi_shape_of_problem(kAlibiOp, problem), dtype, f));
}

inline LaunchConfigView alibi_backward_launch_view(c10::IntArrayRef problem, c10::ScalarType dtype,
                                                   const DeviceFacts& f) {
  return alibi_view(alibi_backward_config(alibi_shape_of_problem(kAlibiBackwardOp, problem), dtype, f));
}

}  // namespace baracuda
