// rms_norm_fused family: argument checks, shape logic and the per-element math
// shared by the CPU and CUDA kernels.
//
// The input is viewed as [M, N] rows, N = prod(normalized_shape). Per row, in
// acc_t (float32 for half types and float32, float64 for float64):
//   h    = x + r                       (with a residual r; rounded to r's dtype R)
//   rstd = 1 / sqrt(mean(h^2) + eps)   (of h as stored, so y = rms_norm(h) exactly)
//   wo   = w + weight_offset           (1 without a weight)
//   y    = h * rstd * wo               casting "torch" and "gemma": one rounding, at the end
//   y    = OutT(acc(T(h * rstd)) * wo) casting "llama": x-hat rounded to the input dtype T first
// Per-head weight: a weight of shape input.shape[-k:], k > len(normalized_shape),
// i.e. H = numel(weight) / N rows of N: row i uses weight row i mod H.
// Output dtype: T, but for "llama" with a float32 weight on a half input: float32
// (PyTorch's promotion of weight * x_hat). residual_out: h in R = residual's dtype
// (T, or float32 on a half input); without a residual an empty [0] tensor of T.
// Backward, with g = dy * wo, per row:
//   dh = rstd * g - h * rstd^3 * mean(g * h)  (+ grad_residual_out)
//   grad_input = T(dh), grad_residual = R(dh), dw = sum over rows (of its head) dy * x_hat
// The llama rounding of x-hat is treated as the identity in dh (as autograd
// treats a dtype cast) and kept in dw (autograd multiplies dy by the rounded x-hat).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/dispatch.h"
#include "baracuda/rms_norm.h"

