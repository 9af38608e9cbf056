// embedding_bag family, CPU kernels. Bad index and offset values raise
// (IndexError / ValueError) before any output reaches the caller: before anything
// is written where the caller gave the outputs, else (sum and mean) from the sum's
// loop, which skips and flags an index out of range (see forward_cpu).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/embedding_bag.h"
#include "baracuda/embedding_bag_options.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// Every index is in range when none, read as unsigned (a negative index wraps
// above any num_weights), reaches num_weights: a test of all indices with no
// branch and no chain longer than an OR (a running max chains a compare and a
// blend per vector), vectorized for the CPU's widest ISA (cpu::run_vectorized);
// the first bad index is looked for only when there is one.
template <typename index_t>
void check_index_values(const char* op, const index_t* idx, int64_t n, int64_t num_weights) {
  bool bad = false;
  cpu::run_vectorized([&](auto) {
    const uint64_t limit = static_cast<uint64_t>(num_weights);
    uint64_t out_of_range = 0;
    for (int64_t i = 0; i < n; ++i) out_of_range |= static_cast<uint64_t>(static_cast<int64_t>(idx[i])) >= limit;
    bad = out_of_range != 0;
  });
  if (!bad) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    BARACUDA_CHECK_INDEX(v >= 0 && v < num_weights, op, ": indices[", i, "] = ", v, " is out of range for ",
                      num_weights, " embeddings (expected 0 <= index < ", num_weights, ")");
  }
}

template <typename index_t>
void check_offset_values(const index_t* off, int64_t num_offsets, int64_t num_indices) {
  const char* op = kEmbeddingBagOp;
  for (int64_t b = 0; b < num_offsets; ++b) {
    const int64_t o = static_cast<int64_t>(off[b]);
    if (b == 0) {
      BARACUDA_CHECK_VALUE(o == 0, op, ": offsets[0] must be 0, got ", o);
    } else {
      BARACUDA_CHECK_VALUE(o >= static_cast<int64_t>(off[b - 1]), op, ": offsets must be non-decreasing, got offsets[",
                        b, "] = ", o, " after offsets[", b - 1, "] = ", static_cast<int64_t>(off[b - 1]));
    }
    BARACUDA_CHECK_VALUE(o <= num_indices, op, ": offsets[", b, "] = ", o, " is past the end of indices (", num_indices,
                      " indices)");
  }
}

void check_bag_values(const char* op, const int64_t* offset2bag, int64_t n, int64_t num_bags) {
  for (int64_t i = 0; i < n; ++i) {
    BARACUDA_CHECK_VALUE(offset2bag[i] >= -1 && offset2bag[i] < num_bags, op, ": offset2bag[", i, "] = ", offset2bag[i],
                      " is not a bag (expected -1 <= bag < ", num_bags, ")");
  }
}

// Rows gathered by index miss the caches: while the forward reads the row of
// entry i it asks for the row of entry i + kPrefetchAhead (across bags), one
// prefetch per 64-byte line. Issued one row per entry, between the row's work,
// the requests spread over the bag instead of coming as a burst of a whole
// bag's rows, which stalls on the core's queue of outstanding misses. The sum's
// loop, a few instructions per line, looks kSumPrefetchAhead entries on, as
// FBGEMM's kernel does (8 ahead was 2-4% slower, 32 ahead 10% slower on a
// 2.5 MB table).
constexpr int64_t kPrefetchAhead = 32;
constexpr int64_t kSumPrefetchAhead = 16;

// Where the row of an index lies, as an address only: the sum prefetches rows of
// indices it has not checked yet (a prefetch never faults).
template <typename scalar_t>
[[gnu::always_inline]] inline const void* row_address(const scalar_t* weight, int64_t idx, int64_t D, int64_t c0) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(weight + c0) +
                                       static_cast<uint64_t>(idx) * static_cast<uint64_t>(D) * sizeof(scalar_t));
}

template <typename scalar_t, typename index_t>
[[gnu::always_inline]] inline void prefetch_entry(const scalar_t* weight, const index_t* indices, int64_t i,
                                                  int64_t num_indices, int64_t D) {
  if (i + kPrefetchAhead >= num_indices) return;
  const char* p = static_cast<const char*>(row_address(weight, static_cast<int64_t>(indices[i + kPrefetchAhead]), D, 0));
  for (int64_t byte = 0; byte < D * int64_t(sizeof(scalar_t)); byte += 64) __builtin_prefetch(p + byte);
}

// ---------------------------------------------------------------------------
// Forward: one bag per iteration, the bag's entries in position order (see
// embedding_bag.h for the math), accumulated in acc_t. Sum and mean add the
// rows in column blocks held in registers and store each block straight to the
// output; max mode scans the rows after a pass that sets offset2bag and counts
// the entries that are not padding, which sum and mean do inside their passes.
// The loop runs compiled for the CPU's widest vector ISA (cpu::run_vectorized;
// the same bits on every ISA).

// offset2bag[i] = b over the bag's entries [begin, end) (kMark); returns how many are not padding.
template <bool kMark, typename index_t>
[[gnu::always_inline]] inline int64_t mark_bag(const index_t* indices, int64_t padding_idx, int64_t b, int64_t begin,
                                               int64_t end, int64_t* offset2bag) {
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) {
    if constexpr (kMark) offset2bag[i] = b;
    count += static_cast<int64_t>(indices[i]) != padding_idx;
  }
  return count;
}

