// embedding_bag family, CUDA kernels.
//
// Bad index values on CUDA never raise (that would need a host sync) and never
// touch memory out of bounds: a bag that holds an out-of-range index (other
// than padding_idx), or whose offsets break the rules (offsets[0] == 0,
// non-decreasing, <= N), is computed from its valid part only, then its whole
// output row is set to NaN and its bag_size to -1. The backward and the
// per_sample_weights backward skip out-of-range entries.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/embedding_bag.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kUnroll = 8;          // forward: bag entries whose loads are in flight together
constexpr int kSumUnroll = 4;       // backward: sorted positions whose loads are in flight together
constexpr int64_t kChunk = 64;      // backward: sorted positions per chunk
constexpr int64_t kGroup = 32;      // backward: chunks per group partial
constexpr int64_t kU32Limit = 0xffffffff;  // backward: sort keys, positions and run ends are uint32
constexpr uint32_t kNoRun = 0xffffffffu;   // backward: run_start of a row with no run

// ---------------------------------------------------------------------------
// Choice of kernel: a pure function of the problem, used by the launchers and
// by the Plan API (through the variant registry).

struct TeamChoice {
  int vec;   // elements per thread access: 16 bytes' worth when D allows it, else 1
  int team;  // threads per bag / row / position (power of two); each owns D / (vec * team) vectors
};

TeamChoice choose_team(int64_t dim, int64_t elem_bytes, int max_team) {
  const int full = static_cast<int>(16 / elem_bytes);
  const int vec = dim % full == 0 ? full : 1;
  const int64_t vectors = std::max<int64_t>(1, dim / vec);
  int team = 1;
  while (team < vectors && team < max_team) team *= 2;
  return {vec, team};
}

std::string team_name(const TeamChoice& c, int64_t elem_bytes) {
  return "team" + std::to_string(c.team) + "," + std::to_string(c.vec * elem_bytes) + "B";
}

int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == at::kDouble ? 8 : 4; }

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

// Backward scratch, byte offsets into the workspace (each 256-aligned):
// sort keys and positions (double-buffered; after the sort the spare key buffer
// holds each sorted position's bag), CUB's temporary storage, the end of each
// row's run in the sorted order, the start of each row's run (kNoRun for rows
// with none), the chunk/group partials, and (max mode) the columns each position
// won, a bit per column.
struct BackwardLayout {
  int end_bit = 0;
  size_t cub_bytes = 0;
  int64_t num_chunks = 0, num_groups = 0;
  int64_t mask_words = 0;  // max mode: 32-bit words of won columns per position
  int64_t keys[2], vals[2], cub, run_end, run_start, head, tail, group, mask, total;
};

BackwardLayout backward_layout(int64_t num_weights, int64_t num_indices, int64_t num_bags, int64_t dim,
                               int64_t mode, int64_t acc_bytes) {
  TORCH_CHECK_NOT_IMPLEMENTED(num_weights < kU32Limit && num_indices < kU32Limit && num_bags < kU32Limit,
                              kEmbeddingBagBackwardOp, ": the CUDA kernel needs num_weights, the number of "
                              "indices and the number of bags below 2^32 - 1, got ", num_weights, ", ", num_indices,
                              " and ", num_bags);
  BackwardLayout l;
  l.mask_words = mode == kModeMax ? ceil_div<int64_t>(dim, 32) : 0;
  while ((uint64_t(1) << l.end_bit) <= uint64_t(num_weights)) ++l.end_bit;  // keys lie in [0, num_weights]
  cub::DoubleBuffer<uint32_t> k(nullptr, nullptr), v(nullptr, nullptr);
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.cub_bytes, k, v, static_cast<int64_t>(num_indices), 0,
                                                 l.end_bit));
  l.num_chunks = ceil_div<int64_t>(num_indices, kChunk);
  l.num_groups = l.num_chunks / kGroup;  // full groups only
  const int64_t n4 = align256(num_indices * 4);
  int64_t at = 0;
  for (int b = 0; b < 2; ++b) { l.keys[b] = at; at += n4; }
  for (int b = 0; b < 2; ++b) { l.vals[b] = at; at += n4; }
  l.cub = at;
  at += align256(static_cast<int64_t>(l.cub_bytes));
  l.run_end = at;
  at += align256(num_weights * 4);
  l.run_start = at;
  at += align256(num_weights * 4);
  l.head = at;
  at += align256(l.num_chunks * dim * acc_bytes);
  l.tail = at;
  at += align256(l.num_chunks * dim * acc_bytes);
  l.group = at;
  at += align256(l.num_groups * dim * acc_bytes);
  l.mask = at;
  at += align256(num_indices * l.mask_words * 4);
  l.total = at;
  return l;
}

int64_t grid_stride_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(ceil_div<int64_t>(n, kThreads), int64_t(cuda::num_sms()) * 8));
}

