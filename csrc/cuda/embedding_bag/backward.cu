// embedding_bag family, CUDA: the weight gradient (a stable radix sort of the positions by row, then
// ordered sums of each row's run; no atomics).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "baracuda/variant.h"
#include "common.cuh"

namespace baracuda {
namespace {

constexpr int kWonWords = kBagWonWords;
constexpr int kSweepUnroll = 8;  // sorted positions whose grad rows are in flight together
constexpr int64_t kChunk = kBagChunk;
constexpr int64_t kGroup = kBagGroup;
constexpr int kWideDigitBits = kBagWideDigitBits;
constexpr int kEarlyFillThreads = kBagEarlyFillThreads;

// CUB's sm_90 tuning for 4-byte keys, values and offsets, with kWideDigitBits digits
// (its 384 threads, 16 keys a thread: 12 or 23 keys a thread, or 256 threads, are no faster).
struct WideDigitPolicy
    : cub::ChainedPolicy<900, WideDigitPolicy, WideDigitPolicy>,
      cub::detail::radix::policy_hub<uint32_t, uint32_t, uint32_t>::OnesweepSmallKeyTunedPolicy<
          cub::detail::radix::sm90_small_key_tuning<4, 4, 4>> {
  static constexpr int ONESWEEP_RADIX_BITS = kWideDigitBits;
  using HistogramPolicy = cub::AgentRadixSortHistogramPolicy<128, 16, 1, uint32_t, kWideDigitBits>;
  using ExclusiveSumPolicy = cub::AgentRadixSortExclusiveSumPolicy<256, kWideDigitBits>;
  using OnesweepPolicy =
      cub::AgentRadixSortOnesweepPolicy<384, 16, uint32_t, 1, cub::RADIX_RANK_MATCH_EARLY_COUNTS_ANY,
                                        cub::BLOCK_SCAN_RAKING_MEMOIZE, cub::RADIX_SORT_STORE_DIRECT,
                                        kWideDigitBits>;
};
struct WideDigitPolicyHub {
  using MaxPolicy = WideDigitPolicy;
};

// With temp == nullptr: sets bytes to the temporary storage the sort needs.
void sort_rows(void* temp, size_t& bytes, cub::DoubleBuffer<uint32_t>& keys, cub::DoubleBuffer<uint32_t>& vals,
               int64_t n, int end_bit, cudaStream_t stream) {
  if (bag_wide_digits(end_bit)) {
    using Sort = cub::DispatchRadixSort<cub::SortOrder::Ascending, uint32_t, uint32_t, uint32_t,
                                        cub::detail::identity_decomposer_t, WideDigitPolicyHub>;
    C10_CUDA_CHECK(Sort::Dispatch(temp, bytes, keys, vals, static_cast<uint32_t>(n), 0, end_bit,
                                  /*is_overwrite_okay=*/true, stream));
  } else {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys, vals, n, 0, end_bit, stream));
  }
}

// CUB's temporary storage for sorting n keys of end_bit bits.
int64_t sort_scratch_bytes(int64_t n, int end_bit) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint32_t> k(nullptr, nullptr), v(nullptr, nullptr);
  sort_rows(nullptr, bytes, k, v, n, end_bit, nullptr);
  return static_cast<int64_t>(bytes);
}

