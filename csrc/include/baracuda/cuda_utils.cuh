// Small CUDA helpers shared by every .cu file: 16-byte vectors and alignment,
// device facts, kernel launches (clusters, early launches), a side stream, warp/block
// reductions in a fixed order (deterministic).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAMacros.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include "baracuda/errors.h"
#include "baracuda/launch_policy.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace baracuda {
namespace cuda {

template <typename T>
C10_HOST_DEVICE constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// N elements of T moved as one aligned access (16 bytes when sizeof(T) * N == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// The bits of a Vec<T, N>, held as 32-bit words where the size allows, until
// from_raw: no conversion of the elements (bf16 halves unpacked) can be placed
// between a load and the next one, and a conditionally loaded Vec of 16-bit
// elements does not take one register per element.
template <typename T, int N>
using RawVec = std::conditional_t<sizeof(T) * N % 4 == 0, Vec<uint32_t, sizeof(T) * N / 4>, Vec<T, N>>;

template <typename T, int N>
__device__ __forceinline__ RawVec<T, N> load_raw(const T* p) {
  return *reinterpret_cast<const RawVec<T, N>*>(p);
}

// load_raw as a plain (weak, coherent) ld.global of 16 bytes, never the read-only
// path (ld.global.nc) the compiler picks for a const __restrict__ pointer.
// (rms_norm's decode backward: measured faster so, its forward not.)
template <typename T, int N>
__device__ __forceinline__ RawVec<T, N> load_raw_plain(const T* p) {
  static_assert(sizeof(T) * N == 16, "load_raw_plain: 16-byte vectors");
  uint4 w;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "l"(p));
  RawVec<T, N> raw;
  memcpy(&raw, &w, sizeof(raw));
  return raw;
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> from_raw(const RawVec<T, N>& raw) {
  Vec<T, N> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}

// Element i of a raw vector as AccT, taken from its 32-bit word: a 16-bit element
// is the word's low (even i) or high (odd i) half. Kept raw, a thread's 16-bit row
// slice takes half the registers it takes unpacked, one element per register.
template <typename AccT, typename T, int N>
__device__ __forceinline__ AccT raw_elem(const RawVec<T, N>& raw, int i) {
  if constexpr (sizeof(T) == 2 && sizeof(T) * N % 4 == 0) {
    const uint32_t w = raw.v[i / 2];
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      return static_cast<AccT>(__uint_as_float(i % 2 ? (w & 0xffff0000u) : (w << 16)));
    } else {
      return static_cast<AccT>(T(static_cast<uint16_t>(i % 2 ? w >> 16 : w & 0xffffu), typename T::from_bits_t()));
    }
  } else {
    return static_cast<AccT>(from_raw<T, N>(raw).v[i]);
  }
}

// The same with streaming cache hints (evict first: ld.global.cs / st.global.cs),
// for data that is read once or written once.
template <int Bytes>
struct WordOf;
template <>
struct WordOf<1> { using type = unsigned char; };
template <>
struct WordOf<2> { using type = unsigned short; };
template <>
struct WordOf<4> { using type = unsigned int; };
template <>
struct WordOf<8> { using type = uint2; };
template <>
struct WordOf<16> { using type = uint4; };

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_streaming(const T* p) {
  using W = typename WordOf<sizeof(T) * N>::type;
  const W w = __ldcs(reinterpret_cast<const W*>(p));
  Vec<T, N> v;
  memcpy(&v, &w, sizeof(v));
  return v;
}

template <typename T, int N>
__device__ __forceinline__ void store_vec_streaming(T* p, const Vec<T, N>& v) {
  using W = typename WordOf<sizeof(T) * N>::type;
  W w;
  memcpy(&w, &v, sizeof(w));
  __stcs(reinterpret_cast<W*>(p), w);
}

template <typename T, int N>
__device__ __forceinline__ RawVec<T, N> load_raw_streaming(const T* p) {
  const auto v = load_vec_streaming<T, N>(p);
  RawVec<T, N> raw;
  memcpy(&raw, &v, sizeof(raw));
  return raw;
}