namespace baracuda {

constexpr const char* kRmsNormFusedOp = "baracuda::rms_norm_fused";
constexpr const char* kRmsNormFusedBackwardOp = "baracuda::rms_norm_fused_backward";

enum class Casting : int { kTorch = 0, kLlama = 1, kGemma = 2 };

inline Casting parse_casting(const char* op, c10::string_view casting) {
  if (casting == "torch") return Casting::kTorch;
  if (casting == "llama") return Casting::kLlama;
  BARACUDA_CHECK_VALUE(casting == "gemma", op, ": casting must be \"torch\", \"llama\" or \"gemma\", got \"",
                    std::string(casting), "\"");
  return Casting::kGemma;
}

inline bool is_half_type(c10::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// M rows of N elements; the weight has H rows of N (H = 1: one weight row for all).
struct FusedRows {
  int64_t M;
  int64_t N;
  int64_t H;
};

// A weight: the input's dtype, or float32 with a half input; shape normalized_shape,
// or (per head) the input's trailing weight.dim() dims, weight.dim() > len(normalized_shape).
// Returns H.
inline int64_t check_fused_weight(const char* op, c10::ScalarType x, c10::IntArrayRef input_shape,
                                  const at::Tensor& weight, c10::IntArrayRef normalized_shape) {
  const auto w = weight.scalar_type();
  BARACUDA_CHECK_TYPE(w == x || (w == at::kFloat && is_half_type(x)), op, ": weight dtype ", w,
                   " is not supported with input dtype ", x, "; expected ", x, is_half_type(x) ? " or Float" : "");
  const auto ws = weight.sizes();
  const size_t k = normalized_shape.size();
  const bool plain = ws == normalized_shape;
  const bool per_head =
      ws.size() > k && ws.size() <= input_shape.size() && ws == input_shape.slice(input_shape.size() - ws.size());
  BARACUDA_CHECK_VALUE(plain || per_head, op, ": weight shape ", shape_str(ws), " must be normalized_shape ",
                    shape_str(normalized_shape), " or, per head, the input's trailing dims (input shape ",
                    shape_str(input_shape), ")");
  int64_t H = 1;
  for (size_t d = 0; d + k < ws.size(); ++d) H *= ws[d];
  return H;
}

// The tensor that holds h's dtype R: the residual's, or the input's without one.
inline void check_fused_residual(const char* op, const at::Tensor& input, const at::Tensor& residual) {
  check_same_device(op, "input", input, "residual", residual);
  const auto x = input.scalar_type(), r = residual.scalar_type();
  BARACUDA_CHECK_TYPE(r == x || (r == at::kFloat && is_half_type(x)), op, ": residual dtype ", r,
                   " is not supported with input dtype ", x, "; expected ", x, is_half_type(x) ? " or Float" : "");
  BARACUDA_CHECK_VALUE(residual.sizes() == input.sizes(), op, ": residual shape ", shape_str(residual.sizes()),
                    " != input shape ", shape_str(input.sizes()));
}

inline void check_weight_offset(const char* op, bool has_weight, double weight_offset) {
  BARACUDA_CHECK_VALUE(std::isfinite(weight_offset), op, ": weight_offset must be finite, got ", weight_offset);
  BARACUDA_CHECK_VALUE(has_weight || weight_offset == 0.0, op, ": weight_offset=", weight_offset,
                    " needs a weight (y = x_hat * (weight + weight_offset)); got weight=None");
}

// Output dtype: T, or float32 for "llama" with a float32 weight on a half input.
inline c10::ScalarType fused_output_dtype(c10::ScalarType input, const std::optional<at::Tensor>& weight,
                                          Casting casting) {
  if (casting == Casting::kLlama && has_tensor(weight)) return c10::promoteTypes(input, weight->scalar_type());
  return input;
}

// Forward inputs (of rms_norm_fused, or of rms_norm_quant: op names the one); returns the row view.
inline FusedRows check_rms_norm_fused(const char* op, const at::Tensor& input,
                                      const std::optional<at::Tensor>& residual, c10::IntArrayRef normalized_shape,
                                      const std::optional<at::Tensor>& weight, double weight_offset) {
  check_floating(op, "input", input);
  const auto rows = rms_row_shape(op, input.sizes(), normalized_shape);
  if (has_tensor(residual)) check_fused_residual(op, input, *residual);
  int64_t H = 1;
  if (has_tensor(weight)) {
    check_same_device(op, "input", input, "weight", *weight);
    H = check_fused_weight(op, input.scalar_type(), input.sizes(), *weight, normalized_shape);
  }
  check_weight_offset(op, has_tensor(weight), weight_offset);
  return {rows.M, rows.N, H};
}

// Backward inputs: h (the residual stream, or the input itself without a residual), grad_out
// like the output, grad_residual_out like h, rstd as the forward returns it.
inline FusedRows check_rms_norm_fused_backward(const at::Tensor& grad_out,
                                               const std::optional<at::Tensor>& grad_residual_out,
                                               const at::Tensor& h, c10::IntArrayRef normalized_shape,
                                               const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                               double weight_offset, Casting casting, c10::ScalarType input_dtype) {
  const char* op = kRmsNormFusedBackwardOp;
  check_floating(op, "h", h);
  BARACUDA_CHECK_TYPE(is_float_type(input_dtype), op, ": input_dtype must be float16, bfloat16, float32 or float64, got ",
                   input_dtype);
  const auto r = h.scalar_type();
  BARACUDA_CHECK_TYPE(r == input_dtype || (r == at::kFloat && is_half_type(input_dtype)), op, ": h dtype ", r,
                   " is not supported with input dtype ", input_dtype);
  const auto rows = rms_row_shape(op, h.sizes(), normalized_shape);
  check_same_device(op, "h", h, "grad_out", grad_out);
  check_same_device(op, "h", h, "rstd", rstd);
  BARACUDA_CHECK_VALUE(grad_out.sizes() == h.sizes(), op, ": grad_out shape ", shape_str(grad_out.sizes()),
                    " != h shape ", shape_str(h.sizes()));
  if (has_tensor(grad_residual_out)) {
    check_same_device(op, "h", h, "grad_residual_out", *grad_residual_out);
    check_same_dtype(op, "h", h, "grad_residual_out", *grad_residual_out);
    BARACUDA_CHECK_VALUE(grad_residual_out->sizes() == h.sizes(), op, ": grad_residual_out shape ",
                      shape_str(grad_residual_out->sizes()), " != h shape ", shape_str(h.sizes()));
  }
  const auto acc = rms_acc_dtype(input_dtype);
  BARACUDA_CHECK_TYPE(rstd.scalar_type() == acc, op, ": rstd dtype ", rstd.scalar_type(), " != expected ", acc);
  const auto stat_shape = rms_rstd_shape(h.sizes(), normalized_shape.size());
  BARACUDA_CHECK_VALUE(rstd.sizes() == c10::IntArrayRef(stat_shape), op, ": rstd shape ", shape_str(rstd.sizes()),
                    " != expected ", shape_str(stat_shape));
  int64_t H = 1;
  if (has_tensor(weight)) {
    check_same_device(op, "h", h, "weight", *weight);
    H = check_fused_weight(op, input_dtype, h.sizes(), *weight, normalized_shape);
  }
  check_weight_offset(op, has_tensor(weight), weight_offset);
  const auto out_dtype = fused_output_dtype(input_dtype, weight, casting);
  BARACUDA_CHECK_TYPE(grad_out.scalar_type() == out_dtype, op, ": grad_out dtype ", grad_out.scalar_type(),
                   " != output dtype ", out_dtype);
  return {rows.M, rows.N, H};
}

inline void check_fused_out_contiguous(const char* op, const char* name, const at::Tensor& t) {
  BARACUDA_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// The forward's outputs (out-variant): shape, dtype, device, contiguity, all checked before anything is written.
inline void check_fused_forward_outputs(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                                        c10::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                                        Casting casting, const at::Tensor& output, const at::Tensor& residual_out,
                                        const at::Tensor& rstd) {
  const char* op = kRmsNormFusedOp;
  check_out(op, "output", output, input.sizes(), fused_output_dtype(input.scalar_type(), weight, casting),
            input.device());
  if (has_tensor(residual)) {
    check_out(op, "residual_out", residual_out, input.sizes(), residual->scalar_type(), input.device());
  }
  check_out(op, "rstd", rstd, rms_rstd_shape(input.sizes(), normalized_shape.size()),
            rms_acc_dtype(input.scalar_type()), input.device());
  check_fused_out_contiguous(op, "output", output);
  check_fused_out_contiguous(op, "residual_out", residual_out);
  check_fused_out_contiguous(op, "rstd", rstd);
}

// ---------------------------------------------------------------------------
// rms_norm_quant: the forward's y quantized to float8_e4m3fn,
//   q = fp8(clamp(y / scale, -448, 448))   (y rounded to the output dtype first; NaN stays NaN)
// with scale a float32 tensor of one element (static, per tensor), or per row
// max|y| / 448 rounded to float32 (1 for a row of zeros), returned in scale_out
// (shape of rstd; an empty [0] tensor with a static scale). The division runs in
// acc_t, as PyTorch divides y by a float32 scale.

constexpr const char* kRmsNormQuantOp = "baracuda::rms_norm_quant";
constexpr float kFp8E4m3Max = 448.f;

// A static scale: float32, one element, on the input's device; its value (finite, > 0) is
// checked here for a CPU tensor only: reading a CUDA tensor's value would sync with the host
// (baracuda_ops.rms_norm_quant checks it before calling the op).
inline void check_fp8_scale(const char* op, const at::Tensor& input, const at::Tensor& scale) {
  check_same_device(op, "input", input, "scale", scale);
  BARACUDA_CHECK_TYPE(scale.scalar_type() == at::kFloat, op, ": scale dtype ", scale.scalar_type(),
                   " != expected Float");
  BARACUDA_CHECK_VALUE(scale.numel() == 1, op, ": scale must have 1 element (a per-tensor scale), got shape ",
                    shape_str(scale.sizes()));
  if (scale.device().is_cpu()) {
    const float v = *scale.const_data_ptr<float>();
    BARACUDA_CHECK_VALUE(std::isfinite(v) && v > 0.f, op, ": scale must be finite and > 0, got ", v);
  }
}

inline void check_quant_outputs(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                                c10::IntArrayRef normalized_shape, bool dynamic, const at::Tensor& output,
                                const at::Tensor& residual_out, const at::Tensor& scale_out) {
  const char* op = kRmsNormQuantOp;
  check_out(op, "output", output, input.sizes(), at::kFloat8_e4m3fn, input.device());
  if (has_tensor(residual)) {
    check_out(op, "residual_out", residual_out, input.sizes(), residual->scalar_type(), input.device());
  }
  if (dynamic) {
    check_out(op, "scale_out", scale_out, rms_rstd_shape(input.sizes(), normalized_shape.size()), at::kFloat,
              input.device());
  }
  check_fused_out_contiguous(op, "output", output);
  check_fused_out_contiguous(op, "residual_out", residual_out);
  check_fused_out_contiguous(op, "scale_out", scale_out);
}

template <typename acc_t>
C10_HOST_DEVICE inline acc_t fp8_amax(acc_t amax, acc_t y) {
  const acc_t a = y < acc_t(0) ? -y : y;
  return a > amax ? a : amax;
}

template <typename acc_t>
C10_HOST_DEVICE inline float fp8_row_scale(acc_t amax) {
  return amax > acc_t(0) ? static_cast<float>(amax / acc_t(kFp8E4m3Max)) : 1.f;
}

template <typename acc_t>
C10_HOST_DEVICE inline c10::Float8_e4m3fn fp8_quantize(acc_t y, float scale) {
  constexpr acc_t kMax = kFp8E4m3Max;
  acc_t v = y / static_cast<acc_t>(scale);
  v = v < -kMax ? -kMax : (v > kMax ? kMax : v);
  return c10::Float8_e4m3fn(static_cast<float>(v));
}

// The backward's outputs that output_mask asks for (grad_weight only with a weight).
inline void check_fused_backward_outputs(const at::Tensor& h, const std::optional<at::Tensor>& weight,
                                         c10::ScalarType input_dtype, std::array<bool, 3> output_mask,
                                         const at::Tensor& grad_input, const at::Tensor& grad_residual,
                                         const at::Tensor& grad_weight) {
  const char* op = kRmsNormFusedBackwardOp;
  if (output_mask[0]) {
    check_out(op, "grad_input", grad_input, h.sizes(), input_dtype, h.device());
    check_fused_out_contiguous(op, "grad_input", grad_input);
  }
  if (output_mask[1]) {
    check_out(op, "grad_residual", grad_residual, h.sizes(), h.scalar_type(), h.device());
    check_fused_out_contiguous(op, "grad_residual", grad_residual);
  }
  if (output_mask[2] && has_tensor(weight)) {
    check_out(op, "grad_weight", grad_weight, weight->sizes(), weight->scalar_type(), h.device());
    check_fused_out_contiguous(op, "grad_weight", grad_weight);
  }
}

// What rms_norm_fused_backward.out computes, once its arguments and outputs are checked
// (the same on CPU and CUDA): the rows, the casting, and which gradients are asked
// (grad_weight only with a weight); `run` is false when nothing is left to compute
// (no gradient asked, N == 0, or M == 0, where grad_weight is zeroed here).
struct FusedBackwardRequest {
  FusedRows rows;
  Casting casting;
  bool dx, dr, dw;
  bool run;
};

inline FusedBackwardRequest fused_backward_request(const at::Tensor& grad_out,
                                                   const std::optional<at::Tensor>& grad_residual_out,
                                                   const at::Tensor& h, at::IntArrayRef normalized_shape,
                                                   const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                                   double weight_offset, c10::string_view casting_name,
                                                   at::ScalarType input_dtype, std::array<bool, 3> output_mask,
                                                   const at::Tensor& grad_input, const at::Tensor& grad_residual,
                                                   const at::Tensor& grad_weight) {
  FusedBackwardRequest q;
  q.casting = parse_casting(kRmsNormFusedBackwardOp, casting_name);
  q.rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                         weight_offset, q.casting, input_dtype);
  q.dx = output_mask[0];
  q.dr = output_mask[1];
  q.dw = output_mask[2] && has_tensor(weight);
  check_fused_backward_outputs(h, weight, input_dtype, output_mask, grad_input, grad_residual, grad_weight);
  q.run = q.rows.N > 0 && q.rows.M > 0 && (q.dx || q.dr || q.dw);
  if (q.rows.N > 0 && q.rows.M == 0 && q.dw) grad_weight.zero_();
  return q;
}

// Calls fn(U{}) with U = float when use_float (only a half scalar_t admits it), else scalar_t.
template <typename scalar_t, typename Fn>
void with_type_or_float(bool use_float, Fn&& fn) {
  if constexpr (std::is_same_v<at::opmath_type<scalar_t>, float> && !std::is_same_v<scalar_t, float>) {
    if (use_float) return fn(float{});
  }
  fn(scalar_t{});
}

// Calls fn(T{}, R{}, W{}, OutT{}): T the input's element type, and R (h), W (weight), OutT (output)
// each T or, where the flag says so, float (with a half input only).
template <typename Fn>
void dispatch_fused_types(c10::ScalarType input, bool r_float, bool w_float, bool out_float, Fn&& fn) {
  BARACUDA_DISPATCH_FLOATING(input, "rms_norm_fused", [&] {
    with_type_or_float<scalar_t>(r_float, [&](auto r) {
      with_type_or_float<scalar_t>(w_float, [&](auto w) {
        with_type_or_float<scalar_t>(out_float, [&](auto o) { fn(scalar_t{}, r, w, o); });
      });
    });
  });
}

// ---------------------------------------------------------------------------
// Per-element math, the same on CPU and CUDA.

// y for one element of h (acc_t), its row's rstd and wo = w + weight_offset.
template <typename OutT, typename T, typename acc_t>
C10_HOST_DEVICE inline OutT fused_output(acc_t h, acc_t rstd, acc_t wo, bool llama) {
  const acc_t xhat = h * rstd;
  return static_cast<OutT>((llama ? static_cast<acc_t>(static_cast<T>(xhat)) : xhat) * wo);
}

// x_hat as the weight gradient sees it: rounded to T under "llama".
template <typename T, typename acc_t>
C10_HOST_DEVICE inline acc_t fused_xhat(acc_t h, acc_t rstd, bool llama) {
  const acc_t xhat = h * rstd;
  return llama ? static_cast<acc_t>(static_cast<T>(xhat)) : xhat;
}

// wo = w + weight_offset in acc_t (w = 1 without a weight: weight_offset is then 0).
template <typename W, typename acc_t>
C10_HOST_DEVICE inline acc_t fused_weight(const W* w, int64_t j, acc_t offset) {
  return w == nullptr ? acc_t(1) : static_cast<acc_t>(w[j]) + offset;
}

// The functional ops' outputs, allocated alike on every device (the .out kernels fill them).
// rms_norm_fused: (output in fused_output_dtype, residual_out like the residual, or
// empty without one, rstd).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_rms_norm_fused_outputs(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, c10::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, Casting casting) {
  auto output =
      at::empty(input.sizes(), input.options().dtype(fused_output_dtype(input.scalar_type(), weight, casting)));
  auto residual_out =
      has_tensor(residual) ? at::empty(input.sizes(), residual->options()) : at::empty({0}, input.options());
  auto rstd = at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                        input.options().dtype(rms_acc_dtype(input.scalar_type())));
  return {output, residual_out, rstd};
}

