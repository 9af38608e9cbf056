// Typed argument checks shared by every op. Every message starts with the op
// name ("baracuda::repeat: ...") and says what was expected and what was given.
// TORCH_CHECK_VALUE -> ValueError, TORCH_CHECK_TYPE -> TypeError,
// TORCH_CHECK_INDEX -> IndexError, TORCH_CHECK_NOT_IMPLEMENTED -> NotImplementedError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

namespace baracuda {

// "[8, 64]": shapes and int lists in error messages.
inline std::string shape_str(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

inline bool is_float_type(c10::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble;
}

// float16, bfloat16, float32 or float64.
inline void check_floating(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_float_type(t.scalar_type()), op, ": ", name,
                   " must be float16, bfloat16, float32 or float64, got ", t.scalar_type());
}

inline void check_same_dtype(const char* op, const char* name_a, const at::Tensor& a,
                             const char* name_b, const at::Tensor& b) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": ", name_b, " dtype ", b.scalar_type(),
                   " != ", name_a, " dtype ", a.scalar_type());
}

inline void check_same_device(const char* op, const char* name_a, const at::Tensor& a,
                              const char* name_b, const at::Tensor& b) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", name_b, " is on ", b.device(), " but ", name_a,
                    " is on ", a.device());
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t, c10::IntArrayRef expected) {
  TORCH_CHECK_VALUE(t.sizes() == expected, op, ": ", name, " shape ", shape_str(t.sizes()), " != expected ",
                    shape_str(expected));
}

// An out-variant's output: right shape, dtype and device, and no overlap with an input.
inline void check_out(const char* op, const char* name, const at::Tensor& out, c10::IntArrayRef shape,
                      c10::ScalarType dtype, c10::Device device) {
  TORCH_CHECK_VALUE(out.device() == device, op, ": ", name, " is on ", out.device(), ", expected ", device);
  TORCH_CHECK_TYPE(out.scalar_type() == dtype, op, ": ", name, " dtype ", out.scalar_type(), " != expected ",
                   dtype);
  check_shape(op, name, out, shape);
}

// A caller's scratch buffer for an out-variant: when `need` > 0 bytes are needed,
// it must be on `device`, contiguous, that large, and `align`-byte aligned.
inline void check_workspace(const char* op, const at::Tensor& workspace, int64_t need, size_t align,
                            c10::Device device) {
  if (need <= 0) return;
  TORCH_CHECK_VALUE(workspace.device() == device, op, ": workspace is on ", workspace.device(), ", expected ",
                    device);
  TORCH_CHECK_VALUE(workspace.is_contiguous() && workspace.nbytes() >= static_cast<size_t>(need) &&
                        reinterpret_cast<uintptr_t>(workspace.const_data_ptr()) % align == 0,
                    op, ": workspace has ", workspace.nbytes(), " bytes, needs ", need, " contiguous ", align,
                    "-byte-aligned bytes");
}

inline int64_t checked_nonneg(const char* op, const char* name, int64_t v) {
  TORCH_CHECK_VALUE(v >= 0, op, ": ", name, " must be >= 0, got ", v);
  return v;
}

}  // namespace baracuda
