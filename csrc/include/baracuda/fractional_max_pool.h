// fractional_max_pool family (2d and 3d): argument checks, the pooling
// geometry and PyTorch's window-start formula, shared by the CPU and CUDA kernels.
//
// Both ops are handled as 3-d pooling over planes: 2d input [N, C, H, W] is
// [N*C planes, T=1, H, W] with k_T = out_T = 1. Per axis, with u the plane's
// sample for that axis and alpha = (in - k) / (out - 1):
//   start[i] = int((i + u) * alpha) - int(u * alpha)   for i < out - 1,
//   start[out - 1] = in - k,
// evaluated in the type PyTorch evaluates it in (CPU: the input's scalar type,
// c10::Half / c10::BFloat16 arithmetic included; CUDA: float for half types and
// float, double for double). Window [start, start + k) along each axis; the
// output is its first maximum (`val > max || isnan(val)`, starting from -inf at
// the window's first element), the index is t*H*W + h*W + w within the plane.
// Samples: 2d [..., 0] -> W, [..., 1] -> H; 3d [..., 0] -> T, 1 -> H, 2 -> W.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"

namespace baracuda {

constexpr const char* kFractionalMaxPool2dOp = "baracuda::fractional_max_pool2d";
constexpr const char* kFractionalMaxPool2dBackwardOp = "baracuda::fractional_max_pool2d_backward";
constexpr const char* kFractionalMaxPool3dOp = "baracuda::fractional_max_pool3d";
constexpr const char* kFractionalMaxPool3dBackwardOp = "baracuda::fractional_max_pool3d_backward";

inline const char* fmp_op_name(int dims, bool backward) {
  if (dims == 2) return backward ? kFractionalMaxPool2dBackwardOp : kFractionalMaxPool2dOp;
  return backward ? kFractionalMaxPool3dBackwardOp : kFractionalMaxPool3dOp;
}

// C-style truncation to an integer, defined for every input (NaN -> 0,
// out-of-range values saturate) so that a hostile sample cannot cause UB.
template <typename T>
C10_HOST_DEVICE inline int64_t fmp_trunc(T x) {
  using C = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
  const C v = static_cast<C>(x);
  if (v != v) return 0;
  if (v >= C(2147483647)) return 2147483647;
  if (v <= C(-2147483647)) return -2147483647;
  return static_cast<int64_t>(v);
}

// PyTorch's window start for output i along one axis, computed in T (see the
// top of this file). `i + sample` is int64_t + T exactly as in PyTorch, so the
// c10::Half / c10::BFloat16 operators round where PyTorch's CPU kernel does.
// The result is clamped to [0, in - k]; it only moves where PyTorch itself
// would read outside the input (a sample outside [0, 1), or half-precision
// rounding on huge axes), so the kernels never read out of bounds.
// Split so that a kernel can hoist what depends on the axis and plane only:
// alpha = fmp_alpha(in, out, k) and base = fmp_trunc<T>(sample * alpha).
template <typename T>
C10_HOST_DEVICE inline T fmp_alpha(int64_t in, int64_t out, int64_t k) {
  return out > 1 ? static_cast<T>(in - k) / static_cast<T>(out - 1) : static_cast<T>(0);
}

template <typename T>
C10_HOST_DEVICE inline int64_t fmp_start_from(T sample, T alpha, int64_t base, int64_t i, int64_t in, int64_t out,
                                              int64_t k) {
  if (i == out - 1) return in - k;
  const int64_t s = fmp_trunc<T>((i + sample) * alpha) - base;
  return s < 0 ? 0 : (s > in - k ? in - k : s);
}

template <typename T>
C10_HOST_DEVICE inline int64_t fmp_start(T sample, int64_t i, int64_t in, int64_t out, int64_t k) {
  if (i == out - 1) return in - k;
  const T alpha = fmp_alpha<T>(in, out, k);
  return fmp_start_from<T>(sample, alpha, fmp_trunc<T>(sample * alpha), i, in, out, k);
}

// The problem as 3-d pooling over planes.
struct FmpGeometry {
  int dims = 2;        // 2 or 3: the op
  int64_t batch = 1;   // N (1 for unbatched input)
  int64_t channels = 1;
  int64_t in[3] = {1, 1, 1};   // T, H, W
  int64_t out[3] = {1, 1, 1};  // T, H, W
  int64_t k[3] = {1, 1, 1};    // T, H, W
  // Which sample of the plane drives each axis (T, H, W); -1: none (2d's T).
  int sample_slot[3] = {-1, 1, 0};