// A sum or mean bag's inputs: weight [V, D], the N entries' indices and per-sample
// weights (null without them), and where offset2bag goes (null: not written). Mean mode outputs
// T(sum / count), where count > 0 (a mean of no entry is its sum, +0, as the zeros
// PyTorch gives); sum mode T(sum). An entry whose index, read as unsigned, reaches V
// is not read: it sets out_of_range.
template <typename scalar_t, typename index_t>
struct SumRows {
  const scalar_t* weight;
  const index_t* indices;
  const scalar_t* psw;
  int64_t D, N, padding_idx;
  uint64_t V;
  bool mean;
  int64_t* offset2bag;
  std::atomic<bool>* out_of_range;
};

// Columns [c0, c0 + kCols) of bag b over entries [begin, end), added in position
// order, into out[c0 ..]; returns the count of entries that are not padding,
// and sets offset2bag on the way where kMark (each of the bag's passes does: stores
// the adds hide, where a pass of its own cost a loop and its mispredicted exit per
// bag). kPadding: the entries are tested against padding_idx (without it there is
// none). The forward-only op (no gradient wanted) neither marks nor, without padding,
// tests: two of the loop's instructions an entry each. The block is kCols / kPer
// explicit vectors of kPer = kBytes / sizeof(acc_t) columns, held in registers for
// the whole bag and stored to out once (loops over the vectors unrolled: rolled, the
// compiler kept them on the stack and copied them out per bag); each entry prefetches the block's lines
// of the row kSumPrefetchAhead entries on, between its adds, except the input's
// last kSumPrefetchAhead entries, which take a loop of their own without it (a
// bound on the look-ahead in the one loop cost three instructions an entry). Without
// per-sample weights nothing is multiplied (1 * x == x, so the bits are those
// of acc + 1 * x; the multiply took a third of the time).
template <int kCols, int kBytes, bool kWeighted, bool kMark, bool kPadding, typename scalar_t, typename acc_t,
          typename index_t>
[[gnu::always_inline]] inline int64_t sum_columns(const SumRows<scalar_t, index_t>& s, int64_t b, int64_t begin,
                                                  int64_t end, int64_t c0, scalar_t* out) {
  constexpr int kPer = kBytes / int(sizeof(acc_t));
  constexpr int kVecs = kCols / kPer;
  // Locals, not s's fields: the stores to offset2bag could alias those, which
  // were then reloaded for every entry.
  const scalar_t* weight = s.weight;
  const index_t* indices = s.indices;
  const scalar_t* psw = s.psw;
  const int64_t D = s.D, N = s.N, padding_idx = s.padding_idx;
  const uint64_t V = s.V;
  int64_t* offset2bag = s.offset2bag;
  cpu::Vec<acc_t, kPer> a[kVecs];
#pragma GCC unroll 16
  for (int v = 0; v < kVecs; ++v) a[v] = cpu::Vec<acc_t, kPer>{};  // in registers (`= {}` became a memset)
  int64_t count = end - begin;  // less the padding entries
  const auto add_entries = [&](auto prefetch, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      if constexpr (kMark) offset2bag[i] = b;
      const int64_t idx = static_cast<int64_t>(indices[i]);
      if (static_cast<uint64_t>(idx) >= V) {
        s.out_of_range->store(true, std::memory_order_relaxed);
        continue;
      }
      if (kPadding && idx == padding_idx) {
        --count;
        continue;
      }
      const scalar_t* row = weight + idx * D + c0;
      const char* ahead = nullptr;
      if constexpr (decltype(prefetch)::value) {
        ahead = static_cast<const char*>(
            row_address(weight, static_cast<int64_t>(indices[i + kSumPrefetchAhead]), D, c0));
      }
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) {
        if constexpr (decltype(prefetch)::value) {
          if ((v * kPer * int(sizeof(scalar_t))) % 64 == 0) __builtin_prefetch(ahead + v * kPer * sizeof(scalar_t));
        }
        cpu::Vec<acc_t, kPer> x;
        cpu::load_vec<acc_t, kPer>(row + v * kPer, x);
        if constexpr (kWeighted) {
          a[v] += static_cast<acc_t>(psw[i]) * x;
        } else {
          a[v] += x;
        }
      }
    }
  };
  const int64_t split = std::min(std::max(N - kSumPrefetchAhead, begin), end);
  add_entries(std::true_type{}, begin, split);
  add_entries(std::false_type{}, split, end);
  const bool divide = s.mean && count > 0;
#pragma GCC unroll 16
  for (int v = 0; v < kVecs; ++v) {
    if (divide) a[v] /= static_cast<acc_t>(count);
    cpu::store_vec<acc_t, kPer>(a[v], out + c0 + v * kPer);
  }
  return count;
}

// The same for the last columns [c0, D) (fewer than one vector), one at a time.
template <bool kWeighted, bool kMark, typename scalar_t, typename acc_t, typename index_t>
int64_t sum_last_columns(const SumRows<scalar_t, index_t>& s, int64_t b, int64_t begin, int64_t end, int64_t c0,
                         scalar_t* out) {
  int64_t count = 0;
  for (int64_t c = c0; c < s.D; ++c) {
    acc_t a = 0;
    count = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (c == 0) prefetch_entry(s.weight, s.indices, i, s.N, s.D);
      if constexpr (kMark) s.offset2bag[i] = b;
      const int64_t idx = static_cast<int64_t>(s.indices[i]);
      if (static_cast<uint64_t>(idx) >= s.V) {
        s.out_of_range->store(true, std::memory_order_relaxed);
        continue;
      }
      if (idx == s.padding_idx) continue;
      ++count;
      const acc_t x = static_cast<acc_t>(s.weight[idx * s.D + c]);
      if constexpr (kWeighted) {
        a += static_cast<acc_t>(s.psw[i]) * x;
      } else {
        a += x;
      }
    }
    out[c] = static_cast<scalar_t>(s.mean && count > 0 ? a / static_cast<acc_t>(count) : a);
  }
  return count;
}