// ---------------------------------------------------------------------------
// Forward. One team of `team` threads per bag; each thread owns `V` adjacent
// columns (one 16-byte vector when D allows) and walks the bag's entries in
// position order, kUnroll entries' loads in flight at a time (kMax: max mode,
// a separate instantiation, so that sum/mean carry no max state and fit three
// blocks per SM, 80 registers):
//   sum:  acc = sum_i w_i * weight[idx_i, cols]      (w_i = per_sample_weights[i] or 1)
//   mean: acc = sum_i weight[idx_i, cols] / count     (0 when count == 0)
//   max:  acc = weight[idx_first, cols], then replaced where weight[idx_i, cols] > acc
// over the bag's entries with idx_i != padding_idx, accumulated in AccT. An
// out-of-range idx_i contributes nothing and flags the bag: NaN row, bag_size -1.
// The team also writes offset2bag for its positions (bag 0 and the last bag
// write -1 for the positions before / after every bag).

template <typename T, typename AccT, typename IndexT, int V, bool kMax>
__global__ void __launch_bounds__(kThreads, kMax ? 1 : 3)
    bag_forward_kernel(const T* __restrict__ weight, const IndexT* __restrict__ indices,
                       const IndexT* __restrict__ offsets, const T* __restrict__ psw, T* __restrict__ out,
                       int64_t* __restrict__ offset2bag, int64_t* __restrict__ bag_size,
                       int64_t* __restrict__ max_pos, BagGeometry g, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t b = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (b >= g.num_bags) return;
  int64_t begin, end;
  bool bad;
  bag_range(offsets, b, g.num_offsets, g.fixed_len, g.num_indices, begin, end, bad);
  for (int64_t i = begin + lane; i < end; i += team) offset2bag[i] = b;
  if (b == 0) {
    for (int64_t i = lane; i < begin; i += team) offset2bag[i] = -1;
  }
  if (b == g.num_bags - 1) {
    for (int64_t i = end + lane; i < g.num_indices; i += team) offset2bag[i] = -1;
  }

  const int64_t D = g.dim;
  const int64_t num_vecs = D / V;
  for (int64_t cv = lane; cv < (num_vecs > 0 ? num_vecs : 1); cv += team) {
    const bool has_col = cv < num_vecs;
    const int64_t col = cv * V;
    AccT acc[V];
    int64_t pos[V];  // max mode only
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[k] = AccT(0);
      pos[k] = -1;
    }
    int64_t count = 0;
    bool bag_bad = bad;
    for (int64_t i = begin; i < end; i += kUnroll) {
      cuda::RawVec<T, V> raw[kUnroll];
      bool use[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const bool present = i + u < end;
        const int64_t idx = present ? static_cast<int64_t>(indices[i + u]) : 0;
        const bool pad = g.padding_idx >= 0 && idx == g.padding_idx;
        const bool in_range = idx >= 0 && idx < g.num_weights;
        bag_bad |= present && !pad && !in_range;
        use[u] = present && !pad && in_range;
        if (use[u] && has_col) raw[u] = cuda::load_raw<T, V>(weight + idx * D + col);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (!use[u]) continue;
        if (has_col) {
          const auto w = cuda::from_raw<T, V>(raw[u]);
          if constexpr (kMax) {
#pragma unroll
            for (int k = 0; k < V; ++k) {
              const AccT v = static_cast<AccT>(w.v[k]);
              if (count == 0 || v > acc[k]) {
                acc[k] = v;
                pos[k] = i + u;
              }
            }
          } else {
            const AccT coef = psw != nullptr ? static_cast<AccT>(psw[i + u]) : AccT(1);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += coef * static_cast<AccT>(w.v[k]);
          }
        }
        ++count;
      }
    }
    if (has_col) {
      cuda::Vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        AccT r = acc[k];
        if (g.mode == kModeMean) r = count > 0 ? r / static_cast<AccT>(count) : AccT(0);
        if (bag_bad) r = static_cast<AccT>(NAN);
        o.v[k] = static_cast<T>(r);
      }
      cuda::store_vec<T, V>(out + b * D + col, o);
      if constexpr (kMax) {
#pragma unroll
        for (int k = 0; k < V; ++k) max_pos[b * D + col + k] = bag_bad ? -1 : pos[k];
      }
    }
    if (cv == 0) bag_size[b] = bag_bad ? -1 : count;
  }
}

