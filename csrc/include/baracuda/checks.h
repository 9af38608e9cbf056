// Typed argument checks shared by every op. Every message starts with the op
// name ("baracuda::repeat: ...") and says what was expected and what was given.
// BARACUDA_CHECK_VALUE / _INDEX / _TYPE / _NOT_IMPLEMENTED raise the classes
// baracuda/errors.h lists (each also a RuntimeError, as PyTorch raises).
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "baracuda/errors.h"

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
  BARACUDA_CHECK_TYPE(is_float_type(t.scalar_type()), op, ": ", name,
                   " must be float16, bfloat16, float32 or float64, got ", t.scalar_type());
}

inline void check_same_dtype(const char* op, const char* name_a, const at::Tensor& a,
                             const char* name_b, const at::Tensor& b) {
  BARACUDA_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": ", name_b, " dtype ", b.scalar_type(),
                   " != ", name_a, " dtype ", a.scalar_type());
}

inline void check_same_device(const char* op, const char* name_a, const at::Tensor& a,
                              const char* name_b, const at::Tensor& b) {
  BARACUDA_CHECK_VALUE(a.device() == b.device(), op, ": ", name_b, " is on ", b.device(), " but ", name_a,
                    " is on ", a.device());
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t, c10::IntArrayRef expected) {
  BARACUDA_CHECK_VALUE(t.sizes() == expected, op, ": ", name, " shape ", shape_str(t.sizes()), " != expected ",
                    shape_str(expected));
}

// An out-variant's output: right shape, dtype and device (its memory: check_no_overlap).
inline void check_out(const char* op, const char* name, const at::Tensor& out, c10::IntArrayRef shape,
                      c10::ScalarType dtype, c10::Device device) {
  BARACUDA_CHECK_VALUE(out.device() == device, op, ": ", name, " is on ", out.device(), ", expected ", device);
  BARACUDA_CHECK_TYPE(out.scalar_type() == dtype, op, ": ", name, " dtype ", out.scalar_type(), " != expected ",
                   dtype);
  check_shape(op, name, out, shape);
}

inline int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  BARACUDA_CHECK_VALUE(!c10::mul_overflows(a, b, &r), op, ": ", what, " overflows int64 (", a, " * ", b, ")");
  return r;
}

inline int64_t checked_add(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  BARACUDA_CHECK_VALUE(!c10::add_overflows(a, b, &r), op, ": ", what, " overflows int64 (", a, " + ", b, ")");
  return r;
}

// prod(shape) for a shape given by the caller (not read from a tensor): every
// extent >= 0 and the product representable.
inline int64_t checked_numel(const char* op, const char* name, c10::IntArrayRef shape) {
  int64_t n = 1;
  for (const int64_t s : shape) {
    BARACUDA_CHECK_VALUE(s >= 0, op, ": ", name, " must be >= 0, got ", shape_str(shape));
    BARACUDA_CHECK_VALUE(!c10::mul_overflows(n, s, &n), op, ": the number of elements of ", name, " ",
                         shape_str(shape), " overflows int64");
  }
  return n;
}

// A tensor named in error messages.
struct NamedTensor {
  const char* name;
  const at::Tensor& t;
};

// Whether a and b share at least one byte: the exact answer from ATen for
// dense tensors, else (strided views of one storage) whether their byte
// extents intersect, which may reject two interleaved views that share none.
inline at::MemOverlapStatus overlap_of(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return at::MemOverlapStatus::No;
  const auto status = at::get_overlap_status(a, b);
  if (status != at::MemOverlapStatus::TooHard) return status;
  if (!a.storage().is_alias_of(b.storage())) return at::MemOverlapStatus::No;
  auto extent = [](const at::Tensor& t, const char*& lo) {
    int64_t first = 0, last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t span = (t.size(d) - 1) * t.stride(d);
      (span < 0 ? first : last) += span;
    }
    lo = static_cast<const char*>(t.const_data_ptr()) + first * static_cast<int64_t>(t.element_size());
    return (last - first + 1) * static_cast<int64_t>(t.element_size());
  };
  const char *a_lo = nullptr, *b_lo = nullptr;
  const int64_t a_bytes = extent(a, a_lo), b_bytes = extent(b, b_lo);
  return a_lo < b_lo + b_bytes && b_lo < a_lo + a_bytes ? at::MemOverlapStatus::Partial : at::MemOverlapStatus::No;
}