// All D columns of bag b into out: blocks of 8 vectors (8 registers of sums:
// 1.3-1.6x faster than 4 with AVX2 and AVX-512), then one block each of 4, 2 and
// 1 vectors where the columns left allow, then the last columns. Returns the
// bag's size (rows of no column still set offset2bag and count).
template <int kBytes, bool kWeighted, bool kMark, bool kPadding, typename scalar_t, typename acc_t,
          typename index_t>
[[gnu::always_inline]] inline int64_t sum_bag(const SumRows<scalar_t, index_t>& s, int64_t b, int64_t begin,
                                              int64_t end, scalar_t* out) {
  if (s.D == 0) return mark_bag<kMark>(s.indices, s.padding_idx, b, begin, end, s.offset2bag);
  constexpr int kPer = kBytes / int(sizeof(acc_t));
  int64_t c0 = 0, count = 0;
  const auto block = [&](auto vectors) {
    constexpr int kCols = decltype(vectors)::value * kPer;
    count = sum_columns<kCols, kBytes, kWeighted, kMark, kPadding, scalar_t, acc_t>(s, b, begin, end, c0, out);
    c0 += kCols;
  };
  while (c0 + 8 * kPer <= s.D) block(std::integral_constant<int, 8>{});
  if (c0 + 4 * kPer <= s.D) block(std::integral_constant<int, 4>{});
  if (c0 + 2 * kPer <= s.D) block(std::integral_constant<int, 2>{});
  if (c0 + kPer <= s.D) block(std::integral_constant<int, 1>{});
  if (c0 < s.D) count = sum_last_columns<kWeighted, kMark, scalar_t, acc_t>(s, b, begin, end, c0, out);
  return count;
}

// Max mode: out[d] = the bag's largest row value in column d (the first of equals;
// an empty bag gives zeros), pos[d] = its position: the bag's first row, then each
// later row's values where they are greater. The update is a select, not a branch:
// which rows win a column is data, and a branch on it mispredicts about one time in
// six over a bag of 20 random rows.
template <int kBytes, typename scalar_t, typename acc_t, typename index_t>
[[gnu::always_inline]] inline void max_bag(const scalar_t* weight, const index_t* indices, int64_t D, int64_t N,
                                           int64_t padding_idx, int64_t begin, int64_t end, acc_t* acc,
                                           int64_t* pos, scalar_t* out) {
  int64_t i = begin;
  for (; i < end && static_cast<int64_t>(indices[i]) == padding_idx; ++i) {
  }
  if (i == end) {  // no row: zeros, no position
    std::fill(pos, pos + D, int64_t(-1));
    std::fill(acc, acc + D, acc_t(0));
  } else {
    prefetch_entry(weight, indices, i, N, D);
    const scalar_t* first = weight + static_cast<int64_t>(indices[i]) * D;
    for (int64_t d = 0; d < D; ++d) {
      acc[d] = static_cast<acc_t>(first[d]);
      pos[d] = i;
    }
    for (++i; i < end; ++i) {
      prefetch_entry(weight, indices, i, N, D);
      const int64_t idx = static_cast<int64_t>(indices[i]);
      if (idx == padding_idx) continue;
      const scalar_t* row = weight + idx * D;
      for (int64_t d = 0; d < D; ++d) {
        const acc_t v = static_cast<acc_t>(row[d]);
        const bool greater = v > acc[d];
        acc[d] = greater ? v : acc[d];
        pos[d] = greater ? i : pos[d];
      }
    }
  }
  cpu::store_from_acc<kBytes>(out, acc, D);
}