// ---------------------------------------------------------------------------
// Backward: grad_weight[v] = sum over the positions i with indices[i] == v (in
// range, not padding, in a bag), in increasing i, of
//   sum:  w_i * grad[bag_i]               (w_i = per_sample_weights[i] or 1)
//   mean: grad[bag_i] / bag_size[bag_i]
//   max:  grad[bag_i, d] where max_positions[bag_i, d] == i (per column d)
// Steps, no atomics: (1) key_i = indices[i] for used positions, else V; max
// mode also marks, per position, the columns it won (max_won_kernel, on a
// stream of its own beside steps (1)-(3), joined before (4)); (2) stable radix
// sort of (key, i): each row's positions become one run, in position order; (3)
// the end of each row's run in the sorted order, and each sorted position's
// bag; (4) the sorted order is cut into chunks of kChunk positions, each swept
// in order: a run inside one chunk is summed straight into its row of
// grad_weight; a run that crosses a chunk boundary gets its part in each chunk
// summed into a head (chunk's first run) or tail (chunk's last run) partial,
// and every kGroup chunks wholly inside one run are summed again into a group
// partial; (5) the row of each crossing run is tail[first] + (group or head
// partials, in chunk order) + head[last]. Rows with no run are zeroed by a fill
// on a second stream, which starts after step (1) or (3) (early_fill: whichever
// marks the used rows) and runs beside the rest. Every row is written once;
// every summation order is fixed by the sorted data alone, so the result is
// bit-identical run to run.

template <typename IndexT>
__global__ void __launch_bounds__(kThreads)
    make_keys_kernel(const IndexT* __restrict__ indices, const int64_t* __restrict__ offset2bag, int64_t n,
                     int64_t num_weights, int64_t num_bags, int64_t padding_idx, uint32_t* __restrict__ keys,
                     uint32_t* __restrict__ vals, uint8_t* __restrict__ used_rows, uint8_t* __restrict__ clear_rows) {
  if (clear_rows != nullptr) {  // late fill: the used-row map, zeroed here instead of by a memset
    const int64_t vecs = num_weights / 16, stride = int64_t(gridDim.x) * kThreads;
    const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    for (int64_t v = first; v < vecs; v += stride) reinterpret_cast<uint4*>(clear_rows)[v] = make_uint4(0, 0, 0, 0);
    for (int64_t r = vecs * 16 + first; r < num_weights; r += stride) clear_rows[r] = 0;
  }
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t idx = static_cast<int64_t>(indices[i]);
    const int64_t bag = offset2bag[i];
    const bool used = idx >= 0 && idx < num_weights && idx != padding_idx && bag >= 0 && bag < num_bags;
    keys[i] = static_cast<uint32_t>(used ? idx : num_weights);
    vals[i] = static_cast<uint32_t>(i);
    if (used && used_rows != nullptr) used_rows[idx] = 1;  // early fill; every writer stores the same byte
  }
}

// Max mode: bit l of won[i * words + w] is set when position i is the argmax of
// its bag at column d = 32 * w + l, i.e. max_positions[bag, d] == i with
// offset2bag[i] == bag (an entry naming a position outside its bag adds nothing,
// as in the CPU kernel). One warp per (bag, kWonWords words): lane l reads
// column 32 * w + l's argmax of each word, all loads in flight; the lanes that
// name one position find each other (__match_any_sync) and the lowest of them
// stores the word. Only the warp of position i's bag writes i's words, so plain
// stores suffice; the words no warp writes were zeroed before. It runs on a
// stream of its own beside the sort. (Bits set with atomicOr per column would put
// 32 lanes on a few addresses.)
__global__ void __launch_bounds__(kThreads)
    max_won_kernel(const int64_t* __restrict__ max_pos, const int64_t* __restrict__ offset2bag, int64_t num_bags,
                   int64_t dim, int64_t n, int64_t words, uint32_t* __restrict__ won) {
  const int lane = threadIdx.x % 32;
  const int64_t word_groups = ceil_div<int64_t>(words, kWonWords);
  const int64_t total = num_bags * word_groups;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t q = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; q < total; q += warps) {
    const int64_t bag = q / word_groups, w0 = (q - bag * word_groups) * kWonWords;
    int64_t pos[kWonWords];
#pragma unroll
    for (int u = 0; u < kWonWords; ++u) {
      const int64_t d = (w0 + u) * 32 + lane;
      pos[u] = d < dim ? max_pos[bag * dim + d] : -1;
    }
#pragma unroll
    for (int u = 0; u < kWonWords; ++u) {
      if (pos[u] < 0 || pos[u] >= n || offset2bag[pos[u]] != bag) pos[u] = -1;
    }
#pragma unroll
    for (int u = 0; u < kWonWords; ++u) {
      const uint32_t same = __match_any_sync(0xffffffffu, static_cast<unsigned long long>(pos[u]));
      if (pos[u] >= 0 && lane == __ffs(same) - 1) won[pos[u] * words + w0 + u] = same;
    }
  }
}