template <typename T, typename AccT, typename IndexT, int V>
void launch_bag_forward(const at::Tensor& weight, const at::Tensor& indices, const c10::optional<at::Tensor>& offsets,
                        const at::Tensor& psw, const BagGeometry& g, const TeamChoice& c, const at::Tensor& output,
                        const at::Tensor& offset2bag, const at::Tensor& bag_size, const at::Tensor& max_positions) {
  const int64_t blocks = ceil_div<int64_t>(g.num_bags, kThreads / c.team);
  const bool is_max = g.mode == kModeMax;
  auto* kernel = is_max ? bag_forward_kernel<T, AccT, IndexT, V, true> : bag_forward_kernel<T, AccT, IndexT, V, false>;
  kernel<<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      weight.const_data_ptr<T>(), indices.const_data_ptr<IndexT>(),
      offsets.has_value() ? offsets->const_data_ptr<IndexT>() : nullptr,
      psw.defined() ? psw.const_data_ptr<T>() : nullptr, output.mutable_data_ptr<T>(),
      offset2bag.mutable_data_ptr<int64_t>(), bag_size.mutable_data_ptr<int64_t>(),
      is_max ? max_positions.mutable_data_ptr<int64_t>() : nullptr, g, c.team);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void embedding_bag_out_cuda(const at::Tensor& weight, const at::Tensor& indices_in,
                            const c10::optional<at::Tensor>& offsets_in, int64_t mode,
                            const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                            int64_t padding_idx, const at::Tensor& output, const at::Tensor& offset2bag,
                            const at::Tensor& bag_size, const at::Tensor& max_positions) {
  const auto g = check_embedding_bag(weight, indices_in, offsets_in, mode, per_sample_weights, include_last_offset,
                                     padding_idx);
  check_embedding_bag_outputs(g, weight, output, offset2bag, bag_size, max_positions);
  cuda::check_out_aligned(kEmbeddingBagOp, "output", output);
  const c10::cuda::CUDAGuard guard(weight.device());
  if (g.num_bags == 0) {
    if (offset2bag.numel() > 0) offset2bag.fill_(-1);
    return;
  }
  at::Tensor indices = indices_in.contiguous();
  c10::optional<at::Tensor> offsets = offsets_in;
  promote_indices_and_offsets(indices, offsets);
  if (offsets.has_value()) offsets = offsets->contiguous();
  const auto w = cuda::aligned_contiguous(weight);
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  const auto c = choose_team(g.dim, weight.element_size(), kThreads);
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_cuda", [&] {
    BARACUDA_DISPATCH_FLOATING(weight.scalar_type(), "embedding_bag_cuda", [&] {
      constexpr int kV = 16 / sizeof(scalar_t);
      if (c.vec == kV) {
        launch_bag_forward<scalar_t, acc_t, index_t, kV>(w, indices, offsets, psw, g, c, output, offset2bag,
                                                         bag_size, max_positions);
      } else {
        launch_bag_forward<scalar_t, acc_t, index_t, 1>(w, indices, offsets, psw, g, c, output, offset2bag,
                                                        bag_size, max_positions);
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_cuda(
    const at::Tensor& weight, const at::Tensor& indices, const c10::optional<at::Tensor>& offsets, int64_t mode,
    const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset, int64_t padding_idx) {
  const auto g = check_embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                     padding_idx);
  auto output = at::empty({g.num_bags, g.dim}, weight.options());
  auto offset2bag = at::empty({g.num_indices}, weight.options().dtype(at::kLong));
  auto bag_size = at::empty({g.num_bags}, weight.options().dtype(at::kLong));
  auto max_positions = at::empty(max_positions_shape(g), weight.options().dtype(at::kLong));
  embedding_bag_out_cuda(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, output,
                         offset2bag, bag_size, max_positions);
  return {output, offset2bag, bag_size, max_positions};
}

// ---------------------------------------------------------------------------
// Backward: grad_weight[v] = sum over the positions i with indices[i] == v (in
// range, not padding, in a bag), in increasing i, of
//   sum:  w_i * grad[bag_i]               (w_i = per_sample_weights[i] or 1)
//   mean: grad[bag_i] / bag_size[bag_i]
//   max:  grad[bag_i, d] where max_positions[bag_i, d] == i (per column d)
// Steps, no floating-point atomics: (1) key_i = indices[i] for used positions,
// else V; max mode also marks, per position, the columns it won (a bit each, set
// with an integer atomicOr: the result does not depend on the order); (2) stable
// radix sort of (key, i): each row's positions become one run, in position
// order; (3) the start and end of each row's run in the sorted order, and each
// sorted position's bag; (4) the sorted order is cut into chunks of kChunk
// positions; a run that crosses a chunk boundary gets its part in each chunk
// summed into a head (chunk's first run) or tail (chunk's last run) partial, and
// every kGroup chunks wholly inside one run are summed again into a group partial;
// (5) every row of grad_weight is written once: zero for a row with no run, else
// by one team from its run: a direct ordered sum for a run inside one chunk, else
// tail[first] + (group or head partials, in chunk order) + head[last]. Every
// summation order is fixed by the sorted data alone, so the result is
// bit-identical run to run.

template <typename IndexT>
__global__ void __launch_bounds__(kThreads)
    make_keys_kernel(const IndexT* __restrict__ indices, const int64_t* __restrict__ offset2bag, int64_t n,
                     int64_t num_weights, int64_t num_bags, int64_t padding_idx, uint32_t* __restrict__ keys,
                     uint32_t* __restrict__ vals, uint32_t* __restrict__ won, int64_t won_words) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t idx = static_cast<int64_t>(indices[i]);
    const int64_t bag = offset2bag[i];
    const bool used = idx >= 0 && idx < num_weights && idx != padding_idx && bag >= 0 && bag < num_bags;
    keys[i] = static_cast<uint32_t>(used ? idx : num_weights);
    vals[i] = static_cast<uint32_t>(i);
    for (int64_t w = 0; w < won_words; ++w) won[i * won_words + w] = 0;  // max mode: cleared for max_won_kernel
  }
}

// Max mode: bit d % 32 of won[i * words + d / 32] is set when position i is the
// argmax of its bag at column d, i.e. max_positions[bag, d] == i with
// offset2bag[i] == bag (an entry naming a position outside its bag adds nothing,
// as in the CPU kernel). Positions that win no column in a thread's columns skip
// their grad load.
__global__ void __launch_bounds__(kThreads)
    max_won_kernel(const int64_t* __restrict__ max_pos, const int64_t* __restrict__ offset2bag, int64_t num_bags,
                   int64_t dim, int64_t n, int64_t words, uint32_t* __restrict__ won) {
  const int64_t total = num_bags * dim;
  for (int64_t q = int64_t(blockIdx.x) * kThreads + threadIdx.x; q < total; q += int64_t(gridDim.x) * kThreads) {
    const int64_t bag = q / dim, d = q - bag * dim;
    const int64_t i = max_pos[q];
    if (i >= 0 && i < n && offset2bag[i] == bag) atomicOr(won + i * words + d / 32, 1u << (d % 32));
  }
}

// run_start[v] / run_end[v] = the first / one past the last sorted position of
// row v, for the rows that have a run (run_start was set to kNoRun before;
// run_end is read only where run_start is set); sorted_bag[p] = the bag of sorted
// position p (read only for used positions, whose bag is valid).
__global__ void __launch_bounds__(kThreads)
    runs_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ sorted_pos,
                const int64_t* __restrict__ offset2bag, int64_t n, uint32_t num_weights,
                uint32_t* __restrict__ run_start, uint32_t* __restrict__ run_end, uint32_t* __restrict__ sorted_bag) {
  for (int64_t p = int64_t(blockIdx.x) * kThreads + threadIdx.x; p < n; p += int64_t(gridDim.x) * kThreads) {
    const uint32_t k = keys[p];
    if (k < num_weights && (p == 0 || keys[p - 1] != k)) run_start[k] = static_cast<uint32_t>(p);
    if (k < num_weights && (p == n - 1 || keys[p + 1] != k)) run_end[k] = static_cast<uint32_t>(p + 1);
    sorted_bag[p] = k < num_weights ? static_cast<uint32_t>(offset2bag[sorted_pos[p]]) : 0u;
  }
}