// Returns whether a sum or mean bag met an index out of range (max mode reads only
// checked indices). offset2bag and bag_size may be null (the forward-only op): not
// written.
template <typename scalar_t, typename acc_t, typename index_t>
bool bag_forward(const scalar_t* weight, const index_t* indices, const index_t* offsets, const scalar_t* psw,
                 const BagGeometry& g, scalar_t* out, int64_t* offset2bag, int64_t* bag_size, int64_t* max_pos) {
  const int64_t D = g.dim;
  // Each bag's pass writes offset2bag over its entries; the bags cover [0, end of
  // the last bag), and the positions after it are in no bag.
  int64_t last_begin, covered = 0;
  bool last_bad;
  if (g.num_bags > 0) {
    bag_range(offsets, g.num_bags - 1, g.num_offsets, g.fixed_len, g.num_indices, last_begin, covered, last_bad);
  }
  if (offset2bag != nullptr) std::fill(offset2bag + covered, offset2bag + g.num_indices, int64_t(-1));
  // The positions in no bag are never summed: their indices are tested here.
  const uint64_t V = static_cast<uint64_t>(g.num_weights);
  bool tail_out_of_range = false;
  for (int64_t i = covered; i < g.num_indices; ++i) {
    tail_out_of_range |= static_cast<uint64_t>(static_cast<int64_t>(indices[i])) >= V;
  }
  std::atomic<bool> out_of_range{tail_out_of_range};
  const SumRows<scalar_t, index_t> rows{
      weight, indices, psw, D, g.num_indices, g.padding_idx, V, g.mode == kModeMean, offset2bag, &out_of_range};
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, D));
  const bool mark = offset2bag != nullptr, padding = g.padding_idx >= 0;
  at::parallel_for(0, g.num_bags, grain, [&](int64_t bag_begin, int64_t bag_end) {
    std::vector<acc_t> acc(g.mode == kModeMax ? D : 0);
    cpu::run_vectorized([&](auto vector_bytes) {
      constexpr int kBytes = decltype(vector_bytes)::value;
      // Each bag's entries [begin, end) to fn(b, begin, end), which returns its size.
      const auto each_bag = [&](auto&& fn) {
        for (int64_t b = bag_begin; b < bag_end; ++b) {
          int64_t begin, end;
          bool bad;
          bag_range(offsets, b, g.num_offsets, g.fixed_len, g.num_indices, begin, end, bad);
          const int64_t size = fn(b, begin, end);
          if (bag_size != nullptr) bag_size[b] = size;
        }
      };
      // Sum and mean: the op marks offset2bag and tests for padding; the forward-only op
      // tests for padding only where there is one.
      const auto sum_bags = [&](auto weighted, auto marks, auto padded) {
        each_bag([&](int64_t b, int64_t begin, int64_t end) {
          return sum_bag<kBytes, decltype(weighted)::value, decltype(marks)::value, decltype(padded)::value, scalar_t,
                         acc_t>(rows, b, begin, end, out + b * D);
        });
      };
      const auto sum_bags_of = [&](auto weighted) {
        if (mark) return sum_bags(weighted, std::true_type{}, std::true_type{});
        if (padding) return sum_bags(weighted, std::false_type{}, std::true_type{});
        sum_bags(weighted, std::false_type{}, std::false_type{});
      };
      if (g.mode == kModeMax) {
        each_bag([&](int64_t b, int64_t begin, int64_t end) {
          // The forward-only op wants neither offset2bag nor the size: no pass over the bag's indices.
          const int64_t size = mark ? mark_bag<true>(indices, g.padding_idx, b, begin, end, offset2bag) : 0;
          max_bag<kBytes>(weight, indices, D, g.num_indices, g.padding_idx, begin, end, acc.data(), max_pos + b * D,
                          out + b * D);
          return size;
        });
      } else if (psw != nullptr) {
        sum_bags_of(std::true_type{});
      } else {
        sum_bags_of(std::false_type{});
      }
    });
  });
  return out_of_range.load(std::memory_order_relaxed);
}

// The forward into output, offset2bag, bag_size and max_positions. An index out of
// range raises IndexError naming the first one, and bad offsets ValueError (an index
// error first). Where the caller gave the outputs (`outputs_shared`), every index is
// checked before anything is written; where they are the op's own until it returns,
// sum and mean check each index in the sum's loop, which flags one out of range
// without reading its row, and the first is looked for after the loop: the same
// error, without a pass over the indices before the sums (4% of the call at
// V = 1e4, D = 64, bags of 20).
void forward_cpu(const BagGeometry& g, const at::Tensor& weight, const at::Tensor& indices_in,
                 const c10::optional<at::Tensor>& offsets_in, const c10::optional<at::Tensor>& per_sample_weights,
                 const at::Tensor& output, const at::Tensor& offset2bag, const at::Tensor& bag_size,
                 const at::Tensor& max_positions, bool outputs_shared) {
  at::Tensor indices = indices_in.contiguous();
  c10::optional<at::Tensor> offsets = offsets_in;
  promote_indices_and_offsets(indices, offsets);
  if (offsets.has_value()) offsets = offsets->contiguous();
  const auto w = weight.contiguous();
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  const bool check_in_loop = !outputs_shared && g.mode != kModeMax && g.dim > 0;
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_cpu", [&] {
    const index_t* idx = indices.const_data_ptr<index_t>();
    const index_t* off = offsets.has_value() ? offsets->const_data_ptr<index_t>() : nullptr;
    if (!check_in_loop) check_index_values(kEmbeddingBagOp, idx, g.num_indices, g.num_weights);
    if (off != nullptr) {
      try {
        check_offset_values(off, g.num_offsets, g.num_indices);
      } catch (const c10::Error&) {
        if (check_in_loop) check_index_values(kEmbeddingBagOp, idx, g.num_indices, g.num_weights);
        throw;
      }
    }
    BARACUDA_DISPATCH_FLOATING(weight.scalar_type(), "embedding_bag_cpu", [&] {
      const bool out_of_range = bag_forward<scalar_t, acc_t, index_t>(
          w.const_data_ptr<scalar_t>(), idx, off, psw.defined() ? psw.const_data_ptr<scalar_t>() : nullptr, g,
          output.mutable_data_ptr<scalar_t>(), offset2bag.defined() ? offset2bag.mutable_data_ptr<int64_t>() : nullptr,
          bag_size.defined() ? bag_size.mutable_data_ptr<int64_t>() : nullptr,
          g.mode == kModeMax ? max_positions.mutable_data_ptr<int64_t>() : nullptr);
      if (out_of_range) check_index_values(kEmbeddingBagOp, idx, g.num_indices, g.num_weights);
    });
  });
}