// run_end[v] = one past the last sorted position of row v, for the rows that
// have a run (read only for those); with a late fill, used_rows[v] = 1 for them
// (set at the run's first position: one store per row; zeroed before);
// sorted_bag[p] = the bag of sorted position p (read only for used positions,
// whose bag is valid).
__global__ void __launch_bounds__(kThreads)
    runs_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ sorted_pos,
                const int64_t* __restrict__ offset2bag, int64_t n, uint32_t num_weights,
                uint32_t* __restrict__ run_end, uint8_t* __restrict__ used_rows, uint32_t* __restrict__ sorted_bag) {
  for (int64_t p = int64_t(blockIdx.x) * kThreads + threadIdx.x; p < n; p += int64_t(gridDim.x) * kThreads) {
    const uint32_t k = keys[p];
    if (used_rows != nullptr && k < num_weights && (p == 0 || keys[p - 1] != k)) used_rows[k] = 1;  // late fill
    if (k < num_weights && (p == n - 1 || keys[p + 1] != k)) run_end[k] = static_cast<uint32_t>(p + 1);
    sorted_bag[p] = k < num_weights ? static_cast<uint32_t>(offset2bag[sorted_pos[p]]) : 0u;
  }
}

// What the sorted positions add to their rows. Per position the sweep stages
// in shared memory its key, bag, position (max mode and per_sample_weights) and
// `aux`: mean, the bag's size; sum, the per-sample weight (or 1). Per V adjacent
// columns a position adds
//   sum:  aux * grad[bag]
//   mean: grad[bag] / aux   (nothing when aux == 0)
//   max:  grad[bag, d] where the position won column d (won bits)
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

  __device__ __forceinline__ bool needs_pos() const { return mode == kModeMax || psw != nullptr; }

  // aux of a used sorted position (see above); max mode does not use it.
  __device__ __forceinline__ AccT aux(uint32_t bag, uint32_t pos) const {
    if (mode == kModeMean) return static_cast<AccT>(bag_size[bag]);
    return psw != nullptr ? static_cast<AccT>(psw[pos]) : AccT(1);
  }

  // Max mode: the columns col .. col + V that a position won (V divides 32, so
  // one word): row `row` of `words`, mask_words words per row (the sweep's
  // staged copy, or won itself).
  __device__ __forceinline__ uint32_t won_columns(const uint32_t* words, int64_t row, int64_t col) const {
    return (words[row * mask_words + col / 32] >> (col % 32)) & ((1u << V) - 1u);
  }

  __device__ __forceinline__ void add(AccT (&acc)[V], const cuda::RawVec<T, V>& g, AccT a, uint32_t bits) const {
    const auto g_at = [&](int k) { return cuda::raw_elem<AccT, T, V>(g, k); };
    if (mode == kModeMax) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if ((bits >> k) & 1u) acc[k] += g_at(k);
      }
    } else if (mode == kModeMean) {
      if (a > AccT(0)) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += g_at(k) / a;
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += a * g_at(k);
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

// p[0 .. V) = acc as Out (a partial sum: Out = AccT; a row of grad_weight: T).
// kStreaming: an evict-first store, for rows of grad_weight that nothing here reads.
template <typename Out, typename AccT, int V, bool kStreaming = false>
__device__ __forceinline__ void store_sums(Out* p, const AccT (&acc)[V]) {
  cuda::Vec<Out, V> v;
#pragma unroll
  for (int k = 0; k < V; ++k) v.v[k] = static_cast<Out>(acc[k]);
  if constexpr (kStreaming) {
    cuda::store_vec_streaming<Out, V>(p, v);
  } else {
    cuda::store_vec<Out, V>(p, v);
  }
}

// Step (4): one team per chunk of kChunk sorted positions, a block's teams on
// consecutive chunks. The block stages its positions (key, bag, position, aux;
// in max mode also their won words when they fit in kBagSweepSmemBytes) in shared
// memory, one pass with every load in flight; then each team sweeps
// its chunk in order, kSweepUnroll grad rows in flight, and at each run boundary
// flushes the run's sum: a run wholly inside the chunk is its row of
// grad_weight; the chunk's first run, when it began in an earlier chunk, goes to
// head[j], its last run, when it goes on into the next chunk, to tail[j] (a run
// over the whole chunk and beyond on both sides: both). Unused positions (key
// num_weights, sorted last) add to nothing. kMax (max mode) is a template
// argument so that the sum and mean sweeps carry none of the won-bit code (with
// it they are slower). Rows of grad_weight are stored evict-first, as the fill's:
// they are not read again by the backward, and leaving L2 to the sort's and the
// sweep's inputs is faster at every benchmark case. Registers: 3 CTAs per SM for
// 4-byte elements (80 registers); 16-bit and float64 elements would spill there, so 2.
template <typename T, typename AccT, int V, bool kMax>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 3 : 2)
    chunk_sweep_kernel(GradSource<T, AccT, V> src, const uint32_t* __restrict__ keys, int64_t n,
                       uint32_t num_weights, int64_t num_chunks, AccT* __restrict__ head, AccT* __restrict__ tail,
                       T* __restrict__ grad_weight, int team, bool stage_won) {
  cuda::start_next_grid();  // group_partials_kernel / crossing_rows_kernel may take free slots now
  extern __shared__ __align__(16) unsigned char sweep_smem[];
  const int chunks = blockDim.x / team;
  const int slots = chunks * static_cast<int>(kChunk);
  auto* s_aux = reinterpret_cast<AccT*>(sweep_smem);
  auto* s_key = reinterpret_cast<uint32_t*>(s_aux + slots);
  uint32_t* s_bag = s_key + slots;
  uint32_t* s_pos = s_bag + slots;
  uint32_t* s_won = kMax && stage_won ? s_pos + slots : nullptr;  // mask_words per slot
  const uint32_t* won_words = s_won != nullptr ? s_won : src.won;  // by slot if staged, else by position
  const int64_t words = src.mask_words;
  const int64_t ps = int64_t(blockIdx.x) * slots;
  const int count = static_cast<int>(std::min<int64_t>(n - ps, slots));
  const bool need_pos = src.needs_pos();
  for (int t = threadIdx.x; t < count; t += blockDim.x) {
    const uint32_t k = keys[ps + t];
    const bool used = k < num_weights;
    const uint32_t bag = used ? src.sorted_bag[ps + t] : 0u;
    const uint32_t pos = used && need_pos ? src.sorted_pos[ps + t] : 0u;
    s_key[t] = k;
    s_bag[t] = bag;
    s_pos[t] = pos;
    s_aux[t] = used && src.mode != kModeMax ? src.aux(bag, pos) : AccT(0);
    if (s_won != nullptr) {
      for (int64_t w = 0; w < words; ++w) s_won[t * words + w] = used ? src.won[int64_t(pos) * words + w] : 0u;
    }
  }
  __syncthreads();
  const int64_t j = int64_t(blockIdx.x) * chunks + threadIdx.x / team;
  if (j >= num_chunks) return;
  const int lane = threadIdx.x % team;
  const int base = (threadIdx.x / team) * static_cast<int>(kChunk);  // the chunk's first slot
  const int64_t cs = j * kChunk;
  const int len = static_cast<int>(n - cs < kChunk ? n - cs : kChunk);
  const bool from_prev = cs > 0 && keys[cs - 1] == s_key[base];
  const bool into_next = cs + len < n && keys[cs + len] == s_key[base + len - 1];
  const int64_t D = src.dim;
  for (int64_t col = int64_t(lane) * V; col < D; col += int64_t(team) * V) {
    AccT acc[V];
    zero(acc);
    int run_begin = 0;
    // Writes the run [run_begin, q) of this chunk; q == len: the chunk's last run.
    const auto flush = [&](int q) {
      const uint32_t k = s_key[base + run_begin];
      if (k >= num_weights) return;
      const bool starts = run_begin > 0 || !from_prev, ends = q < len || !into_next;
      if (starts && ends) {
        store_sums<T, AccT, V, true>(grad_weight + int64_t(k) * D + col, acc);
        return;
      }
      if (!starts) store_sums(head + j * D + col, acc);
      if (!ends) store_sums(tail + j * D + col, acc);
    };
    for (int q0 = 0; q0 < len; q0 += kSweepUnroll) {
      uint32_t bits[kSweepUnroll];
      cuda::RawVec<T, V> g[kSweepUnroll];
#pragma unroll
      for (int u = 0; u < kSweepUnroll; ++u) {
        const int q = q0 + u;
        bits[u] = q < len && s_key[base + q] < num_weights
                  ? (kMax ? src.won_columns(won_words, s_won != nullptr ? base + q : s_pos[base + q], col) : ~0u)
                  : 0u;
      }
#pragma unroll
      for (int u = 0; u < kSweepUnroll; ++u) {
        if (bits[u] != 0) g[u] = cuda::load_raw<T, V>(src.grad + int64_t(s_bag[base + q0 + u]) * D + col);
      }
#pragma unroll
      for (int u = 0; u < kSweepUnroll; ++u) {
        const int q = q0 + u;
        if (q >= len) break;
        if (q > 0 && s_key[base + q] != s_key[base + q - 1]) {
          flush(q);
          zero(acc);
          run_begin = q;
        }
        if (bits[u] != 0) src.add(acc, g[u], s_aux[base + q], bits[u]);
      }
    }
    flush(len);
  }
}

