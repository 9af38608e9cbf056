// Small helpers shared by the CPU kernels: sums the compiler can vectorize, in a
// fixed order (deterministic whatever the thread count), and rows converted to
// the accumulation type once.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace baracuda {
namespace cpu {

// Independent accumulators, so the compiler can vectorize a sum; combined in a
// fixed order at the end (combine_lanes).
constexpr int kLanes = 8;

template <typename acc_t>
using Lanes = std::array<acc_t, kLanes>;

template <typename acc_t>
acc_t combine_lanes(const Lanes<acc_t>& lanes) {
  acc_t s = 0;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

// sum_{j < n} term(j), term(j) added to lane j % kLanes, the lanes combined in
// order. IndexT is the loop index (int32_t where n allows: its conversions to
// floating point vectorize). Pass term capturing by value: a lambda that captures
// its pointers by reference kept this loop from vectorizing (2x slower).
template <typename acc_t, typename IndexT, typename Term>
acc_t lane_sum(IndexT n, Term term) {
  Lanes<acc_t> lanes{};
  const IndexT whole = n - n % kLanes;
  for (IndexT j = 0; j < whole; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
  }
  for (IndexT j = whole; j < n; ++j) lanes[0] += term(j);
  return combine_lanes(lanes);
}

// A row of T as acc_t: the row itself when T is acc_t, else converted into buf
// once, so the passes over it run on acc_t (vectorized) instead of converting
// every element again.
template <typename acc_t, typename T>
const acc_t* row_as_acc(const T* row, int64_t n, std::vector<acc_t>& buf) {
  if constexpr (std::is_same_v<T, acc_t>) {
    return row;
  } else {
    buf.resize(n);
    for (int64_t j = 0; j < n; ++j) buf[j] = static_cast<acc_t>(row[j]);
    return buf.data();
  }
}

// ---------------------------------------------------------------------------
// Explicit vectors (GCC/Clang vector extension): Vec<T, N> holds N values of T,
// and the compiler maps it onto the registers of the ISA it compiles for (a
// 16-float vector is 4 SSE, 2 AVX2 or 1 AVX-512 register), whether or not its
// loop vectorizer would have taken the loop.
template <typename T, int N>
struct VecOf {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <typename T, int N>
using Vec = typename VecOf<T, N>::type;

// N consecutive values of T from p (any alignment) as acc_t: bfloat16 widened
// by a shift (exact), other types converted lane by lane.
// out = {a0, b0, a1, b1, ...} (2N lanes). Vectors pass by reference here and
// in load_vec: by value, their ABI would differ between the ISAs (-Wpsabi).
template <typename T, int N, size_t... k>
[[gnu::always_inline]] inline void interleave(const Vec<T, N>& a, const Vec<T, N>& b, Vec<T, 2 * N>& out,
                                              std::index_sequence<k...>) {
  out = __builtin_shufflevector(a, b, (k % 2 == 0 ? k / 2 : N + k / 2)...);
}

// v = N consecutive values of T from p (any alignment) as acc_t: bfloat16
// widened by putting its 16 bits above 16 zero bits (exact), other types
// converted lane by lane.
template <typename acc_t, int N, typename T>
[[gnu::always_inline]] inline void load_vec(const T* p, Vec<acc_t, N>& v) {
  if constexpr (std::is_same_v<T, acc_t>) {
    std::memcpy(&v, p, sizeof(v));
  } else if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<acc_t, float>) {
    Vec<uint16_t, N> bits;
    std::memcpy(&bits, p, sizeof(bits));
    Vec<uint16_t, 2 * N> wide;
    interleave<uint16_t, N>(Vec<uint16_t, N>{}, bits, wide, std::make_index_sequence<2 * N>{});
    std::memcpy(&v, &wide, sizeof(v));
  } else {
    for (int k = 0; k < N; ++k) v[k] = static_cast<acc_t>(p[k]);
  }
}

// p[0 .. N) = T(v[k]): bfloat16 rounded to nearest even on the bits (NaN to
// the quiet NaN 0x7FC0), as c10::BFloat16's conversion does, so the bits equal
// the scalar conversion's; other types converted lane by lane.
template <typename acc_t, int N, typename T>
[[gnu::always_inline]] inline void store_vec(const Vec<acc_t, N>& v, T* p) {
  if constexpr (std::is_same_v<T, acc_t>) {
    std::memcpy(p, &v, sizeof(v));
  } else if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<acc_t, float>) {
    Vec<uint32_t, N> bits;
    std::memcpy(&bits, &v, sizeof(bits));
    const Vec<uint32_t, N> rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const Vec<uint32_t, N> nan = (Vec<uint32_t, N>)(v != v);  // all ones where v is NaN
    const Vec<uint16_t, N> out = __builtin_convertvector((rounded & ~nan) | (0x7FC0u & nan), Vec<uint16_t, N>);
    std::memcpy(p, &out, sizeof(out));
  } else {
    for (int k = 0; k < N; ++k) p[k] = static_cast<T>(v[k]);
  }
}

// y[i] = T(a[i]) for i < n, in vectors of kBytes of acc_t, the tail in vectors
// of half that width down to 16 bytes, then one by one.
template <int kBytes, typename T, typename acc_t>
[[gnu::always_inline]] inline void store_from_acc(T* y, const acc_t* a, int64_t n) {
  constexpr int kPer = kBytes / int(sizeof(acc_t));
  int64_t i = 0;
  for (; i + kPer <= n; i += kPer) {
    Vec<acc_t, kPer> v;
    std::memcpy(&v, a + i, sizeof(v));
    store_vec<acc_t, kPer>(v, y + i);
  }
  if constexpr (kBytes > 16) {
    store_from_acc<kBytes / 2>(y + i, a + i, n - i);
  } else {
    for (; i < n; ++i) y[i] = static_cast<T>(a[i]);
  }
}

// ---------------------------------------------------------------------------
// Vector ISA at run time. The extension is compiled for baseline x86-64 (SSE2),
// so that it runs on any x86-64 CPU; run_vectorized(fn) runs fn compiled again
// for the widest vector ISA this CPU has (AVX-512 or AVX2; the flatten attribute
// inlines fn's whole body into the ISA's copy, where the compiler vectorizes it
// for that ISA). The extension is built with -ffp-contract=off, so no ISA fuses a
// multiply and an add: every ISA gives the same bits. BARACUDA_CPU_CAPABILITY
// (default, avx2, avx512; read once) caps the ISA, as ATEN_CPU_CAPABILITY does
// PyTorch's.
enum class VectorIsa { kBaseline, kAvx2, kAvx512 };

inline const char* vector_isa_name(VectorIsa isa) {
  return isa == VectorIsa::kAvx512 ? "avx512" : isa == VectorIsa::kAvx2 ? "avx2" : "default";
}

#if defined(__x86_64__) && defined(__GNUC__)
#define BARACUDA_CPU_MULTI_ISA 1
#endif

inline VectorIsa vector_isa() {
  static const VectorIsa isa = [] {
    VectorIsa best = VectorIsa::kBaseline;
#ifdef BARACUDA_CPU_MULTI_ISA
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) best = VectorIsa::kAvx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      best = VectorIsa::kAvx512;
    }
#endif
    const char* cap = std::getenv("BARACUDA_CPU_CAPABILITY");
    if (cap != nullptr && std::strcmp(cap, "default") == 0) return VectorIsa::kBaseline;
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0 && best == VectorIsa::kAvx512) return VectorIsa::kAvx2;
    return best;
  }();
  return isa;
}