template <typename T>
__device__ __forceinline__ void store_streaming(T* p, const T& v) {
  store_vec_streaming<T, 1>(p, Vec<T, 1>{{v}});
}

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline bool is_aligned_contiguous(const at::Tensor& t) {
  return t.is_contiguous() && is_aligned(t.const_data_ptr(), 16);
}

// Inputs that are not 16-byte aligned (views with an offset) are copied once, so
// a kernel choice can depend on the problem alone.
inline at::Tensor aligned_contiguous(const at::Tensor& t) {
  auto c = t.contiguous();
  return is_aligned(c.const_data_ptr(), 16) ? c : c.clone();
}

// Outputs written by 16-byte stores must be contiguous and aligned (fresh
// allocations always are; a caller's out-variant buffer may not be).
inline void check_out_aligned(const char* op, const char* name, const at::Tensor& out) {
  BARACUDA_CHECK_VALUE(out.numel() == 0 || is_aligned_contiguous(out), op, ": ", name,
                    " must be contiguous and 16-byte aligned on CUDA");
}

// An attribute of the current device (SM count, compute capability, shared
// memory limit), read once per device and attribute.
inline int device_attribute(cudaDeviceAttr attr) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> cache;
  const int dev = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find({dev, static_cast<int>(attr)});
  if (it == cache.end()) {
    int v = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    it = cache.emplace(std::make_pair(dev, static_cast<int>(attr)), v).first;
  }
  return it->second;
}

inline int num_sms() { return device_attribute(cudaDevAttrMultiProcessorCount); }
inline int64_t l2_bytes() { return device_attribute(cudaDevAttrL2CacheSize); }

// The current device's facts for the launch policies (baracuda/launch_policy.h),
// read once per device. The copy-bandwidth class is not an attribute: an sm_90
// part with more than 100 GB of memory is taken as an H200 (HBM3e), other sm_90
// parts as an H100.
inline const DeviceFacts& device_facts() {
  static std::mutex mutex;
  static std::array<std::optional<DeviceFacts>, C10_COMPILE_TIME_MAX_GPUS> cache;
  const int dev = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[dev];
  if (!slot) {
    DeviceFacts f;
    f.cc_major = device_attribute(cudaDevAttrComputeCapabilityMajor);
    f.cc_minor = device_attribute(cudaDevAttrComputeCapabilityMinor);
    f.num_sms = num_sms();
    f.l2_bytes = l2_bytes();
    f.smem_per_block_optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    f.smem_per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    f.max_threads_per_sm = device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor);
    f.regs_per_sm = device_attribute(cudaDevAttrMaxRegistersPerMultiprocessor);
    if (f.cc_major == 9 && f.cc_minor == 0) {
      size_t free_bytes = 0, total_bytes = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      f.dram_bytes_per_s = total_bytes > (size_t(100) << 30) ? kH200Facts.dram_bytes_per_s : kH100Facts.dram_bytes_per_s;
    }
    slot = f;
  }
  return *slot;
}

#ifndef BARACUDA_CUDA_ARCHS
#define BARACUDA_CUDA_ARCHS "(unknown)"
#endif

// A kernel of this file's fat binary, asked only for its attributes: the runtime
// answers cudaErrorNoKernelImageForDevice (or InvalidDeviceFunction) when the binary
// holds neither a cubin nor PTX that the current device can run, which is exactly
// the case of a GPU the build did not cover (TORCH_CUDA_ARCH_LIST). Each .cu file
// has its own copy, so each file checks its own image.
static __global__ void arch_probe_kernel() {}

// Raises NotImplementedError naming the current device's architecture and the
// built ones when this build cannot run kernels on it, before any launch. A device
// that passed is remembered (one relaxed atomic load a call after the first).
static void check_device_arch(const char* op) {
  static std::array<std::atomic<bool>, C10_COMPILE_TIME_MAX_GPUS> runs{};
  const int dev = c10::cuda::current_device();
  if (dev < static_cast<int>(runs.size()) && runs[dev].load(std::memory_order_relaxed)) return;
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, arch_probe_kernel);
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
    (void)cudaGetLastError();  // not sticky: clear it so later launch checks do not see it
    BARACUDA_CHECK_NOT_IMPLEMENTED(false, op, ": this build of baracuda_ops has no CUDA kernels for the device cuda:",
                                dev, " (compute capability ", device_attribute(cudaDevAttrComputeCapabilityMajor),
                                ".", device_attribute(cudaDevAttrComputeCapabilityMinor),
                                "); it was built for TORCH_CUDA_ARCH_LIST=\"", BARACUDA_CUDA_ARCHS,
                                "\". Rebuild with that architecture in TORCH_CUDA_ARCH_LIST");
  }
  C10_CUDA_CHECK(err);
  if (dev < static_cast<int>(runs.size())) runs[dev].store(true, std::memory_order_relaxed);
}