// Step (4b): group[g] = sum of head[j] over the kGroup chunks of group g, in
// order, for groups that lie wholly inside one run that began before them (the
// only groups crossing_rows_kernel reads; a run's first chunk has no head partial).
template <typename AccT, int V>
__global__ void __launch_bounds__(kThreads)
    group_partials_kernel(const uint32_t* __restrict__ keys, int64_t n, uint32_t num_weights, int64_t num_groups,
                          int64_t dim, const AccT* __restrict__ head, AccT* __restrict__ group, int team) {
  cuda::start_next_grid();  // crossing_rows_kernel may take free slots now
  const int lane = threadIdx.x & (team - 1);
  const int64_t gi = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (gi >= num_groups) return;
  const int64_t j0 = gi * kGroup;
  const int64_t ps = j0 * kChunk, pe = std::min<int64_t>(n, (j0 + kGroup) * kChunk);
  const uint32_t k = keys[ps];
  if (k >= num_weights || keys[pe - 1] != k || ps == 0 || keys[ps - 1] != k) return;
  cuda::wait_for_previous_grid();  // the sweep's head partials
  for (int64_t col = int64_t(lane) * V; col < dim; col += int64_t(team) * V) {
    AccT acc[V];
    zero(acc);
    for (int64_t j = j0; j < j0 + kGroup; ++j) add_partial(acc, head + j * dim + col);
    store_sums(group + gi * dim + col, acc);
  }
}