void embedding_bag_out_cpu(const at::Tensor& weight, const at::Tensor& indices_in,
                           const c10::optional<at::Tensor>& offsets_in, int64_t mode,
                           const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                           int64_t padding_idx, const at::Tensor& output, const at::Tensor& offset2bag,
                           const at::Tensor& bag_size, const at::Tensor& max_positions) {
  const auto g = check_embedding_bag_out(weight, indices_in, offsets_in, mode, per_sample_weights,
                                         include_last_offset, padding_idx, output, offset2bag, bag_size,
                                         max_positions, [](const at::Tensor&) {});
  forward_cpu(g, weight, indices_in, offsets_in, per_sample_weights, output, offset2bag, bag_size, max_positions,
              /*outputs_shared=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_cpu(
    const at::Tensor& weight, const at::Tensor& indices, const c10::optional<at::Tensor>& offsets, int64_t mode,
    const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset, int64_t padding_idx) {
  const auto g = check_embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                     padding_idx);
  auto output = at::empty({g.num_bags, g.dim}, weight.options());
  auto offset2bag = at::empty({g.num_indices}, weight.options().dtype(at::kLong));
  auto bag_size = at::empty({g.num_bags}, weight.options().dtype(at::kLong));
  auto max_positions = at::empty(max_positions_shape(g), weight.options().dtype(at::kLong));
  forward_cpu(g, weight, indices, offsets, per_sample_weights, output, offset2bag, bag_size, max_positions,
              /*outputs_shared=*/false);
  return {output, offset2bag, bag_size, max_positions};
}

// The output alone (embedding_bag_forward_only: no gradient wanted): offset2bag and
// bag_size are not written, and sum and mean bags without a padding index skip the padding
// test, two of the sum loop's instructions an entry; max mode's positions go to scratch.
at::Tensor embedding_bag_forward_only_cpu(const at::Tensor& weight, const at::Tensor& indices,
                                          const c10::optional<at::Tensor>& offsets, int64_t mode,
                                          const c10::optional<at::Tensor>& per_sample_weights,
                                          bool include_last_offset, int64_t padding_idx) {
  const auto g = check_embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                     padding_idx);
  auto output = at::empty({g.num_bags, g.dim}, weight.options());
  const auto max_positions =
      g.mode == kModeMax ? at::empty(max_positions_shape(g), weight.options().dtype(at::kLong)) : at::Tensor();
  forward_cpu(g, weight, indices, offsets, per_sample_weights, output, at::Tensor(), at::Tensor(), max_positions,
              /*outputs_shared=*/false);
  return output;
}

// ---------------------------------------------------------------------------
// Backward: grad_weight[v] = sum over the positions i with indices[i] == v (not
// padding, in a bag), in increasing i, of
//   sum:  w_i * grad[bag_i]            (w_i = per_sample_weights[i] or 1)
//   mean: grad[bag_i] / bag_size[bag_i]
//   max:  grad[bag_i, d] where max_positions[bag_i, d] == i (per column d)
// Positions are grouped by row with a stable counting sort (workspace: V + 1
// row ends and N positions, int64), then each row is summed by one thread, in
// a loop compiled for the CPU's widest vector ISA (cpu::run_vectorized).

// 0 when grad_weight is empty (nothing to write).
int64_t backward_workspace_bytes(int64_t num_weights, int64_t dim, int64_t num_indices) {
  if (num_weights == 0 || dim == 0) return 0;
  const char* op = kEmbeddingBagBackwardOp;
  const int64_t words = checked_add(op, "the workspace size", checked_add(op, "the workspace size", num_weights, 1),
                                    num_indices);
  return checked_mul(op, "the workspace size in bytes", words, static_cast<int64_t>(sizeof(int64_t)));
}

// Whether the positions' bags never decrease (so for every offset2bag the forward returns).
bool bags_ascend(const int64_t* offset2bag, int64_t n) {
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (offset2bag[i] < 0) continue;
    if (offset2bag[i] < last) return false;
    last = offset2bag[i];
  }
  return true;
}

// Max mode where grad_weight's type is acc_t (float32, float64) and the bags ascend: each bag
// adds its column d's gradient to the row of the position that won column d. Ascending bags
// cover ascending positions, so adding the bags in order into grad_weight (zeroed) gives the
// in-order sum above, bit for bit, in one pass over the B x D winners (the rows' loop checks D
// columns per position). Parallel over columns, each thread adding every bag in order.
template <typename scalar_t, typename index_t>
void max_backward_by_bag(const scalar_t* grad, const index_t* indices, const int64_t* offset2bag,
                         const int64_t* max_pos, int64_t padding_idx, int64_t V, int64_t D, int64_t B,
                         scalar_t* grad_weight) {
  at::parallel_for(0, V, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, D)), [&](int64_t v0, int64_t v1) {
    std::fill(grad_weight + v0 * D, grad_weight + v1 * D, scalar_t(0));
  });
  at::parallel_for(0, D, 16, [&](int64_t d0, int64_t d1) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t* mp = max_pos + b * D;
      const scalar_t* gb = grad + b * D;
      for (int64_t d = d0; d < d1; ++d) {
        const int64_t i = mp[d];
        if (i < 0 || offset2bag[i] != b) continue;  // a position of another bag counts in neither form
        const int64_t v = static_cast<int64_t>(indices[i]);
        if (v != padding_idx) grad_weight[v * D + d] += gb[d];
      }
    }
  });
}