// rms_norm_quant: (float8_e4m3fn output, residual_out as above, the per-row scales of
// a dynamic scale, or empty with a static one).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_rms_norm_quant_outputs(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, c10::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& scale) {
  auto output = at::empty(input.sizes(), input.options().dtype(at::kFloat8_e4m3fn));
  auto residual_out =
      has_tensor(residual) ? at::empty(input.sizes(), residual->options()) : at::empty({0}, input.options());
  auto scale_out = has_tensor(scale) ? at::empty({0}, input.options().dtype(at::kFloat))
                                     : at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                                                 input.options().dtype(at::kFloat));
  return {output, residual_out, scale_out};
}

// rms_norm_fused_backward: the gradients output_mask asks for (grad_weight only with a
// weight); the others undefined (None in Python), as aten::_fused_rms_norm_backward returns.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_rms_norm_fused_grads(
    const at::Tensor& h, const std::optional<at::Tensor>& weight, at::ScalarType input_dtype,
    std::array<bool, 3> output_mask) {
  at::Tensor grad_input, grad_residual, grad_weight;
  if (output_mask[0]) grad_input = at::empty(h.sizes(), h.options().dtype(input_dtype));
  if (output_mask[1]) grad_residual = at::empty(h.sizes(), h.options());
  if (output_mask[2] && has_tensor(weight)) grad_weight = at::empty(weight->sizes(), weight->options());
  return {grad_input, grad_residual, grad_weight};
}

