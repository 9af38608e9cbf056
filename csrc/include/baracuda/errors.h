// Typed errors that Python code written around PyTorch can catch as it catches
// PyTorch's. PyTorch raises RuntimeError for most misuse (a bad offset, an
// out-of-range index, a shape mismatch); our errors are also the more precise
// Python type, so each kind raises a class that is both:
//   kValue          -> baracuda_ops.BaracudaValueError(ValueError, RuntimeError)
//   kIndex          -> baracuda_ops.BaracudaIndexError(IndexError, RuntimeError)
//   kType           -> baracuda_ops.BaracudaTypeError(TypeError, RuntimeError)
//   kNotImplemented -> baracuda_ops.BaracudaNotImplementedError(NotImplementedError)
// throw_error (csrc/registration.cpp) throws a torch::PyTorchError whose
// python_type() is that class (handed to the extension once at import), which
// torch's exception translation raises wherever a C++ error reaches Python: a
// direct op call, the autograd engine, a compiled graph. Declared here without
// Python headers so that the CUDA glue (nvcc) uses the same checks.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/StringUtil.h>

#include <string>

namespace baracuda {

enum class ErrorKind { kValue = 0, kIndex = 1, kType = 2, kNotImplemented = 3 };

[[noreturn]] void throw_error(ErrorKind kind, const std::string& msg);

}  // namespace baracuda

#define BARACUDA_CHECK_KIND(kind, cond, ...)                                   \
  do {                                                                         \
    if (C10_UNLIKELY(!(cond))) ::baracuda::throw_error(kind, ::c10::str(__VA_ARGS__)); \
  } while (0)

#define BARACUDA_CHECK_VALUE(cond, ...) BARACUDA_CHECK_KIND(::baracuda::ErrorKind::kValue, cond, __VA_ARGS__)
#define BARACUDA_CHECK_INDEX(cond, ...) BARACUDA_CHECK_KIND(::baracuda::ErrorKind::kIndex, cond, __VA_ARGS__)
#define BARACUDA_CHECK_TYPE(cond, ...) BARACUDA_CHECK_KIND(::baracuda::ErrorKind::kType, cond, __VA_ARGS__)
#define BARACUDA_CHECK_NOT_IMPLEMENTED(cond, ...) \
  BARACUDA_CHECK_KIND(::baracuda::ErrorKind::kNotImplemented, cond, __VA_ARGS__)