  int64_t planes() const { return batch * channels; }
  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t out_plane() const { return out[0] * out[1] * out[2]; }
  // 2 or 3 when every pooled axis has that kernel size (the kernels' windows unrolled), else 0.
  int uniform_kernel() const {
    for (const int k_all : {2, 3}) {
      bool all = true;
      for (int a = 3 - dims; a < 3; ++a) all = all && k[a] == k_all;
      if (all) return k_all;
    }
    return 0;
  }
};

// Validates the problem shape (not tensors) and returns its geometry.
// input_shape: 2d [C, H, W] / [N, C, H, W]; 3d [C, T, H, W] / [N, C, T, H, W].
inline FmpGeometry fmp_geometry(const char* op, int dims, c10::IntArrayRef input_shape,
                                c10::IntArrayRef kernel_size, c10::IntArrayRef output_size) {
  const int64_t nd = static_cast<int64_t>(input_shape.size());
  BARACUDA_CHECK_VALUE(nd == dims + 1 || nd == dims + 2, op, ": expected a ", dims + 1, "-D or ", dims + 2,
                    "-D input, got shape ", shape_str(input_shape));
  BARACUDA_CHECK_VALUE(static_cast<int>(kernel_size.size()) == dims, op, ": kernel_size must have ", dims,
                    " entries, got ", shape_str(kernel_size));
  BARACUDA_CHECK_VALUE(static_cast<int>(output_size.size()) == dims, op, ": output_size must have ", dims,
                    " entries, got ", shape_str(output_size));
  for (int64_t d = nd - dims - 1; d < nd; ++d) {
    BARACUDA_CHECK_VALUE(input_shape[d] > 0, op, ": expected non-zero channel and spatial sizes, got input shape ",
                      shape_str(input_shape));
  }
  FmpGeometry g;
  g.dims = dims;
  g.batch = nd == dims + 2 ? input_shape[0] : 1;
  BARACUDA_CHECK_VALUE(g.batch >= 0, op, ": batch size must be >= 0, got ", g.batch);
  g.channels = input_shape[nd - dims - 1];
  checked_numel(op, "input_shape", input_shape);
  const int first = 3 - dims;  // 2d fills H, W
  static const char* axis_names[3] = {"time", "height", "width"};
  for (int a = 0; a < dims; ++a) {
    const int ax = first + a;
    g.in[ax] = input_shape[nd - dims + a];
    g.k[ax] = kernel_size[a];
    g.out[ax] = output_size[a];
    BARACUDA_CHECK_VALUE(g.k[ax] > 0, op, ": kernel_size must be > 0, got ", shape_str(kernel_size));
    BARACUDA_CHECK_VALUE(g.out[ax] >= 0, op, ": output_size must be >= 0, got ", shape_str(output_size));
    // out + k - 1 <= in, written so that no term overflows (k > 0, in > 0).
    BARACUDA_CHECK_VALUE(g.k[ax] <= g.in[ax] && g.out[ax] <= g.in[ax] - g.k[ax] + 1, op, ": output_size ", g.out[ax], " + kernel_size ",
                      g.k[ax], " - 1 > input ", axis_names[ax], " ", g.in[ax],
                      " (need output_size + kernel_size - 1 <= input size)");
  }
  if (dims == 3) {
    g.sample_slot[0] = 0;
    g.sample_slot[1] = 1;
    g.sample_slot[2] = 2;
  }
  return g;
}

// Output / indices shape: the input's leading (batch, channel) dims + output_size.
inline std::vector<int64_t> fmp_output_shape(int dims, c10::IntArrayRef input_shape, c10::IntArrayRef output_size) {
  std::vector<int64_t> shape(input_shape.begin(), input_shape.end() - dims);
  shape.insert(shape.end(), output_size.begin(), output_size.end());
  return shape;
}

// Forward argument checks; returns the geometry.
inline FmpGeometry check_fmp_forward(int dims, const at::Tensor& self, c10::IntArrayRef kernel_size,
                                     c10::IntArrayRef output_size, const at::Tensor& samples) {
  const char* op = fmp_op_name(dims, false);
  check_floating(op, "self", self);
  const auto g = fmp_geometry(op, dims, self.sizes(), kernel_size, output_size);
  check_same_device(op, "self", self, "random_samples", samples);
  BARACUDA_CHECK_TYPE(samples.scalar_type() == self.scalar_type(), op, ": random_samples dtype ",
                   samples.scalar_type(), " != self dtype ", self.scalar_type());
  BARACUDA_CHECK_VALUE(samples.dim() == 3 && samples.size(0) >= g.batch && samples.size(1) == g.channels &&
                        samples.size(2) == dims,
                    op, ": random_samples shape ", shape_str(samples.sizes()), " != expected [N >= ", g.batch, ", ",
                    g.channels, ", ", dims, "]");
  return g;
}

inline void check_fmp_forward_outs(int dims, const at::Tensor& self, c10::IntArrayRef output_size,
                                   const at::Tensor& output, const at::Tensor& indices) {
  const char* op = fmp_op_name(dims, false);
  const auto shape = fmp_output_shape(dims, self.sizes(), output_size);
  check_out(op, "output", output, shape, self.scalar_type(), self.device());
  check_out(op, "indices", indices, shape, at::kLong, self.device());
  BARACUDA_CHECK_VALUE(output.is_contiguous() && indices.is_contiguous(), op,
                    ": output and indices must be contiguous");
}

// Backward argument checks; returns the geometry.
inline FmpGeometry check_fmp_backward(int dims, const at::Tensor& grad_output, const at::Tensor& self,
                                      c10::IntArrayRef kernel_size, c10::IntArrayRef output_size,
                                      const at::Tensor& indices) {
  const char* op = fmp_op_name(dims, true);
  check_floating(op, "self", self);
  const auto g = fmp_geometry(op, dims, self.sizes(), kernel_size, output_size);
  check_same_device(op, "self", self, "grad_output", grad_output);
  check_same_device(op, "self", self, "indices", indices);
  check_same_dtype(op, "self", self, "grad_output", grad_output);
  BARACUDA_CHECK_TYPE(indices.scalar_type() == at::kLong, op, ": indices dtype ", indices.scalar_type(),
                   " != expected Long");
  const auto shape = fmp_output_shape(dims, self.sizes(), output_size);
  check_shape(op, "grad_output", grad_output, shape);
  check_shape(op, "indices", indices, shape);
  return g;
}

inline void check_fmp_grad_input(int dims, const at::Tensor& self, const at::Tensor& grad_input) {
  const char* op = fmp_op_name(dims, true);
  check_out(op, "grad_input", grad_input, self.sizes(), self.scalar_type(), self.device());
  BARACUDA_CHECK_VALUE(grad_input.is_contiguous(), op, ": grad_input must be contiguous");
}

// problem = [dims, input ndim, *input_shape, *kernel_size, *output_size];
// errors name the op of those dims (fractional_max_pool2d / 3d, or its backward).
inline FmpGeometry fmp_geometry_of_problem(bool backward, c10::IntArrayRef problem) {
  BARACUDA_CHECK_VALUE(problem.size() >= 2 && (problem[0] == 2 || problem[0] == 3),
                       backward ? "baracuda::fractional_max_pool_backward" : "baracuda::fractional_max_pool",
                       ": malformed problem ", shape_str(problem), " (expected dims 2 or 3 first)");
  const int dims = static_cast<int>(problem[0]);
  const char* op = fmp_op_name(dims, backward);
  BARACUDA_CHECK_VALUE(problem[1] >= 0 && problem[1] <= 8 &&
                           static_cast<int64_t>(problem.size()) == 2 + problem[1] + 2 * problem[0],
                       op, ": malformed problem ", shape_str(problem));
  const auto input_shape = problem.slice(2, problem[1]);
  const auto kernel_size = problem.slice(2 + problem[1], dims);
  const auto output_size = problem.slice(2 + problem[1] + dims, dims);
  return fmp_geometry(op, dims, input_shape, kernel_size, output_size);
}

}  // namespace baracuda