// What one sorted position adds to its row, for V adjacent columns.
template <typename T, typename AccT, int V>
struct GradSource {
  const T* grad;
  const int64_t* bag_size;
  const T* psw;
  const uint32_t* won;         // max mode: won columns, mask_words words per position
  const uint32_t* sorted_pos;  // read in max mode and with per_sample_weights
  const uint32_t* sorted_bag;
  int64_t dim;
  int64_t mask_words;
  int64_t mode;

  __device__ __forceinline__ void add(AccT (&acc)[V], const cuda::Vec<T, V>& g, uint32_t i, uint32_t bag,
                                      uint32_t won_bits) const {
    if (mode == kModeMax) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if ((won_bits >> k) & 1u) acc[k] += static_cast<AccT>(g.v[k]);
      }
    } else if (mode == kModeMean) {
      const int64_t n = bag_size[bag];
      if (n > 0) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += static_cast<AccT>(g.v[k]) / static_cast<AccT>(n);
      }
    } else {
      const AccT coef = psw != nullptr ? static_cast<AccT>(psw[i]) : AccT(1);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += coef * static_cast<AccT>(g.v[k]);
    }
  }

  // acc += contributions of sorted positions [s, e), in order. Loads of
  // kSumUnroll positions are in flight together: bags (and positions), then (max
  // mode) won columns, then the grad rows, which max mode loads only where the
  // position won one of this thread's V columns (V divides 32, so one word). In
  // the other modes won_bits is ~0 for every position in range: all contribute.
  __device__ __forceinline__ void sum_range(AccT (&acc)[V], int64_t s, int64_t e, int64_t col) const {
    const bool need_pos = mode == kModeMax || psw != nullptr;
    for (int64_t p = s; p < e; p += kSumUnroll) {
      uint32_t bag[kSumUnroll], pos[kSumUnroll], won_bits[kSumUnroll];
      cuda::Vec<T, V> g[kSumUnroll];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        bag[u] = p + u < e ? sorted_bag[p + u] : 0u;
        pos[u] = p + u < e && need_pos ? sorted_pos[p + u] : 0u;
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        won_bits[u] = p + u < e ? ~0u : 0u;
        if (mode == kModeMax && p + u < e) {
          won_bits[u] = (won[int64_t(pos[u]) * mask_words + col / 32] >> (col % 32)) & ((1u << V) - 1u);
        }
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        if (won_bits[u] != 0) g[u] = cuda::load_vec<T, V>(grad + int64_t(bag[u]) * dim + col);
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        if (won_bits[u] != 0) add(acc, g[u], pos[u], bag[u], won_bits[u]);
      }
    }
  }
};

template <typename AccT, int V>
__device__ __forceinline__ void zero(AccT (&acc)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = AccT(0);
}

template <typename AccT, int V>
__device__ __forceinline__ void add_partial(AccT (&acc)[V], const AccT* p) {
  const auto v = cuda::load_vec<AccT, V>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] += v.v[k];
}

template <typename AccT, int V>
__device__ __forceinline__ void store_partial(AccT* p, const AccT (&acc)[V]) {
  cuda::Vec<AccT, V> v;
#pragma unroll
  for (int k = 0; k < V; ++k) v.v[k] = acc[k];
  cuda::store_vec<AccT, V>(p, v);
}

