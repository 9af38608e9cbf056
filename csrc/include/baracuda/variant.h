// Kernel-choice registry. The Plan API's `sku().variant` and `workspace_size()`
// ask `baracuda::_kernel_choice(op, device, problem, dtype)`, which calls the same
// selection function that the op's launcher uses. Each backend file registers
// its selector with BARACUDA_REGISTER_VARIANT next to the kernels it selects.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

#include <functional>
#include <map>
#include <string>
#include <utility>

namespace baracuda {

// What a launcher decided for one problem: the kernel that runs and the
// scratch bytes it needs beyond its outputs.
struct KernelChoice {
  std::string variant;
  int64_t workspace_bytes = 0;
};

// problem: the op's integer problem description (documented by each op's Python Plan).
using VariantSelector = std::function<KernelChoice(c10::IntArrayRef problem, c10::ScalarType dtype)>;

inline std::map<std::pair<std::string, c10::DeviceType>, VariantSelector>& variant_selectors() {
  static std::map<std::pair<std::string, c10::DeviceType>, VariantSelector> selectors;
  return selectors;
}

struct VariantRegistrar {
  VariantRegistrar(const char* op, c10::DeviceType device, VariantSelector selector) {
    variant_selectors()[{op, device}] = std::move(selector);
  }
};

}  // namespace baracuda

#define BARACUDA_CONCAT_INNER(a, b) a##b
#define BARACUDA_CONCAT(a, b) BARACUDA_CONCAT_INNER(a, b)
#define BARACUDA_REGISTER_VARIANT(OP, DEVICE_TYPE, SELECTOR)                                      \
  static ::baracuda::VariantRegistrar BARACUDA_CONCAT(baracuda_variant_registrar_, __COUNTER__)( \
      OP, DEVICE_TYPE, SELECTOR)
