// Kernel choice as data. Each CUDA family's launch policy is a pure function of
// the problem and of a DeviceFacts value (no CUDA call inside), declared in
// baracuda/<family>_policy.h and returning that family's typed LaunchConfig
// (an enum kernel kind and its parameters). The launcher calls it with the
// current device's facts (cuda::device_facts() in cuda_utils.cuh); the Plan API
// and the CPU tests call it through `baracuda::_launch_config`, with the facts
// of the current device or with the recorded facts of an H100 or an H200, so CI
// (no GPU) runs every branch of every policy.
//
// This header is plain C++: it is compiled into CPU-only builds too.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace baracuda {

// What a launch policy may depend on besides the problem.
struct DeviceFacts {
  int cc_major = 0;                  // compute capability
  int cc_minor = 0;
  int num_sms = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block_optin = 0;  // dynamic shared memory one CTA may opt in to
  int64_t smem_per_sm = 0;
  int max_threads_per_sm = 0;
  int64_t regs_per_sm = 0;
  double dram_bytes_per_s = 0;       // read + write copy bandwidth class (0: unknown)

  bool clusters() const { return cc_major >= 9; }  // thread-block clusters and bulk copies (sm_90)
  // CTAs a cluster may hold: sm_90 launches 16 where a kernel opts in past the portable 8
  // (cuda::allow_cluster).
  int max_cluster() const { return clusters() ? 16 : 1; }
};

// Recorded facts (cudaDeviceGetAttribute on each card; bandwidth: a measured
// device-to-device copy, read + write).
inline constexpr DeviceFacts kH100Facts{9, 0, 132, 52428800, 232448, 233472, 2048, 65536, 2.97e12};
inline constexpr DeviceFacts kH200Facts{9, 0, 132, 52428800, 232448, 233472, 2048, 65536, 4.19e12};

// A LaunchConfig as tests and the Plan API read it: the kernel kind's name (the
// enum's) and the config's integer parameters by name, plus the workspace bytes.
struct LaunchConfigView {
  std::string kind;
  std::vector<std::pair<std::string, int64_t>> params;
  int64_t workspace_bytes = 0;
};

// problem: the op's integer problem description (the same one `_kernel_choice` takes).
using LaunchPolicyFn = LaunchConfigView (*)(c10::IntArrayRef problem, c10::ScalarType dtype, const DeviceFacts& facts);

inline std::map<std::string, LaunchPolicyFn>& launch_policies() {
  static std::map<std::string, LaunchPolicyFn> policies;
  return policies;
}

// Plan variant string derived from the config: kind<name=value,...>.
inline std::string describe(const LaunchConfigView& v) {
  std::string s = v.kind + "<";
  for (size_t i = 0; i < v.params.size(); ++i) {
    s += (i ? "," : "") + v.params[i].first + "=" + std::to_string(v.params[i].second);
  }
  return s + ">";
}

}  // namespace baracuda