template <typename scalar_t, typename acc_t, typename index_t>
void bag_backward(const scalar_t* grad, const index_t* indices, const int64_t* offset2bag, const int64_t* bag_size,
                  const int64_t* max_pos, const scalar_t* psw, int64_t mode, int64_t padding_idx, int64_t V,
                  int64_t D, int64_t N, int64_t B, scalar_t* grad_weight, int64_t* row_end, int64_t* perm) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (mode == kModeMax && bags_ascend(offset2bag, N)) {
      return max_backward_by_bag(grad, indices, offset2bag, max_pos, padding_idx, V, D, B, grad_weight);
    }
  }
  std::fill(row_end, row_end + V + 1, int64_t(0));
  auto used = [&](int64_t i) { return static_cast<int64_t>(indices[i]) != padding_idx && offset2bag[i] >= 0; };
  for (int64_t i = 0; i < N; ++i) {
    if (used(i)) ++row_end[static_cast<int64_t>(indices[i]) + 1];
  }
  for (int64_t v = 0; v < V; ++v) row_end[v + 1] += row_end[v];
  for (int64_t i = 0; i < N; ++i) {
    if (used(i)) perm[row_end[static_cast<int64_t>(indices[i])]++] = i;
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, D));
  at::parallel_for(0, V, grain, [&](int64_t v_begin, int64_t v_end) {
    std::vector<acc_t> acc(D);
    cpu::run_vectorized([&](auto) {
      for (int64_t v = v_begin; v < v_end; ++v) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t p = v == 0 ? 0 : row_end[v - 1]; p < row_end[v]; ++p) {
          const int64_t i = perm[p];
          const int64_t bag = offset2bag[i];
          const scalar_t* gb = grad + bag * D;
          if (mode == kModeMax) {
            const int64_t* mp = max_pos + bag * D;
            for (int64_t d = 0; d < D; ++d) {
              if (mp[d] == i) acc[d] += static_cast<acc_t>(gb[d]);
            }
          } else if (mode == kModeMean) {
            const acc_t n = static_cast<acc_t>(bag_size[bag]);
            if (bag_size[bag] > 0) {
              for (int64_t d = 0; d < D; ++d) acc[d] += static_cast<acc_t>(gb[d]) / n;
            }
          } else {
            const acc_t coef = psw != nullptr ? static_cast<acc_t>(psw[i]) : acc_t(1);
            for (int64_t d = 0; d < D; ++d) acc[d] += coef * static_cast<acc_t>(gb[d]);
          }
        }
        scalar_t* out = grad_weight + v * D;
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<scalar_t>(acc[d]);
      }
    });
  });
}

void embedding_bag_backward_out_cpu(const at::Tensor& grad, const at::Tensor& indices_in,
                                    const at::Tensor& offset2bag_in, const at::Tensor& bag_size_in,
                                    const at::Tensor& max_positions_in, int64_t num_weights, int64_t mode,
                                    const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx,
                                    const at::Tensor& grad_weight, const at::Tensor& workspace) {
  const char* op = kEmbeddingBagBackwardOp;
  check_embedding_bag_backward(grad, indices_in, offset2bag_in, bag_size_in, max_positions_in, num_weights, mode,
                               per_sample_weights, padding_idx);
  const int64_t D = grad.size(1), N = indices_in.numel(), B = grad.size(0);
  check_out(op, "grad_weight", grad_weight, {num_weights, D}, grad.scalar_type(), grad.device());
  BARACUDA_CHECK_VALUE(grad_weight.is_contiguous(), op, ": grad_weight must be contiguous");
  const int64_t need = backward_workspace_bytes(num_weights, D, N);
  check_embedding_bag_backward_overlap(grad, indices_in, offset2bag_in, bag_size_in, max_positions_in,
                                       per_sample_weights, grad_weight);
  check_workspace(op, workspace, need, alignof(int64_t), grad.device(),
                  {{"grad", grad}, {"indices", indices_in}, {"offset2bag", offset2bag_in}, {"grad_weight", grad_weight}});
  if (grad_weight.numel() == 0) return;
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto bag_size = bag_size_in.contiguous();
  const auto max_positions = max_positions_in.contiguous();
  const auto g = grad.contiguous();
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  check_bag_values(op, offset2bag.const_data_ptr<int64_t>(), N, B);
  if (mode == kModeMax) {
    const int64_t* mp = max_positions.const_data_ptr<int64_t>();
    for (int64_t k = 0; k < B * D; ++k) {
      BARACUDA_CHECK_VALUE(mp[k] >= -1 && mp[k] < N, op, ": max_positions has ", mp[k],
                        ", expected -1 <= position < ", N);
    }
  }
  auto* base = reinterpret_cast<int64_t*>(workspace.mutable_data_ptr());
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_backward_cpu", [&] {
    check_index_values(op, indices.const_data_ptr<index_t>(), N, num_weights);
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_backward_cpu", [&] {
      bag_backward<scalar_t, acc_t, index_t>(
          g.const_data_ptr<scalar_t>(), indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(),
          bag_size.const_data_ptr<int64_t>(), mode == kModeMax ? max_positions.const_data_ptr<int64_t>() : nullptr,
          psw.defined() ? psw.const_data_ptr<scalar_t>() : nullptr, mode, padding_idx, num_weights, D, N, B,
          grad_weight.mutable_data_ptr<scalar_t>(), base, base + num_weights + 1);
    });
  });
}

at::Tensor embedding_bag_backward_cpu(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                      const at::Tensor& bag_size, const at::Tensor& max_positions,
                                      int64_t num_weights, int64_t mode,
                                      const c10::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  check_embedding_bag_backward(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                               per_sample_weights, padding_idx);
  const auto workspace =
      at::empty({backward_workspace_bytes(num_weights, grad.size(1), indices.numel())}, grad.options().dtype(at::kByte));
  auto grad_weight = at::empty({num_weights, grad.size(1)}, grad.options());
  embedding_bag_backward_out_cpu(grad, indices, offset2bag, bag_size, max_positions, num_weights, mode,
                                 per_sample_weights, padding_idx, grad_weight, workspace);
  return grad_weight;
}

// ---------------------------------------------------------------------------
// d per_sample_weights[i] = <grad[bag_i], weight[indices[i]]> (0 for padding
// and positions in no bag), summed over the columns in order in acc_t.