// The functional ops, alike on every device: the checks that size the outputs, the
// outputs, then the device's .out op (Out) fills them.
template <auto Out>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_functional(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name) {
  const Casting casting = parse_casting(kRmsNormFusedOp, casting_name);
  check_rms_norm_fused(kRmsNormFusedOp, input, residual, normalized_shape, weight, weight_offset);
  auto outputs = empty_rms_norm_fused_outputs(input, residual, normalized_shape, weight, casting);
  const auto& [output, residual_out, rstd] = outputs;
  Out(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, output, residual_out, rstd);
  return outputs;
}

template <auto Out>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_quant_functional(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name, const std::optional<at::Tensor>& scale) {
  parse_casting(kRmsNormQuantOp, casting_name);
  check_rms_norm_fused(kRmsNormQuantOp, input, residual, normalized_shape, weight, weight_offset);
  auto outputs = empty_rms_norm_quant_outputs(input, residual, normalized_shape, scale);
  const auto& [output, residual_out, scale_out] = outputs;
  Out(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, scale, output, residual_out,
      scale_out);
  return outputs;
}

// WorkspaceBytes(rows, grad_out, h, input_dtype, want_dw): the bytes of workspace Out takes.
template <auto Out, auto WorkspaceBytes>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_backward_functional(
    const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out, const at::Tensor& h,
    at::IntArrayRef normalized_shape, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    double weight_offset, c10::string_view casting_name, at::ScalarType input_dtype, std::array<bool, 3> output_mask) {
  const Casting casting = parse_casting(kRmsNormFusedBackwardOp, casting_name);
  const auto rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                  weight_offset, casting, input_dtype);
  auto grads = empty_rms_norm_fused_grads(h, weight, input_dtype, output_mask);
  const auto& [grad_input, grad_residual, grad_weight] = grads;
  const auto none = at::empty({0}, h.options());
  const int64_t workspace = WorkspaceBytes(rows, grad_out, h, input_dtype, grad_weight.defined());
  Out(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset, casting_name, input_dtype,
      output_mask, grad_input.defined() ? grad_input : none, grad_residual.defined() ? grad_residual : none,
      grad_weight.defined() ? grad_weight : none, at::empty({workspace}, h.options().dtype(at::kByte)));
  return grads;
}

}  // namespace baracuda