// Lets `kernel` take `smem` bytes of dynamic shared memory: past 48 KB it must
// opt in, and static shared memory counts against the same 48 KB, so from 32 KB.
template <typename... Args>
void allow_dynamic_smem(void (*kernel)(Args...), int64_t smem) {
  if (smem > 32 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
}

// Lets `kernel` launch in clusters of `cluster` CTAs: past the portable size (8) it must
// opt in (DeviceFacts::max_cluster).
constexpr int kPortableCluster = 8;
template <typename... Args>
void allow_cluster(void (*kernel)(Args...), int cluster) {
  if (cluster > kPortableCluster) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
}

// How a kernel is launched (cudaLaunchKernelEx): `grid` CTAs of `block` threads,
// `smem` dynamic shared-memory bytes per CTA, thread-block clusters of `cluster`
// CTAs along x (sm_90; 1 = no clusters), and `early`: a programmatic dependent
// launch (sm_90), whose CTAs may start while the previous kernel in the stream
// still runs (once that kernel's CTAs have all called start_next_grid or ended).
// A kernel launched early calls wait_for_previous_grid() before it touches memory.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  int cluster = 1;
  int64_t smem = 0;
  bool early = false;
};

// The cudaLaunchConfig_t of a LaunchShape. Not copyable: config.attrs points into it.
struct LaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[3] = {};

  LaunchConfig(const LaunchShape& shape, cudaStream_t stream) {
    config.gridDim = shape.grid;
    config.blockDim = shape.block;
    config.dynamicSmemBytes = static_cast<size_t>(shape.smem);
    config.stream = stream;
    config.attrs = attrs;
    if (shape.cluster > 1) {
      auto& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = shape.cluster;
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
      // Clusters placed load-balanced rather than spread (the default): on a 132-SM H200
      // the runtime then fits 66 clusters of four CTAs at two an SM where spread placement
      // fits 62 (cudaOccupancyMaxActiveClusters; clusters of two fit 132 and of eight 30
      // either way). The occupancy query below asks with the same attributes.
      auto& p = attrs[config.numAttrs++];
      p.id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      p.val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicyLoadBalancing;
    }
    if (shape.early) {
      auto& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// How many CTAs (cluster == 1) or thread-block clusters of `kernel`, launched with
// `block` threads and `smem` dynamic shared-memory bytes per CTA, the current
// device runs at once: the largest grid that is a single wave. It counts
// registers, shared memory, and (for clusters) how CTAs of a cluster must share a
// GPC, so it can be well below num_sms() * per-SM estimates. At least 1; cached
// per device and launch shape.
template <typename... Args>
int64_t resident_groups(void (*kernel)(Args...), int block, int cluster, int64_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int, int64_t>, int64_t> cache;
  const int dev = c10::cuda::current_device();
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), block, cluster, smem);
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    allow_dynamic_smem(kernel, smem);
    allow_cluster(kernel, cluster);
    int n = 0;
    if (cluster == 1) {
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block, static_cast<size_t>(smem)));
      n *= num_sms();
    } else {
      const LaunchConfig one_cluster({.grid = dim3(cluster), .block = dim3(block), .cluster = cluster, .smem = smem},
                                     nullptr);
      C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &one_cluster.config));
    }
    it = cache.emplace(key, std::max(n, 1)).first;
  }
  return it->second;
}

// Launches kernel(args...) on the current stream as `shape` says. An early launch
// is asked for only on sm_90 and later devices (the attribute needs them).
template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), LaunchShape shape, Args... args) {
  allow_dynamic_smem(kernel, shape.smem);
  allow_cluster(kernel, shape.cluster);
  shape.early = shape.early && device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  const LaunchConfig launch(shape, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, args...));
}

