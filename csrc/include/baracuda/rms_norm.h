// rms_norm family: argument checks and shape logic shared by the CPU and CUDA
// kernels.
//
// The input is viewed as [M, N]: N = prod(normalized_shape) (the trailing dims),
// M = prod(the leading dims). Per row:
//   rstd = 1 / sqrt(mean(x^2) + eps),  y = x * rstd * w   (w = 1 without weight)
// computed in acc_t (float32 for half types and float32, float64 for float64).
// Output dtype = input dtype; rstd dtype = acc_t, shape = input shape with the
// normalized dims set to 1. eps defaults to the machine epsilon of acc_t, which
// is what torch.nn.functional.rms_norm uses.
// Weight: same dtype as the input, or float32 with a float16/bfloat16 input.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <optional>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"

namespace baracuda {

constexpr const char* kRmsNormOp = "baracuda::rms_norm";
constexpr const char* kRmsNormBackwardOp = "baracuda::rms_norm_backward";

struct RowShape {
  int64_t M;  // rows: product of the leading dims
  int64_t N;  // row length: product of normalized_shape
};

inline c10::ScalarType rms_acc_dtype(c10::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline double rms_default_eps(c10::ScalarType t) {
  return t == at::kDouble ? std::numeric_limits<double>::epsilon()
                          : static_cast<double>(std::numeric_limits<float>::epsilon());
}

inline bool has_tensor(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// normalized_shape has >= 1 dims and equals the input's trailing dims.
inline RowShape rms_row_shape(const char* op, c10::IntArrayRef input_shape, c10::IntArrayRef normalized_shape) {
  BARACUDA_CHECK_VALUE(!normalized_shape.empty(), op, ": normalized_shape must have at least 1 dim, got []");
  const size_t k = normalized_shape.size();
  const bool fits = k <= input_shape.size() && input_shape.slice(input_shape.size() - k) == normalized_shape;
  BARACUDA_CHECK_VALUE(fits, op, ": normalized_shape ", normalized_shape, " does not match the trailing dims of input shape ",
                    input_shape);
  RowShape s{1, 1};
  for (size_t d = 0; d < input_shape.size(); ++d) (d + k < input_shape.size() ? s.M : s.N) *= input_shape[d];
  return s;
}

inline std::vector<int64_t> rms_rstd_shape(c10::IntArrayRef input_shape, size_t normalized_dims) {
  std::vector<int64_t> shape(input_shape.begin(), input_shape.end());
  for (size_t d = shape.size() - normalized_dims; d < shape.size(); ++d) shape[d] = 1;
  return shape;
}

inline void check_rms_weight(const char* op, const at::Tensor& input, const at::Tensor& weight,
                             c10::IntArrayRef normalized_shape) {
  check_same_device(op, "input", input, "weight", weight);
  const auto x = input.scalar_type(), w = weight.scalar_type();
  const bool mixed = w == at::kFloat && (x == at::kHalf || x == at::kBFloat16);
  BARACUDA_CHECK_TYPE(w == x || mixed, op, ": weight dtype ", w, " is not supported with input dtype ", x, "; expected ",
                   x, (x == at::kHalf || x == at::kBFloat16) ? " or Float" : "");
  BARACUDA_CHECK_VALUE(weight.sizes() == normalized_shape, op, ": weight shape ", weight.sizes(),
                    " != normalized_shape ", normalized_shape);
}

// Forward inputs; returns the row view.
inline RowShape check_rms_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight) {
  check_floating(kRmsNormOp, "input", input);
  const auto rows = rms_row_shape(kRmsNormOp, input.sizes(), normalized_shape);
  if (has_tensor(weight)) check_rms_weight(kRmsNormOp, input, *weight, normalized_shape);
  return rows;
}

// Backward inputs: grad_out like input, rstd as the forward returns it.
inline RowShape check_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                        c10::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                        const std::optional<at::Tensor>& weight) {
  const char* op = kRmsNormBackwardOp;
  check_floating(op, "input", input);
  const auto rows = rms_row_shape(op, input.sizes(), normalized_shape);
  check_same_device(op, "input", input, "grad_out", grad_out);
  check_same_device(op, "input", input, "rstd", rstd);
  check_same_dtype(op, "input", input, "grad_out", grad_out);
  BARACUDA_CHECK_VALUE(grad_out.sizes() == input.sizes(), op, ": grad_out shape ", grad_out.sizes(), " != input shape ",
                    input.sizes());
  const auto acc = rms_acc_dtype(input.scalar_type());
  BARACUDA_CHECK_TYPE(rstd.scalar_type() == acc, op, ": rstd dtype ", rstd.scalar_type(), " != expected ", acc);
  const auto stat_shape = rms_rstd_shape(input.sizes(), normalized_shape.size());
  BARACUDA_CHECK_VALUE(rstd.sizes() == c10::IntArrayRef(stat_shape), op, ": rstd shape ", rstd.sizes(),
                    " != expected ", c10::IntArrayRef(stat_shape));
  if (has_tensor(weight)) check_rms_weight(op, input, *weight, normalized_shape);
  return rows;
}

inline void check_rms_norm_out_overlap(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                       const at::Tensor& output, const at::Tensor& rstd) {
  check_no_overlap(kRmsNormOp, {{"output", output}, {"rstd", rstd}},
                   {{"input", input}, {"weight", has_tensor(weight) ? *weight : at::Tensor()}});
}

// grad_input / grad_weight: undefined when not written (output_mask).
inline void check_rms_norm_backward_overlap(const at::Tensor& grad_out, const at::Tensor& input,
                                            const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                            const at::Tensor& grad_input, const at::Tensor& grad_weight,
                                            const at::Tensor& workspace) {
  check_no_overlap(kRmsNormBackwardOp,
                   {{"grad_input", grad_input}, {"grad_weight", grad_weight}, {"workspace", workspace}},
                   {{"grad_out", grad_out},
                    {"input", input},
                    {"rstd", rstd},
                    {"weight", has_tensor(weight) ? *weight : at::Tensor()}});
}

// Calls fn(W{}) with W the weight's element type: scalar_t, or float for a
// float32 weight on a half input (the only mixed pair the checks admit).
template <typename scalar_t, typename Fn>
void with_weight_type(const at::Tensor& input, const std::optional<at::Tensor>& weight, Fn&& fn) {
  if constexpr (std::is_same_v<at::opmath_type<scalar_t>, float> && !std::is_same_v<scalar_t, float>) {
    if (has_tensor(weight) && weight->scalar_type() != input.scalar_type()) return fn(float{});
  }
  fn(scalar_t{});
}

// Calls fn(W{}) for every weight type a scalar_t input admits: scalar_t, and
// float for a float16/bfloat16 input.
template <typename scalar_t, typename Fn>
void for_each_weight_type(Fn&& fn) {
  fn(scalar_t{});
  if constexpr (std::is_same_v<at::opmath_type<scalar_t>, float> && !std::is_same_v<scalar_t, float>) fn(float{});
}

}  // namespace baracuda