// First position in [lo, hi) of sorted keys whose key is > key (upper) or >= key (lower).
template <bool Upper>
__device__ __forceinline__ int64_t search_sorted(const uint32_t* keys, int64_t lo, int64_t hi, uint32_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (Upper ? keys[mid] <= key : keys[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Step (4a): head/tail partials of the runs that cross chunk boundaries. A
// chunk holding a single run stores its sum as both head and tail.
template <typename T, typename AccT, int V>
__global__ void __launch_bounds__(kThreads)
    chunk_partials_kernel(GradSource<T, AccT, V> src, const uint32_t* __restrict__ keys, int64_t n,
                          uint32_t num_weights, int64_t num_chunks, AccT* __restrict__ head,
                          AccT* __restrict__ tail, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t j = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (j >= num_chunks) return;
  const int64_t cs = j * kChunk, ce = std::min<int64_t>(n, cs + kChunk);
  const uint32_t k0 = keys[cs], k1 = keys[ce - 1];
  const bool need_head = j > 0 && k0 < num_weights && keys[cs - 1] == k0;
  const bool need_tail = ce < n && k1 < num_weights && keys[ce] == k1;
  if (!need_head && !need_tail) return;
  const bool single = k0 == k1;
  const int64_t head_end = single ? ce : search_sorted<true>(keys, cs, ce, k0);
  const int64_t tail_begin = single ? cs : search_sorted<false>(keys, cs, ce, k1);
  const int64_t D = src.dim;
  for (int64_t col = int64_t(lane) * V; col < D; col += int64_t(team) * V) {
    AccT acc[V];
    if (single) {
      zero(acc);
      src.sum_range(acc, cs, ce, col);
      store_partial(head + j * D + col, acc);
      store_partial(tail + j * D + col, acc);
      continue;
    }
    if (need_head) {
      zero(acc);
      src.sum_range(acc, cs, head_end, col);
      store_partial(head + j * D + col, acc);
    }
    if (need_tail) {
      zero(acc);
      src.sum_range(acc, tail_begin, ce, col);
      store_partial(tail + j * D + col, acc);
    }
  }
}

// Step (4b): group[g] = sum of head[j] over the kGroup chunks of group g, in
// order, for groups that lie wholly inside one run.
template <typename AccT, int V>
__global__ void __launch_bounds__(kThreads)
    group_partials_kernel(const uint32_t* __restrict__ keys, int64_t n, uint32_t num_weights, int64_t num_groups,
                          int64_t dim, const AccT* __restrict__ head, AccT* __restrict__ group, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t gi = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (gi >= num_groups) return;
  const int64_t j0 = gi * kGroup;
  const int64_t ps = j0 * kChunk, pe = std::min<int64_t>(n, (j0 + kGroup) * kChunk);
  const uint32_t k = keys[ps];
  if (k >= num_weights || keys[pe - 1] != k) return;
  for (int64_t col = int64_t(lane) * V; col < dim; col += int64_t(team) * V) {
    AccT acc[V];
    zero(acc);
    for (int64_t j = j0; j < j0 + kGroup; ++j) add_partial(acc, head + j * dim + col);
    store_partial(group + gi * dim + col, acc);
  }
}

// Row v of grad_weight from its run [s, e) of sorted positions, columns lane * V,
// (lane + team) * V, ...: a direct ordered sum for a run inside one chunk, else
// tail[first chunk] + (group or head partials, in chunk order) + head[last chunk].
template <typename T, typename AccT, int V>
__device__ __forceinline__ void process_run(const GradSource<T, AccT, V>& src, int64_t s, int64_t e, uint32_t v,
                                            int lane, int team, const AccT* __restrict__ head,
                                            const AccT* __restrict__ tail, const AccT* __restrict__ group,
                                            T* __restrict__ grad_weight) {
  const int64_t D = src.dim;
  for (int64_t col = int64_t(lane) * V; col < D; col += int64_t(team) * V) {
    AccT acc[V];
    zero(acc);
    const int64_t a = s / kChunk, last = (e - 1) / kChunk;
    if (a == last) {
      src.sum_range(acc, s, e, col);
    } else {
      add_partial(acc, tail + a * D + col);
      int64_t j = a + 1;
      while (j < last) {
        if (j % kGroup == 0 && j + kGroup <= last) {
          add_partial(acc, group + (j / kGroup) * D + col);
          j += kGroup;
        } else {
          add_partial(acc, head + j * D + col);
          ++j;
        }
      }
      add_partial(acc, head + last * D + col);
    }
    cuda::Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = static_cast<T>(acc[k]);
    cuda::store_vec<T, V>(grad_weight + v * D + col, o);
  }
}

// Step (5): every row of grad_weight written exactly once. Each warp takes 32
// consecutive rows at a time (a grid-stride loop): lane l loads row l's run start
// (and end), then its 32 / team sub-teams of `team` lanes write rows j, j + 32 /
// team, ... (row bounds passed by shuffle): a row with no run is zeroed (streaming
// stores), the others are written by process_run. Held to 3 blocks per SM (at
// most 85 registers): faster than 2 or 4 (docs/PERFORMANCE.md).
template <typename T, typename AccT, int V>
__global__ void __launch_bounds__(kThreads, 3)
    rows_kernel(GradSource<T, AccT, V> src, const uint32_t* __restrict__ run_start,
                const uint32_t* __restrict__ run_end, int64_t num_weights, const AccT* __restrict__ head,
                const AccT* __restrict__ tail, const AccT* __restrict__ group, T* __restrict__ grad_weight, int team) {
  const int lane = threadIdx.x % 32, sub = lane / team, tl = lane % team, subs = 32 / team;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  cuda::Vec<T, V> zeros;
#pragma unroll
  for (int k = 0; k < V; ++k) zeros.v[k] = T(0);
  for (int64_t base = (int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * 32; base < num_weights;
       base += warps * 32) {
    uint32_t my_start = kNoRun, my_end = 0;
    if (base + lane < num_weights) {
      my_start = run_start[base + lane];
      if (my_start != kNoRun) my_end = run_end[base + lane];  // set only for rows with a run
    }
    for (int r = sub; r < 32; r += subs) {  // the same trip count in every lane: the shuffles see the whole warp
      const uint32_t s = __shfl_sync(0xffffffffu, my_start, r);
      const uint32_t e = __shfl_sync(0xffffffffu, my_end, r);
      const int64_t v = base + r;
      if (v >= num_weights) continue;
      if (s == kNoRun) {
        for (int64_t col = int64_t(tl) * V; col < src.dim; col += int64_t(team) * V) {
          cuda::store_vec_streaming<T, V>(grad_weight + v * src.dim + col, zeros);
        }
      } else {
        process_run(src, s, e, static_cast<uint32_t>(v), tl, team, head, tail, group, grad_weight);
      }
    }
  }
}

template <typename T, typename AccT, int V>
void launch_backward_segments(const GradSource<T, AccT, V>& src, const uint32_t* sorted_keys,
                              const uint32_t* run_start, const uint32_t* run_end, const BackwardLayout& l, char* ws,
                              int64_t n, int64_t num_weights, const TeamChoice& c, const at::Tensor& grad_weight) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* head = reinterpret_cast<AccT*>(ws + l.head);
  auto* tail = reinterpret_cast<AccT*>(ws + l.tail);
  auto* group = reinterpret_cast<AccT*>(ws + l.group);
  const int teams = kThreads / c.team;
  chunk_partials_kernel<T, AccT, V><<<ceil_div<int64_t>(l.num_chunks, teams), kThreads, 0, stream>>>(
      src, sorted_keys, n, static_cast<uint32_t>(num_weights), l.num_chunks, head, tail, c.team);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (l.num_groups > 0) {
    group_partials_kernel<AccT, V><<<ceil_div<int64_t>(l.num_groups, teams), kThreads, 0, stream>>>(
        sorted_keys, n, static_cast<uint32_t>(num_weights), l.num_groups, src.dim, head, group, c.team);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int row_team = std::min(c.team, 32);
  auto* kernel = rows_kernel<T, AccT, V>;
  const int64_t rows_per_block = (kThreads / 32) * 32;
  const int64_t blocks = std::min(ceil_div<int64_t>(num_weights, rows_per_block),
                                  cuda::resident_groups(kernel, kThreads, 1, 0));
  kernel<<<blocks, kThreads, 0, stream>>>(src, run_start, run_end, num_weights, head, tail, group,
                                          grad_weight.mutable_data_ptr<T>(), row_team);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool backward_is_trivial(int64_t num_weights, int64_t dim, int64_t num_indices, int64_t num_bags) {
  return num_weights == 0 || dim == 0 || num_indices == 0 || num_bags == 0;
}

void embedding_bag_backward_out_cuda(const at::Tensor& grad_in, const at::Tensor& indices_in,
                                     const at::Tensor& offset2bag_in, const at::Tensor& bag_size_in,
                                     const at::Tensor& max_positions_in, int64_t num_weights, int64_t mode,
                                     const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx,
                                     const at::Tensor& grad_weight, const at::Tensor& workspace) {
  const char* op = kEmbeddingBagBackwardOp;
  check_embedding_bag_backward(grad_in, indices_in, offset2bag_in, bag_size_in, max_positions_in, num_weights, mode,
                               per_sample_weights, padding_idx);
  const int64_t B = grad_in.size(0), D = grad_in.size(1), N = indices_in.numel();
  check_out(op, "grad_weight", grad_weight, {num_weights, D}, grad_in.scalar_type(), grad_in.device());
  cuda::check_out_aligned(op, "grad_weight", grad_weight);
  if (grad_weight.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(grad_in.device());
  if (backward_is_trivial(num_weights, D, N, B)) {
    grad_weight.zero_();
    return;
  }
  const auto l = backward_layout(num_weights, N, B, D, mode, acc_bytes_of(grad_in.scalar_type()));
  check_workspace(op, workspace, l.total, 256, grad_in.device());
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto bag_size = bag_size_in.contiguous();
  const auto max_positions = max_positions_in.contiguous();
  const auto grad = cuda::aligned_contiguous(grad_in);
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  char* ws = static_cast<char*>(workspace.mutable_data_ptr());
  uint32_t* keys[2] = {reinterpret_cast<uint32_t*>(ws + l.keys[0]), reinterpret_cast<uint32_t*>(ws + l.keys[1])};
  uint32_t* vals[2] = {reinterpret_cast<uint32_t*>(ws + l.vals[0]), reinterpret_cast<uint32_t*>(ws + l.vals[1])};
  auto* run_end = reinterpret_cast<uint32_t*>(ws + l.run_end);
  auto* run_start = reinterpret_cast<uint32_t*>(ws + l.run_start);
  auto* won = reinterpret_cast<uint32_t*>(ws + l.mask);

  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_backward_keys", [&] {
    make_keys_kernel<index_t><<<grid_stride_blocks(N), kThreads, 0, stream>>>(
        indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(), N, num_weights, B, padding_idx,
        keys[0], vals[0], won, l.mask_words);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (mode == kModeMax) {
    max_won_kernel<<<grid_stride_blocks(B * D), kThreads, 0, stream>>>(
        max_positions.const_data_ptr<int64_t>(), offset2bag.const_data_ptr<int64_t>(), B, D, N, l.mask_words, won);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  cub::DoubleBuffer<uint32_t> sort_keys(keys[0], keys[1]), sort_vals(vals[0], vals[1]);
  size_t cub_bytes = l.cub_bytes;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + l.cub, cub_bytes, sort_keys, sort_vals, N, 0, l.end_bit,
                                                 stream));
  uint32_t* const sorted_bag = sort_keys.Alternate();  // the spare key buffer
  C10_CUDA_CHECK(cudaMemsetAsync(run_start, 0xff, num_weights * sizeof(uint32_t), stream));  // kNoRun
  runs_kernel<<<grid_stride_blocks(N), kThreads, 0, stream>>>(sort_keys.Current(), sort_vals.Current(),
                                                             offset2bag.const_data_ptr<int64_t>(), N,
                                                             static_cast<uint32_t>(num_weights), run_start, run_end,
                                                             sorted_bag);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const auto c = choose_team(D, grad.element_size(), kThreads);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_backward_cuda", [&] {
    auto run = [&](auto vec_tag) {
      constexpr int kV = decltype(vec_tag)::value;
      const GradSource<scalar_t, acc_t, kV> src{grad.const_data_ptr<scalar_t>(),
                                                bag_size.const_data_ptr<int64_t>(),
                                                psw.defined() ? psw.const_data_ptr<scalar_t>() : nullptr,
                                                won,
                                                sort_vals.Current(),
                                                sorted_bag,
                                                D,
                                                l.mask_words,
                                                mode};
      launch_backward_segments<scalar_t, acc_t, kV>(src, sort_keys.Current(), run_start, run_end, l, ws, N,
                                                    num_weights, c, grad_weight);
    };
    if (c.vec == 16 / int(sizeof(scalar_t))) {
      run(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
    } else {
      run(std::integral_constant<int, 1>{});
    }
  });
}

int64_t backward_workspace_bytes(int64_t num_weights, int64_t dim, int64_t num_indices, int64_t num_bags,
                                 int64_t mode, c10::ScalarType dtype) {
  return backward_is_trivial(num_weights, dim, num_indices, num_bags)
             ? 0
             : backward_layout(num_weights, num_indices, num_bags, dim, mode, acc_bytes_of(dtype)).total;
}

at::Tensor embedding_bag_backward_cuda(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                       const at::Tensor& bag_size, const at::Tensor& max_positions,
                                       int64_t num_weights, int64_t mode,
                                       const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  check_embedding_bag_backward(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                               per_sample_weights, padding_idx);
  auto grad_weight = at::empty({num_weights, grad.size(1)}, grad.options());
  int64_t need = 0;
  {
    const c10::cuda::CUDAGuard guard(grad.device());
    need = backward_workspace_bytes(num_weights, grad.size(1), indices.numel(), grad.size(0), mode,
                                    grad.scalar_type());
  }
  const auto workspace = at::empty({need}, grad.options().dtype(at::kByte));
  embedding_bag_backward_out_cuda(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                                  per_sample_weights, padding_idx, grad_weight, workspace);
  return grad_weight;
}

// ---------------------------------------------------------------------------
// d per_sample_weights[i] = <grad[bag_i], weight[indices[i]]>, 0 for padding,
// positions in no bag and out-of-range indices. One team (<= 32 threads, in one
// warp) per position: each thread sums its columns in order, then a fixed
// xor-butterfly adds the team's partial sums.

template <typename T, typename AccT, typename IndexT, int V>
__global__ void __launch_bounds__(kThreads)
    position_dot_kernel(const T* __restrict__ grad, const T* __restrict__ weight, const IndexT* __restrict__ indices,
                        const int64_t* __restrict__ offset2bag, int64_t n, int64_t num_weights, int64_t num_bags,
                        int64_t dim, int64_t padding_idx, T* __restrict__ out, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t i = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  AccT acc = 0;
  if (i < n) {
    const int64_t idx = static_cast<int64_t>(indices[i]);
    const int64_t bag = offset2bag[i];
    if (idx >= 0 && idx < num_weights && idx != padding_idx && bag >= 0 && bag < num_bags) {
      for (int64_t col = int64_t(lane) * V; col < dim; col += int64_t(team) * V) {
        const auto gv = cuda::load_vec<T, V>(grad + bag * dim + col);
        const auto wv = cuda::load_vec<T, V>(weight + idx * dim + col);
#pragma unroll
        for (int k = 0; k < V; ++k) acc += static_cast<AccT>(gv.v[k]) * static_cast<AccT>(wv.v[k]);
      }
    }
  }
  // Every thread of the block reaches the shuffles (no early return above).
  for (int offset = team / 2; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset, team);
  if (i < n && lane == 0) out[i] = static_cast<T>(acc);
}

void per_sample_weights_backward_out_cuda(const at::Tensor& grad_in, const at::Tensor& weight_in,
                                          const at::Tensor& indices_in, const at::Tensor& offset2bag_in,
                                          int64_t mode, int64_t padding_idx,
                                          const at::Tensor& grad_per_sample_weights) {
  const char* op = kEmbeddingBagPswBackwardOp;
  check_per_sample_weights_backward(grad_in, weight_in, indices_in, offset2bag_in, mode, padding_idx);
  check_out(op, "grad_per_sample_weights", grad_per_sample_weights, indices_in.sizes(), weight_in.scalar_type(),
            weight_in.device());
  TORCH_CHECK_VALUE(grad_per_sample_weights.is_contiguous(), op, ": grad_per_sample_weights must be contiguous");
  const int64_t N = indices_in.numel();
  if (N == 0) return;
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto grad = cuda::aligned_contiguous(grad_in);
  const auto weight = cuda::aligned_contiguous(weight_in);
  const int64_t D = weight.size(1);
  const auto c = choose_team(D, weight.element_size(), 32);
  const int64_t blocks = ceil_div<int64_t>(N, kThreads / c.team);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_psw_backward_cuda", [&] {
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_psw_backward_cuda", [&] {
      constexpr int kV = 16 / sizeof(scalar_t);
      auto* kernel = c.vec == kV ? position_dot_kernel<scalar_t, acc_t, index_t, kV>
                                 : position_dot_kernel<scalar_t, acc_t, index_t, 1>;
      kernel<<<blocks, kThreads, 0, stream>>>(grad.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                                             indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(),
                                             N, weight.size(0), grad.size(0), D, padding_idx,
                                             grad_per_sample_weights.mutable_data_ptr<scalar_t>(), c.team);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

at::Tensor per_sample_weights_backward_cuda(const at::Tensor& grad, const at::Tensor& weight,
                                            const at::Tensor& indices, const at::Tensor& offset2bag, int64_t mode,
                                            int64_t padding_idx) {
  check_per_sample_weights_backward(grad, weight, indices, offset2bag, mode, padding_idx);
  auto out = at::empty(indices.sizes(), weight.options());
  per_sample_weights_backward_out_cuda(grad, weight, indices, offset2bag, mode, padding_idx, out);
  return out;
}

// problem = [num_embeddings, embedding_dim, num_indices, num_bags, mode, has_per_sample_weights]
void check_problem(const char* op, c10::IntArrayRef problem) {
  TORCH_CHECK_VALUE(problem.size() == 6 && problem[0] >= 0 && problem[1] >= 0 && problem[2] >= 0 && problem[3] >= 0,
                    op, ": malformed problem ", shape_str(problem));
}

KernelChoice embedding_bag_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  check_problem(kEmbeddingBagOp, problem);
  const int64_t elem = c10::elementSize(dtype);
  return {"bag_gather<" + team_name(choose_team(problem[1], elem, kThreads), elem) + ">", 0};
}

KernelChoice embedding_bag_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  check_problem(kEmbeddingBagBackwardOp, problem);
  const int64_t elem = c10::elementSize(dtype);
  const std::string variant = "sort_segment<" + team_name(choose_team(problem[1], elem, kThreads), elem) +
                              ",chunk" + std::to_string(kChunk) + ",group" + std::to_string(kGroup) + ">";
  return {variant, backward_workspace_bytes(problem[0], problem[1], problem[2], problem[3], problem[4], dtype)};
}

KernelChoice per_sample_weights_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  check_problem(kEmbeddingBagPswBackwardOp, problem);
  const int64_t elem = c10::elementSize(dtype);
  return {"position_dot<" + team_name(choose_team(problem[1], elem, 32), elem) + ">", 0};
}

BARACUDA_REGISTER_VARIANT("embedding_bag", c10::DeviceType::CUDA, embedding_bag_choice);
BARACUDA_REGISTER_VARIANT("embedding_bag_backward", c10::DeviceType::CUDA, embedding_bag_backward_choice);
BARACUDA_REGISTER_VARIANT("embedding_bag_per_sample_weights_backward", c10::DeviceType::CUDA,
                          per_sample_weights_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("embedding_bag", &baracuda::embedding_bag_cuda);
  m.impl("embedding_bag.out", &baracuda::embedding_bag_out_cuda);
  m.impl("embedding_bag_backward", &baracuda::embedding_bag_backward_cuda);
  m.impl("embedding_bag_backward.out", &baracuda::embedding_bag_backward_out_cuda);
  m.impl("embedding_bag_per_sample_weights_backward", &baracuda::per_sample_weights_backward_cuda);
  m.impl("embedding_bag_per_sample_weights_backward.out", &baracuda::per_sample_weights_backward_out_cuda);
}