// Step (5), rows of runs that cross a chunk boundary: one team per chunk whose
// last run begins in it and goes on into the next; the row is tail[first chunk]
// + (group or head partials, in chunk order) + head[last chunk].
template <typename AccT, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    crossing_rows_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ run_end, int64_t n,
                         uint32_t num_weights, int64_t num_chunks, int64_t dim, const AccT* __restrict__ head,
                         const AccT* __restrict__ tail, const AccT* __restrict__ group, T* __restrict__ grad_weight,
                         int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t a = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (a >= num_chunks) return;
  const int64_t cs = a * kChunk, ce = std::min<int64_t>(n, cs + kChunk);
  const uint32_t k = keys[ce - 1];
  if (k >= num_weights || ce >= n || keys[ce] != k) return;     // the last run ends in this chunk
  if (cs > 0 && keys[cs] == k && keys[cs - 1] == k) return;     // it began in an earlier chunk
  cuda::wait_for_previous_grid();  // the sweep's (and group_partials_kernel's) partials
  const int64_t last = (int64_t(run_end[k]) - 1) / kChunk;
  for (int64_t col = int64_t(lane) * V; col < dim; col += int64_t(team) * V) {
    AccT acc[V];
    zero(acc);
    add_partial(acc, tail + a * dim + col);
    int64_t j = a + 1;
    while (j < last) {
      if (j % kGroup == 0 && j + kGroup <= last) {
        add_partial(acc, group + (j / kGroup) * dim + col);
        j += kGroup;
      } else {
        add_partial(acc, head + j * dim + col);
        ++j;
      }
    }
    add_partial(acc, head + last * dim + col);
    store_sums(grad_weight + int64_t(k) * dim + col, acc);
  }
}