// A second stream of the current device that starts after the work queued so
// far on `main` (an event), so that kernels queued on it run beside main's next
// ones; join() makes `main` wait for it (an event again), and the destructor
// joins if an exception left before join(), so nothing it writes can outlive the
// op unordered. Events order both ways, so it also works under CUDA graph capture.
class SideStream {
 public:
  explicit SideStream(cudaStream_t main) : main_(main), side_(c10::cuda::getStreamFromPool()) {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(forked_, main_));
    C10_CUDA_CHECK(cudaStreamWaitEvent(side_.stream(), forked_, 0));
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() {
    if (!joined_) {
      C10_CUDA_CHECK_WARN(cudaEventRecord(done_, side_.stream()));
      C10_CUDA_CHECK_WARN(cudaStreamWaitEvent(main_, done_, 0));
    }
    C10_CUDA_CHECK_WARN(cudaEventDestroy(forked_));
    C10_CUDA_CHECK_WARN(cudaEventDestroy(done_));
  }

  cudaStream_t stream() const { return side_.stream(); }

  void join() {
    C10_CUDA_CHECK(cudaEventRecord(done_, side_.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(main_, done_, 0));
    joined_ = true;
  }

 private:
  cudaStream_t main_;
  c10::cuda::CUDAStream side_;
  cudaEvent_t forked_ = nullptr, done_ = nullptr;
  bool joined_ = false;
};

// Programmatic dependent launch, device side (no-ops before sm_90).
// wait_for_previous_grid: in a kernel launched early, blocks until the previous
// kernel in the stream has ended and its writes are visible.
// start_next_grid: lets the next kernel in the stream, if launched early, start
// its CTAs now; they still wait for this grid to end before touching memory.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void start_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Bulk copies from global into shared memory by the copy engine of the SM (sm_90
// cp.async.bulk), completed on an mbarrier in the CTA's shared memory: the barrier
// is initialized for one arrival (mbarrier_init, then fence_barrier_init and a
// CTA barrier before any use); per phase one thread arrives announcing the bytes
// to come (mbarrier_expect_bytes) and issues the copies (bulk_copy_to_shared:
// 16-byte aligned addresses, a multiple of 16 bytes); the phase completes when all
// have landed, and mbarrier_wait(bar, parity) returns once the phase of that parity
// (0 for the barrier's first phase, then 1, 0, ...) has completed. Device code of
// sm_90 and newer only (elsewhere they trap).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
#else
  __trap();
#endif
}

// Makes the initialized barriers visible to the copy engine and to the cluster.
__device__ __forceinline__ void fence_barrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

// Orders this thread's earlier accesses of shared memory (after a CTA barrier: the
// CTA's) before the copy engine's next writes there (a buffer read, then refilled).
__device__ __forceinline__ void fence_shared_for_bulk_copy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
#else
  __trap();
#endif
}

// Fetches [src, src + bytes) into L2 (sm_90 cp.async.bulk.prefetch.L2; 16-byte
// aligned, a multiple of 16 bytes); nothing waits for it.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}

// The cluster barrier split (sm_90, every thread of the CTA): arrive without ordering
// memory (relaxed: what it publishes is ordered by a fence of its own, such as
// fence_barrier_init), and wait for every CTA of the cluster to have arrived.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// Stores v into CTA `rank`'s copy of the shared variable `local` (this CTA's address of
// it) of the cluster, asynchronously, completing as sizeof(T) bytes on that CTA's copy of
// the mbarrier `bar` (sm_90 st.async; 4- or 8-byte T). Nothing waits for it here: the
// receiving CTA's wait on its barrier does.
template <typename T>
__device__ __forceinline__ void store_remote_async(const T& v, const T* local, uint64_t* bar, uint32_t rank) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "st.async of 4 or 8 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t to, to_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(shared_address(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to_bar) : "r"(shared_address(bar)), "r"(rank));
  if constexpr (sizeof(T) == 4) {
    uint32_t word;
    memcpy(&word, &v, 4);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(to), "r"(word),
                 "r"(to_bar)
                 : "memory");
  } else {
    unsigned long long word;
    memcpy(&word, &v, 8);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(to), "l"(word),
                 "r"(to_bar)
                 : "memory");
  }