template <typename scalar_t, typename acc_t, typename index_t>
void position_dot(const scalar_t* grad, const scalar_t* weight, const index_t* indices, const int64_t* offset2bag,
                  int64_t padding_idx, int64_t D, int64_t N, scalar_t* out) {
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, D));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t idx = static_cast<int64_t>(indices[i]);
      const int64_t bag = offset2bag[i];
      acc_t acc = 0;
      if (idx != padding_idx && bag >= 0) {
        const scalar_t* gb = grad + bag * D;
        const scalar_t* w = weight + idx * D;
        for (int64_t d = 0; d < D; ++d) acc += static_cast<acc_t>(gb[d]) * static_cast<acc_t>(w[d]);
      }
      out[i] = static_cast<scalar_t>(acc);
    }
  });
}

void per_sample_weights_backward_out_cpu(const at::Tensor& grad, const at::Tensor& weight,
                                         const at::Tensor& indices_in, const at::Tensor& offset2bag_in, int64_t mode,
                                         int64_t padding_idx, const at::Tensor& grad_per_sample_weights) {
  const char* op = kEmbeddingBagPswBackwardOp;
  check_per_sample_weights_backward(grad, weight, indices_in, offset2bag_in, mode, padding_idx);
  check_out(op, "grad_per_sample_weights", grad_per_sample_weights, indices_in.sizes(), weight.scalar_type(),
            weight.device());
  BARACUDA_CHECK_VALUE(grad_per_sample_weights.is_contiguous(), op, ": grad_per_sample_weights must be contiguous");
  check_no_overlap(op, {{"grad_per_sample_weights", grad_per_sample_weights}},
                   {{"grad", grad}, {"weight", weight}, {"indices", indices_in}, {"offset2bag", offset2bag_in}});
  const int64_t N = indices_in.numel();
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto g = grad.contiguous();
  const auto w = weight.contiguous();
  check_bag_values(op, offset2bag.const_data_ptr<int64_t>(), N, grad.size(0));
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_psw_backward_cpu", [&] {
    check_index_values(op, indices.const_data_ptr<index_t>(), N, weight.size(0));
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_psw_backward_cpu", [&] {
      position_dot<scalar_t, acc_t, index_t>(g.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                                             indices.const_data_ptr<index_t>(), offset2bag.const_data_ptr<int64_t>(),
                                             padding_idx, weight.size(1), N,
                                             grad_per_sample_weights.mutable_data_ptr<scalar_t>());
    });
  });
}

at::Tensor per_sample_weights_backward_cpu(const at::Tensor& grad, const at::Tensor& weight,
                                           const at::Tensor& indices, const at::Tensor& offset2bag, int64_t mode,
                                           int64_t padding_idx) {
  check_per_sample_weights_backward(grad, weight, indices, offset2bag, mode, padding_idx);
  auto out = at::empty(indices.sizes(), weight.options());
  per_sample_weights_backward_out_cpu(grad, weight, indices, offset2bag, mode, padding_idx, out);
  return out;
}

// problem = [num_embeddings, embedding_dim, num_indices, num_bags, mode, has_per_sample_weights]
// The variant names carry the vector ISA the loops run with (cpu::run_vectorized).
// ---------------------------------------------------------------------------
// baracuda::embedding_bag_weight_backward: F.embedding_bag's weight gradient options.
//   scale_grad_by_freq: grad_weight[r] = (dense gradient)[r] / count_r, count_r the number of
//     positions with indices[i] == r, in acc_t, rounded once;
//   sparse: COO entries, one per position i in order: row indices[i], value
//     grad[bag_i] * c_i in grad's dtype, c_i = per_sample_weights[i] (sum mode), 1 / bag_size
//     rounded to the dtype (mean mode, as PyTorch rounds it), else 1. A position that takes no
//     gradient (padding, in no bag, an index the CUDA forward flagged) keeps its entry with value
//     0 (row 0 when its index is out of range): N entries, so no count of kept positions (a host
//     sync) sizes the result.

template <typename scalar_t, typename index_t>
void sparse_entries(const scalar_t* grad, const index_t* indices, const int64_t* offset2bag, const int64_t* bag_size,
                    const scalar_t* psw, int64_t mode, int64_t padding_idx, int64_t V, int64_t D, int64_t N,
                    int64_t* rows, scalar_t* values) {
  at::parallel_for(0, N, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, D)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = static_cast<int64_t>(indices[i]), bag = offset2bag[i];
      const bool in_range = row >= 0 && row < V;
      rows[i] = in_range ? row : 0;
      scalar_t* out = values + i * D;
      const bool used = in_range && row != padding_idx && bag >= 0 && (mode != kModeMean || bag_size[bag] > 0);
      if (!used) {
        std::fill(out, out + D, scalar_t(0));
        continue;
      }
      const scalar_t coef = mode == kModeMean ? scalar_t(1) / static_cast<scalar_t>(bag_size[bag])
                                              : (psw != nullptr ? psw[i] : scalar_t(1));
      const scalar_t* g = grad + bag * D;
      for (int64_t d = 0; d < D; ++d) out[d] = g[d] * coef;
    }
  });
}

template <typename scalar_t, typename acc_t, typename index_t>
void divide_by_frequency(const index_t* indices, int64_t N, int64_t V, int64_t D, scalar_t* grad_weight,
                         int64_t* counts) {
  std::fill(counts, counts + V, int64_t(0));
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row >= 0 && row < V) ++counts[row];
  }
  at::parallel_for(0, V, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, D)), [&](int64_t begin, int64_t end) {
    for (int64_t v = begin; v < end; ++v) {
      if (counts[v] <= 1) continue;  // x / 1 == x; rows that never occur are zero
      const acc_t n = static_cast<acc_t>(counts[v]);
      scalar_t* row = grad_weight + v * D;
      for (int64_t d = 0; d < D; ++d) row[d] = static_cast<scalar_t>(static_cast<acc_t>(row[d]) / n);
    }
  });
}