// Step (5), rows with no run: zeroed, streaming stores. A warp takes 32 rows at
// a time, lane l loading row l's byte of the used-row map (the next 32 rows'
// bytes in flight while it stores); its 32 / team sub-teams of `team` lanes take
// rows r, r + 32 / team, ... It runs on a second stream (a grid-stride loop of
// few CTAs, embedding_bag_backward_config), beside the sort and the sums or the sums only
// (early_fill).
template <typename T, int V>
__global__ void __launch_bounds__(kEarlyFillThreads)
    zero_unused_rows_kernel(const uint8_t* __restrict__ used_rows, int64_t num_weights, int64_t dim,
                            T* __restrict__ grad_weight, int team) {
  const int lane = threadIdx.x % 32, sub = lane / team, tl = lane % team, subs = 32 / team;
  const int64_t groups = ceil_div<int64_t>(num_weights, 32);  // of 32 rows
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  cuda::Vec<T, V> zeros;
#pragma unroll
  for (int k = 0; k < V; ++k) zeros.v[k] = T(0);
  const auto used_byte = [&](int64_t g) -> uint8_t {
    const int64_t v = g * 32 + lane;
    return g < groups && v < num_weights ? used_rows[v] : uint8_t(0);
  };
  int64_t g = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  uint8_t mine = used_byte(g);
  for (; g < groups; g += warps) {
    const uint8_t next = used_byte(g + warps);
    const uint32_t used = __ballot_sync(0xffffffffu, mine != 0);
    for (int r = sub; r < 32; r += subs) {
      const int64_t v = g * 32 + r;
      if (v >= num_weights || ((used >> r) & 1u) != 0) continue;
      for (int64_t col = int64_t(tl) * V; col < dim; col += int64_t(team) * V) {
        cuda::store_vec_streaming<T, V>(grad_weight + v * dim + col, zeros);
      }
    }
    mine = next;
  }
}

