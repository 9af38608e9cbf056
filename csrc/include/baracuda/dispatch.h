// dtype dispatch shared by CPU and CUDA kernels.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

// The four floating dtypes every op supports. Inside, `scalar_t` is the element
// type and `acc_t` the accumulation type (float for half types, double for double).
#define BARACUDA_DISPATCH_FLOATING(TYPE, NAME, ...)                                       \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, [&] {            \
    using acc_t [[maybe_unused]] = at::opmath_type<scalar_t>;                                              \
    __VA_ARGS__();                                                                        \
  })