at::Tensor embedding_bag_weight_backward_cpu(const at::Tensor& grad, const at::Tensor& indices_in,
                                             const at::Tensor& offset2bag_in, const at::Tensor& bag_size_in,
                                             const at::Tensor& max_positions, int64_t num_weights, int64_t mode,
                                             const c10::optional<at::Tensor>& per_sample_weights,
                                             int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
  const char* op = kEmbeddingBagWeightBackwardOp;
  check_weight_backward_options(op, mode, scale_grad_by_freq, sparse);
  if (!sparse) {
    at::Tensor grad_weight = embedding_bag_backward_cpu(grad, indices_in, offset2bag_in, bag_size_in, max_positions,
                                                        num_weights, mode, per_sample_weights, padding_idx);
    if (scale_grad_by_freq) {
      const auto indices = indices_in.contiguous();
      auto counts = at::empty({num_weights}, indices.options().dtype(at::kLong));
      AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_weight_backward_cpu", [&] {
        BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_weight_backward_cpu", [&] {
          divide_by_frequency<scalar_t, acc_t, index_t>(indices.const_data_ptr<index_t>(), indices.numel(),
                                                        num_weights, grad.size(1),
                                                        grad_weight.mutable_data_ptr<scalar_t>(),
                                                        counts.mutable_data_ptr<int64_t>());
        });
      });
    }
    return grad_weight;
  }
  check_embedding_bag_backward(grad, indices_in, offset2bag_in, bag_size_in, max_positions, num_weights, mode,
                               per_sample_weights, padding_idx);
  const int64_t D = grad.size(1), N = indices_in.numel(), B = grad.size(0);
  const auto indices = indices_in.contiguous();
  const auto offset2bag = offset2bag_in.contiguous();
  const auto bag_size = bag_size_in.contiguous();
  const auto g = grad.contiguous();
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  check_bag_values(op, offset2bag.const_data_ptr<int64_t>(), N, B);
  auto rows = at::empty({1, N}, indices.options().dtype(at::kLong));
  auto values = at::empty({N, D}, grad.options());
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_weight_backward_cpu", [&] {
    check_index_values(op, indices.const_data_ptr<index_t>(), N, num_weights);
    BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "embedding_bag_weight_backward_cpu", [&] {
      sparse_entries<scalar_t, index_t>(g.const_data_ptr<scalar_t>(), indices.const_data_ptr<index_t>(),
                                        offset2bag.const_data_ptr<int64_t>(), bag_size.const_data_ptr<int64_t>(),
                                        psw.defined() ? psw.const_data_ptr<scalar_t>() : nullptr, mode, padding_idx,
                                        num_weights, D, N, rows.mutable_data_ptr<int64_t>(),
                                        values.mutable_data_ptr<scalar_t>());
    });
  });
  return sparse_gradient(rows, values, num_weights);
}

std::string with_isa(const char* name) { return std::string(name) + "<" + cpu::vector_isa_name(cpu::vector_isa()) + ">"; }

KernelChoice embedding_bag_choice(c10::IntArrayRef, c10::ScalarType) { return {with_isa("cpu_bag_loop"), 0}; }
// Max mode in float32 and float64 adds the bags' winners in bag order (max_backward_by_bag) where
// offset2bag ascends, as the forward's always does; the workspace is sized for the rows' loop.
KernelChoice embedding_bag_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  BARACUDA_CHECK_VALUE(problem.size() == 6 && problem[0] >= 0 && problem[1] >= 0 && problem[2] >= 0, kEmbeddingBagBackwardOp, ": malformed problem ", shape_str(problem));
  const bool by_bag = problem[4] == kModeMax && (dtype == at::kFloat || dtype == at::kDouble);
  return {by_bag ? std::string("cpu_max_winners_by_bag") : with_isa("cpu_counting_sort_rows"),
          backward_workspace_bytes(problem[0], problem[1], problem[2])};
}
KernelChoice per_sample_weights_backward_choice(c10::IntArrayRef, c10::ScalarType) {
  return {"cpu_position_dot", 0};
}

BARACUDA_REGISTER_VARIANT("embedding_bag", c10::DeviceType::CPU, embedding_bag_choice);
BARACUDA_REGISTER_VARIANT("embedding_bag_backward", c10::DeviceType::CPU, embedding_bag_backward_choice);
BARACUDA_REGISTER_VARIANT("embedding_bag_per_sample_weights_backward", c10::DeviceType::CPU,
                          per_sample_weights_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("embedding_bag", &baracuda::embedding_bag_cpu);
  m.impl("embedding_bag.out", &baracuda::embedding_bag_out_cpu);
  m.impl("embedding_bag_forward_only", &baracuda::embedding_bag_forward_only_cpu);
  m.impl("embedding_bag_backward", &baracuda::embedding_bag_backward_cpu);
  m.impl("embedding_bag_backward.out", &baracuda::embedding_bag_backward_out_cpu);
  m.impl("embedding_bag_per_sample_weights_backward", &baracuda::per_sample_weights_backward_cpu);
  m.impl("embedding_bag_per_sample_weights_backward.out", &baracuda::per_sample_weights_backward_out_cpu);
  m.impl("embedding_bag_weight_backward", &baracuda::embedding_bag_weight_backward_cpu);
}
