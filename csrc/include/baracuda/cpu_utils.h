// Small helpers shared by the CPU kernels: sums the compiler can vectorize, in a
// fixed order (deterministic whatever the thread count), and rows converted to
// the accumulation type once.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
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

}  // namespace cpu
}  // namespace baracuda