// For check_no_overlap: t, or an undefined tensor (skipped) when the call
// does not use it.
inline const at::Tensor& if_used(bool used, const at::Tensor& t) {
  static const at::Tensor none;
  return used ? t : none;
}

inline const at::Tensor& if_present(const c10::optional<at::Tensor>& t) {
  static const at::Tensor none;
  return t.has_value() ? *t : none;
}

// An out-variant's written tensors (outputs, workspace) share no memory with
// each other or with what it reads, and no output writes one location twice,
// as PyTorch's out= ops require (at::assert_no_internal_overlap,
// at::assert_no_overlap): the kernels read inputs after writing outputs, so
// any shared byte would change the result. `same_ok` (nullptr: none) names the
// one input the op may be given as its first written tensor exactly (the same
// elements in the same layout): elementwise ops whose kernel reads each
// element before writing it.
inline void check_no_overlap(const char* op, std::initializer_list<NamedTensor> written,
                             std::initializer_list<NamedTensor> read, const char* same_ok = nullptr) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    if (!w->t.defined()) continue;
    BARACUDA_CHECK_VALUE(at::has_internal_overlap(w->t) != at::MemOverlap::Yes, op, ": ", w->name,
                         " has internal overlap (more than one element refers to a single memory location)");
    for (auto o = w + 1; o != written.end(); ++o) {
      if (!o->t.defined()) continue;
      BARACUDA_CHECK_VALUE(overlap_of(w->t, o->t) == at::MemOverlapStatus::No, op, ": ", w->name, " and ", o->name,
                           " overlap (some of their elements refer to a single memory location)");
    }
    for (const auto& r : read) {
      if (!r.t.defined()) continue;
      const auto status = overlap_of(w->t, r.t);
      const bool exact_ok = same_ok != nullptr && w == written.begin() && std::string(r.name) == same_ok &&
                            status == at::MemOverlapStatus::Full && w->t.strides() == r.t.strides();
      BARACUDA_CHECK_VALUE(status == at::MemOverlapStatus::No || exact_ok, op, ": ", w->name,
                           " overlaps the input ", r.name, " (some elements of the input tensor and the written-to "
                           "tensor refer to a single memory location)",
                           same_ok != nullptr ? c10::str("; only ", same_ok, " itself may be passed as ", w->name)
                                              : std::string());
    }
  }
}

// A caller's scratch buffer for an out-variant: when `need` > 0 bytes are needed,
// it must be on `device`, contiguous, that large, `align`-byte aligned, and
// share no memory with `others` (the op's inputs and outputs).
inline void check_workspace(const char* op, const at::Tensor& workspace, int64_t need, size_t align,
                            c10::Device device, std::initializer_list<NamedTensor> others = {}) {
  if (need <= 0) return;
  BARACUDA_CHECK_VALUE(workspace.device() == device, op, ": workspace is on ", workspace.device(), ", expected ",
                    device);
  BARACUDA_CHECK_VALUE(workspace.is_contiguous() && workspace.nbytes() >= static_cast<size_t>(need) &&
                        reinterpret_cast<uintptr_t>(workspace.const_data_ptr()) % align == 0,
                    op, ": workspace has ", workspace.nbytes(), " bytes, needs ", need, " contiguous ", align,
                    "-byte-aligned bytes");
  check_no_overlap(op, {{"workspace", workspace}}, others);
}

inline int64_t checked_nonneg(const char* op, const char* name, int64_t v) {
  BARACUDA_CHECK_VALUE(v >= 0, op, ": ", name, " must be >= 0, got ", v);
  return v;
}

}  // namespace baracuda