// Steps (4) and (5) for the rows with a run, on the current stream. The partial and
// crossing-row kernels launch early (beside the sweep's last CTAs): until they wait
// for the sweep they read only the sorted keys and run ends, written before it
// began. group_partials_kernel's CTAs may end without waiting; crossing_rows_kernel's
// wait still covers the sweep, as griddepcontrol.wait waits for every prerequisite
// grid in flight (tools/pdl_chain_probe.cu checks this ordering on a device).
template <typename T, typename AccT, int V>
void launch_backward_segments(const GradSource<T, AccT, V>& src, const uint32_t* sorted_keys,
                              const uint32_t* run_end, char* ws, int64_t n, int64_t num_weights,
                              const EmbeddingBagLaunchConfig& c, const at::Tensor& grad_weight) {
  const BagBackwardLayout& l = c.layout;
  auto* head = reinterpret_cast<AccT*>(ws + l.head);
  auto* tail = reinterpret_cast<AccT*>(ws + l.tail);
  auto* group = reinterpret_cast<AccT*>(ws + l.group);
  auto* sweep = src.mode == kModeMax ? chunk_sweep_kernel<T, AccT, V, true> : chunk_sweep_kernel<T, AccT, V, false>;
  sweep<<<c.sweep_blocks, c.sweep_threads, c.sweep_smem, c10::cuda::getCurrentCUDAStream()>>>(
      src, sorted_keys, n, static_cast<uint32_t>(num_weights), l.num_chunks, head, tail,
      grad_weight.mutable_data_ptr<T>(), c.team, c.stage_won);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (c.partial_blocks > 0) {
    cuda::launch(group_partials_kernel<AccT, V>,
                 {.grid = dim3(c.partial_blocks), .block = dim3(c.threads), .early = true},
                 sorted_keys, n, static_cast<uint32_t>(num_weights), l.num_groups, src.dim, head, group, c.team);
  }
  cuda::launch(crossing_rows_kernel<AccT, T, V>,
               {.grid = dim3(c.crossing_blocks), .block = dim3(c.threads), .early = true},
               sorted_keys, run_end, n, static_cast<uint32_t>(num_weights), l.num_chunks, src.dim,
               static_cast<const AccT*>(head), static_cast<const AccT*>(tail), static_cast<const AccT*>(group),
               grad_weight.mutable_data_ptr<T>(), c.team);
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
  check_embedding_bag_backward_overlap(grad_in, indices_in, offset2bag_in, bag_size_in, max_positions_in,
                                       per_sample_weights, grad_weight);
  if (grad_weight.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(grad_in.device());
  cuda::check_device_arch(op);
  const EmbeddingBagProblem problem{num_weights, D, N, B, mode, per_sample_weights.has_value()};
  if (bag_backward_is_trivial(problem)) {
    grad_weight.zero_();
    return;
  }
  const auto c = embedding_bag_backward_config(problem, grad_in.scalar_type(), cuda::device_facts(),
                                               sort_scratch_bytes(N, bag_sort_key_bits(num_weights)));
  const BagBackwardLayout& l = c.layout;
  check_workspace(op, workspace, l.total, 256, grad_in.device(),
                  {{"grad", grad_in}, {"indices", indices_in}, {"offset2bag", offset2bag_in}, {"bag_size", bag_size_in},
                   {"max_positions", max_positions_in}, {"per_sample_weights", if_present(per_sample_weights)},
                   {"grad_weight", grad_weight}});
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
  auto* used_rows = reinterpret_cast<uint8_t*>(ws + l.used);
  auto* won = reinterpret_cast<uint32_t*>(ws + l.mask);
  const bool early = c.early_fill;

  // Max mode: the won columns, on a stream of their own beside the keys and the sort.
  std::optional<cuda::SideStream> won_side;
  if (mode == kModeMax) {
    won_side.emplace(stream);
    C10_CUDA_CHECK(cudaMemsetAsync(won, 0, N * l.mask_words * sizeof(uint32_t), won_side->stream()));
    max_won_kernel<<<c.won_blocks, c.threads, 0, won_side->stream()>>>(max_positions.const_data_ptr<int64_t>(),
                                           offset2bag.const_data_ptr<int64_t>(), B, D, N, l.mask_words, won);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (early) C10_CUDA_CHECK(cudaMemsetAsync(used_rows, 0, num_weights, stream));  // else make_keys_kernel zeroes it
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_backward_keys", [&] {
    make_keys_kernel<index_t><<<c.grid_stride_blocks, c.threads, 0, stream>>>(
        indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(), N, num_weights, B, padding_idx,
        keys[0], vals[0], early ? used_rows : nullptr, early ? nullptr : used_rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  // Once the rows with no run are marked, a second stream zeroes them beside this
  // one's work; this stream waits for it before the op returns.
  std::optional<cuda::SideStream> side;
  const auto start_fill = [&] {
    side.emplace(stream);
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_backward_zero_rows", [&] {
      constexpr int kV = 16 / sizeof(scalar_t);
      auto* kernel = c.vec == kV ? zero_unused_rows_kernel<scalar_t, kV> : zero_unused_rows_kernel<scalar_t, 1>;
      kernel<<<c.fill_blocks, c.fill_threads, 0, side->stream()>>>(used_rows, num_weights, D,
                                                                grad_weight.mutable_data_ptr<scalar_t>(), c.fill_team);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  };
  if (early) start_fill();
  cub::DoubleBuffer<uint32_t> sort_keys(keys[0], keys[1]), sort_vals(vals[0], vals[1]);
  size_t cub_bytes = l.cub_bytes;
  sort_rows(ws + l.cub, cub_bytes, sort_keys, sort_vals, N, l.end_bit, stream);
  uint32_t* const sorted_bag = sort_keys.Alternate();  // the spare key buffer
  runs_kernel<<<c.grid_stride_blocks, c.threads, 0, stream>>>(sort_keys.Current(), sort_vals.Current(),
                                                             offset2bag.const_data_ptr<int64_t>(), N,
                                                             static_cast<uint32_t>(num_weights), run_end,
                                                             early ? nullptr : used_rows,
                                                             sorted_bag);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!early) start_fill();
  if (won_side) won_side->join();

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
      launch_backward_segments<scalar_t, acc_t, kV>(src, sort_keys.Current(), run_end, ws, N, num_weights, c,
                                                    grad_weight);
    };
    if (c.vec == 16 / int(sizeof(scalar_t))) {
      run(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
    } else {
      run(std::integral_constant<int, 1>{});
    }
  });
  side->join();
}

