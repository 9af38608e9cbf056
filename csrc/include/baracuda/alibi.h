// alibi family: argument checks shared by the CPU and CUDA kernels.
//
// y[b,h,i,j] = scores[b,h,i,j] + slopes[h] * (j - i) for scores [B, H, Q, K],
// slopes [H], with i the query index in [0, Q) and j the key index in [0, K),
// used as they are (no offset when Q != K: a decode step's single query row
// gets the bias slopes[h] * j, exactly as `scores + slopes.view(H,1,1) * (j - i)`).
// The slope gradient is grad_slopes[h] = sum_{b,i,j} grad[b,h,i,j] * (j - i).
//
// scores/grad: float16, bfloat16, float32, float64; slopes: float32 or the
// scores dtype. Math in float32 (float64 for float64 scores); y has the scores
// dtype, grad_slopes the slopes dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>

#include "baracuda/checks.h"

namespace baracuda {

constexpr const char* kAlibiOp = "baracuda::alibi";
constexpr const char* kAlibiInplaceOp = "baracuda::alibi_inplace";
constexpr const char* kAlibiBackwardOp = "baracuda::alibi_backward";

// `scores_name` is "scores" for the forward ops and "grad" for the backward.
inline void check_alibi_args(const char* op, const char* scores_name, const at::Tensor& scores,
                             const at::Tensor& slopes) {
  BARACUDA_CHECK_VALUE(scores.dim() == 4, op, ": ", scores_name, " must be 4-D [B, H, Q, K], got shape ",
                    shape_str(scores.sizes()));
  check_floating(op, scores_name, scores);
  BARACUDA_CHECK_TYPE(slopes.scalar_type() == at::kFloat || slopes.scalar_type() == scores.scalar_type(), op,
                   ": slopes dtype ", slopes.scalar_type(), " must be Float or the ", scores_name, " dtype ",
                   scores.scalar_type());
  check_same_device(op, scores_name, scores, "slopes", slopes);
  BARACUDA_CHECK_VALUE(slopes.dim() == 1 && slopes.size(0) == scores.size(1), op, ": slopes shape ",
                    shape_str(slopes.sizes()), " != expected [", scores.size(1), "] (one slope per head of ",
                    scores_name, " ", shape_str(scores.sizes()), ")");
}

// out may be scores itself (y[e] = x[e] + bias, each element read before it is
// written); any other overlap is an error.
inline void check_alibi_out_overlap(const at::Tensor& scores, const at::Tensor& slopes, const at::Tensor& out) {
  check_no_overlap(kAlibiOp, {{"out", out}}, {{"scores", scores}, {"slopes", slopes}}, "scores");
}

// grad_scores may be grad itself (the identity: each element is rewritten
// with its own value).
inline void check_alibi_backward_overlap(const at::Tensor& grad, const at::Tensor& slopes,
                                         std::array<bool, 2> output_mask, const at::Tensor& grad_scores,
                                         const at::Tensor& grad_slopes, const at::Tensor& workspace) {
  check_no_overlap(kAlibiBackwardOp,
                   {{"grad_scores", if_used(output_mask[0], grad_scores)},
                    {"grad_slopes", if_used(output_mask[1], grad_slopes)}, {"workspace", workspace}},
                   {{"grad", grad}, {"slopes", slopes}}, "grad");
}

// The flat geometry of the (contiguous) problem.
struct AlibiShape {
  int64_t batch, heads, queries, keys;
  int64_t numel() const { return batch * heads * queries * keys; }
  int64_t rows() const { return batch * heads * queries; }  // rows of K elements
  int64_t per_head() const { return batch * queries * keys; }
};

inline AlibiShape alibi_shape(const at::Tensor& scores) {
  return {scores.size(0), scores.size(1), scores.size(2), scores.size(3)};
}

// problem = [B, H, Q, K] (the Plan API's encoding).
inline AlibiShape alibi_shape_of_problem(const char* op, c10::IntArrayRef problem) {
  BARACUDA_CHECK_VALUE(problem.size() == 4, op, ": problem must be [B, H, Q, K], got ", shape_str(problem));
  checked_numel(op, "problem", problem);
  return {problem[0], problem[1], problem[2], problem[3]};
}

// Calls f(static_cast<slope_t*>(nullptr)) with slope_t = scalar_t when the
// slopes have the scores dtype, float otherwise (checked to be float32).
template <typename scalar_t, typename F>
void with_slope_type(const at::Tensor& slopes, const F& f) {
  if (slopes.scalar_type() == c10::CppTypeToScalarType<scalar_t>::value) {
    f(static_cast<scalar_t*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

}  // namespace baracuda