// fn(std::integral_constant<int, kVectorBytes>{}): the ISA's vector register
// width in bytes (16, 32 or 64), for fn's explicit vectors.
template <typename Fn>
[[gnu::flatten]] void run_baseline(const Fn& fn) {
  fn(std::integral_constant<int, 16>{});
}

#ifdef BARACUDA_CPU_MULTI_ISA
template <typename Fn>
[[gnu::flatten, gnu::target("avx2")]] void run_avx2(const Fn& fn) {
  fn(std::integral_constant<int, 32>{});
}

template <typename Fn>
[[gnu::flatten, gnu::target("avx512f,avx512bw,avx512vl,avx512dq")]] void run_avx512(const Fn& fn) {
  fn(std::integral_constant<int, 64>{});
}
#endif

// kWidest caps the ISA for one loop, where a wider one measured slower (the
// compiler's own vectorization of rms_norm's rows: AVX-512 1.2-1.8x slower than
// AVX2 on the AMD EPYC build machine).
template <VectorIsa kWidest = VectorIsa::kAvx512, typename Fn>
void run_vectorized(const Fn& fn) {
#ifdef BARACUDA_CPU_MULTI_ISA
  const VectorIsa isa = std::min(vector_isa(), kWidest);
  if (isa == VectorIsa::kAvx512) return run_avx512(fn);
  if (isa == VectorIsa::kAvx2) return run_avx2(fn);
#endif
  run_baseline(fn);
}

}  // namespace cpu
}  // namespace baracuda