int64_t backward_workspace_bytes(const EmbeddingBagProblem& p, c10::ScalarType dtype) {
  if (bag_backward_is_trivial(p)) return 0;
  const int64_t scratch = sort_scratch_bytes(p.num_indices, bag_sort_key_bits(p.num_weights));
  return embedding_bag_backward_config(p, dtype, cuda::device_facts(), scratch).workspace_bytes;
}

// The Plan's variant: the launch config, described; the workspace with CUB's sort scratch.
KernelChoice embedding_bag_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto p = embedding_bag_problem(kEmbeddingBagBackwardOp, problem);
  const int64_t scratch =
      bag_backward_is_trivial(p) ? 0 : sort_scratch_bytes(p.num_indices, bag_sort_key_bits(p.num_weights));
  const auto v = embedding_bag_view(embedding_bag_backward_config(p, dtype, cuda::device_facts(), scratch));
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("embedding_bag_backward", c10::DeviceType::CUDA, embedding_bag_backward_choice);

}  // namespace

at::Tensor embedding_bag_backward_cuda(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                       const at::Tensor& bag_size, const at::Tensor& max_positions,
                                       int64_t num_weights, int64_t mode,
                                       const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  check_embedding_bag_backward(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                               per_sample_weights, padding_idx);
  int64_t need = 0;
  {
    const c10::cuda::CUDAGuard guard(grad.device());
    need = backward_workspace_bytes(
        {num_weights, grad.size(1), indices.numel(), grad.size(0), mode, per_sample_weights.has_value()},
        grad.scalar_type());
  }
  const auto workspace = at::empty({need}, grad.options().dtype(at::kByte));
  auto grad_weight = at::empty({num_weights, grad.size(1)}, grad.options());
  embedding_bag_backward_out_cuda(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                                  per_sample_weights, padding_idx, grad_weight, workspace);
  return grad_weight;
}

}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("embedding_bag_backward", &baracuda::embedding_bag_backward_cuda);
  m.impl("embedding_bag_backward.out", &baracuda::embedding_bag_backward_out_cuda);
}