#else
  __trap();
#endif
}

// A ring of `stages` shared-memory stages filled by bulk copies: stage i % stages holds
// item i (a row) from its fetch until the CTA is done with it, when item i + stages
// takes it. `full` is kMaxStages mbarriers in the CTA's shared memory; fetch(i) (thread
// 0) announces item i's bytes on bar(i) and issues its copies.
template <int kMaxStages>
struct BulkStageRing {
  uint64_t* full;
  int stages;

  __device__ uint64_t* bar(int64_t i) const { return &full[i % stages]; }

  // Initializes the barriers and fetches items 0 .. stages - 1 (of `items`); every
  // thread calls it (its CTA barrier publishes the initialized barriers).
  template <typename Fetch>
  __device__ void start(int64_t items, Fetch&& fetch) const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) mbarrier_init(&full[s], 1);
      fence_barrier_init();
      for (int64_t i = 0; i < stages && i < items; ++i) fetch(i);
    }
    __syncthreads();
  }

  // Returns once item i has landed in its stage.
  __device__ void wait(int64_t i) const { mbarrier_wait(bar(i), static_cast<uint32_t>((i / stages) & 1)); }

  // Thread 0, after a CTA barrier past every thread's last read of item i - stages:
  // orders those reads before the copy engine's writes, then fetches item i.
  template <typename Fetch>
  __device__ void refill(int64_t i, Fetch&& fetch) const {
    fence_shared_for_bulk_copy();
    fetch(i);
  }
};

// v[0] + ... + v[K-1] as a balanced tree of pairs, ((v0 + v1) + (v2 + v3)) + ...:
// a fixed order with log2(K) dependent adds instead of K, for a thread's sum of
// terms that are all at hand (rms_norm's decode kernels: the last load's arrival
// to the block sum is their critical path). A recursion, not a loop over widths:
// written as that loop, ptxas kept the terms in a stack frame.
template <int K, typename T>
__device__ __forceinline__ T tree_sum(const T* v) {
  static_assert(K > 0 && (K & (K - 1)) == 0, "tree_sum: a power of two of terms");
  if constexpr (K == 1) {
    return v[0];
  } else {
    return tree_sum<K / 2>(v) + tree_sum<K / 2>(v + K / 2);
  }
}

// Sum across a warp with a fixed butterfly order: every lane gets the same,
// run-to-run identical result.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Shared memory for block_sum: a sum per warp, 16-byte aligned for its reads.
template <typename T>
struct alignas(16) BlockSumScratch {
  T warp[32];
};

// Sum across the block in a fixed order; every thread receives the total. Each
// warp's sum (warp_sum) goes to scratch, zeros after the last warp's; then lane l
// of every warp reads 16 bytes of warp sums (read l % 8 of four floats, or l % 16
// of two doubles), adds them pairwise (tree_sum), and a butterfly
// adds the reads: three dependent shuffles for float where a second warp_sum takes
// five. For a block that sums once: scratch must not be
// written again (no barrier after the read).
template <typename T>
__device__ __forceinline__ T block_sum_once(T v, BlockSumScratch<T>& scratch) {
  constexpr int kPerRead = 16 / sizeof(T);
  constexpr int kReads = 32 / kPerRead;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  if (lane == 0) scratch.warp[warp] = v;
  if (warp == 0 && lane >= num_warps) scratch.warp[lane] = T(0);
  __syncthreads();
  const Vec<T, kPerRead> s = load_vec<T, kPerRead>(scratch.warp + (lane % kReads) * kPerRead);
  T total = tree_sum<kPerRead>(s.v);
#pragma unroll
  for (int offset = kReads / 2; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
}

// As block_sum_once, then a barrier, so it may be called again with the same scratch.
template <typename T>
__device__ __forceinline__ T block_sum(T v, BlockSumScratch<T>& scratch) {
  const T total = block_sum_once(v, scratch);
  __syncthreads();
  return total;
}

}  // namespace cuda
}  // namespace baracuda
