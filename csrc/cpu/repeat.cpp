// repeat family, CPU kernels.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/repeat.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// Row index over the outer collapsed dims (all but the last) in row-major
// order, dim d of extent size[d] * reps[d], with offset = sum_d (digit_d mod
// size[d]) * stride[d] kept up to date: seek() divides once, next() steps
// without division.
struct RowWalk {
  int ndim = 0;
  int64_t size[kMaxTileDims], reps[kMaxTileDims], stride[kMaxTileDims];
  int64_t pos[kMaxTileDims] = {}, rep[kMaxTileDims] = {};
  int64_t offset = 0;

  void seek(int64_t row) {
    offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t extent = size[d] * reps[d];
      const int64_t digit = row % extent;
      row /= extent;
      pos[d] = digit % size[d];
      rep[d] = digit / size[d];
      offset += pos[d] * stride[d];
    }
  }

  void next() {
    for (int d = ndim - 1; d >= 0; --d) {
      if (++pos[d] < size[d]) {
        offset += stride[d];
        return;
      }
      pos[d] = 0;
      offset -= (size[d] - 1) * stride[d];
      if (++rep[d] < reps[d]) return;
      rep[d] = 0;
    }
  }
};

// y[i] = x[i_d mod s_d for each collapsed dim d]. The output is a sequence of
// copies of input rows (s_last contiguous elements, r_last times per output
// row); the work is split into pieces of at most kPiece elements of one copy,
// so even a single long row is copied by all threads. A thread's pieces are
// consecutive in the output: it finds the input row of its first piece once
// and steps to the next ones without division.
void repeat_copy(const at::Tensor& x, const TiledLayout& t, const at::Tensor& out) {
  constexpr int64_t kPiece = 16384;
  const int64_t elem = x.element_size();
  const int64_t s_last = t.size[t.ndim - 1];
  const int64_t r_last = t.repeat[t.ndim - 1];
  const int64_t pieces = (s_last + kPiece - 1) / kPiece;
  const int64_t units = t.output_numel() / s_last * pieces;  // (output row, tile, piece)
  RowWalk rows;  // output rows -> input row
  rows.ndim = t.ndim - 1;
  for (int64_t d = rows.ndim - 1, in_stride = 1; d >= 0; --d) {
    rows.size[d] = t.size[d];
    rows.reps[d] = t.repeat[d];
    rows.stride[d] = in_stride;
    in_stride *= t.size[d];
  }
  const auto* src = static_cast<const char*>(x.const_data_ptr());
  auto* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t grain = std::max<int64_t>(1, 32768 / (std::min(s_last, kPiece) * elem));
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    RowWalk walk = rows;
    int64_t piece = begin % pieces, tile = begin / pieces % r_last;
    walk.seek(begin / pieces / r_last);
    char* o = dst + ((begin / pieces) * s_last + piece * kPiece) * elem;
    for (int64_t u = begin; u < end; ++u) {
      const int64_t first = piece * kPiece, n = std::min(kPiece, s_last - first);
      std::memcpy(o, src + (walk.offset * s_last + first) * elem, n * elem);
      o += n * elem;
      if (++piece < pieces) continue;
      piece = 0;
      if (++tile < r_last) continue;
      tile = 0;
      walk.next();
    }
  });
}

// dx[c] = sum over tiles k (row-major over the repeat grid) of grad[c + offset(k)],
// accumulated in acc_t in that fixed order. Parallel over input elements, each
// chunk split at input-row boundaries so a row's tiles are contiguous runs. A run
// is summed in column blocks of 8, 4, 2 and 1 vectors of the CPU's widest ISA
// (cpu::run_vectorized), then a half and a quarter vector, each block's sums held in
// registers over all the tiles and stored once (a row of sums in memory took a load
// and a store per vector per tile), then its last columns one at a time.

// Columns [0, kVecs * kPer) of a run at g: their sums over the tiles, into dx.
template <int kVecs, int kBytes, typename scalar_t, typename acc_t, typename ForEachTile>
[[gnu::always_inline]] inline void tile_sum_block(const scalar_t* g, scalar_t* dx, const ForEachTile& for_each_tile) {
  constexpr int kPer = kBytes / int(sizeof(acc_t));
  cpu::Vec<acc_t, kPer> a[kVecs];
  for (int v = 0; v < kVecs; ++v) a[v] = cpu::Vec<acc_t, kPer>{};  // in registers (`= {}` became a memset)
  for_each_tile([&](int64_t offset) {
    for (int v = 0; v < kVecs; ++v) {
      cpu::Vec<acc_t, kPer> x;
      cpu::load_vec<acc_t, kPer>(g + offset + v * kPer, x);
      a[v] += x;
    }
  });
  for (int v = 0; v < kVecs; ++v) cpu::store_vec<acc_t, kPer>(a[v], dx + v * kPer);
}

template <typename scalar_t, typename acc_t>
void repeat_reduce(const scalar_t* grad, const TiledLayout& t, scalar_t* dx) {
  const int64_t s_last = t.size[t.ndim - 1];
  const int64_t tiles = t.tiles();
  // Moving to the next tile in row-major order over the repeat grid adds
  // step[d] = s_d * out_stride_d to the offset for the digit that advances and
  // rewinds the faster digits that wrapped.
  int64_t step[kMaxTileDims];
  int64_t out_stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    step[d] = t.size[d] * out_stride;
    out_stride *= t.size[d] * t.repeat[d];
  }
  // f(offset of tile k) for k = 0 .. tiles - 1, in order.
  const auto walk_tiles = [&](const auto& f) {
    int64_t digit[kMaxTileDims] = {};
    int64_t offset = 0;
    for (int64_t k = 0; k < tiles; ++k) {
      f(offset);
      for (int d = t.ndim - 1; d >= 0; --d) {
        offset += step[d];
        if (++digit[d] < t.repeat[d]) break;
        offset -= step[d] * t.repeat[d];
        digit[d] = 0;
      }
    }
  };
  // Every run and column block visits the same offsets: up to kListedTiles of them are
  // listed once (a walk per block costs more than the adds of a short run); more are
  // walked, so the list never outgrows grad.
  constexpr int64_t kListedTiles = 65536;
  std::vector<int64_t> listed;
  if (tiles <= kListedTiles) {
    listed.reserve(tiles);
    walk_tiles([&](int64_t offset) { listed.push_back(offset); });
  }
  const auto for_each_tile = [&](const auto& f) {
    if (listed.empty()) return walk_tiles(f);
    for (const int64_t offset : listed) f(offset);
  };
  RowWalk rows;  // input rows -> offset of their first element in tile 0 of grad
  rows.ndim = t.ndim - 1;
  for (int64_t d = rows.ndim - 1, stride = t.output_row(); d >= 0; --d) {
    rows.size[d] = t.size[d];
    rows.reps[d] = 1;
    rows.stride[d] = stride;
    stride *= t.size[d] * t.repeat[d];
  }
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, tiles));
  at::parallel_for(0, t.input_numel(), grain, [&](int64_t begin, int64_t end) {
    RowWalk walk = rows;
    walk.seek(begin / s_last);
    cpu::run_vectorized([&](auto vector_bytes) {
      constexpr int kBytes = decltype(vector_bytes)::value;
      constexpr int kPer = kBytes / int(sizeof(acc_t));
      for (int64_t c = begin, col = begin % s_last; c < end; col = 0, walk.next()) {
        const int64_t n = std::min(end - c, s_last - col);
        const scalar_t* g = grad + walk.offset + col;
        int64_t i = 0;
        const auto block = [&](auto vectors) {
          constexpr int kVecs = decltype(vectors)::value;
          tile_sum_block<kVecs, kBytes, scalar_t, acc_t>(g + i, dx + c + i, for_each_tile);
          i += kVecs * kPer;
        };
        while (i + 8 * kPer <= n) block(std::integral_constant<int, 8>{});
        if (i + 4 * kPer <= n) block(std::integral_constant<int, 4>{});
        if (i + 2 * kPer <= n) block(std::integral_constant<int, 2>{});
        if (i + kPer <= n) block(std::integral_constant<int, 1>{});
        // Then a half and a quarter vector (a run of 56 float32 with AVX-512: 48 + 8).
        const auto narrow = [&](auto bytes) {
          constexpr int kNarrowPer = decltype(bytes)::value / int(sizeof(acc_t));
          if constexpr (kNarrowPer >= 2) {
            if (i + kNarrowPer <= n) {
              tile_sum_block<1, decltype(bytes)::value, scalar_t, acc_t>(g + i, dx + c + i, for_each_tile);
              i += kNarrowPer;
            }
          }
        };
        narrow(std::integral_constant<int, kBytes / 2>{});
        narrow(std::integral_constant<int, kBytes / 4>{});
        for (; i < n; ++i) {
          acc_t sum = 0;
          for_each_tile([&](int64_t offset) { sum += static_cast<acc_t>(g[offset + i]); });
          dx[c + i] = static_cast<scalar_t>(sum);
        }
        c += n;
      }
    });
  });
}

void repeat_out_cpu(const at::Tensor& self, at::IntArrayRef repeats, const at::Tensor& out) {
  const auto shape = repeat_output_shape(kRepeatOp, self.sizes(), repeats);
  check_out(kRepeatOp, "out", out, shape, self.scalar_type(), self.device());
  BARACUDA_CHECK_VALUE(out.is_contiguous(), kRepeatOp, ": out must be contiguous");
  check_no_overlap(kRepeatOp, {{"out", out}}, {{"self", self}});
  if (out.numel() == 0) return;
  repeat_copy(self.contiguous(), collapse_tiling(kRepeatOp, self.sizes(), repeats), out);
}

at::Tensor repeat_cpu(const at::Tensor& self, at::IntArrayRef repeats) {
  auto out = at::empty(repeat_output_shape(kRepeatOp, self.sizes(), repeats), self.options());
  repeat_out_cpu(self, repeats, out);
  return out;
}

void repeat_backward_out_cpu(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape,
                             const at::Tensor& grad_input, const at::Tensor& workspace) {
  check_repeat_backward(grad, repeats, input_shape);
  check_out(kRepeatBackwardOp, "grad_input", grad_input, input_shape, grad.scalar_type(), grad.device());
  BARACUDA_CHECK_VALUE(grad_input.is_contiguous(), kRepeatBackwardOp, ": grad_input must be contiguous");
  check_no_overlap(kRepeatBackwardOp, {{"grad_input", grad_input}}, {{"grad", grad}});
  (void)workspace;  // the CPU kernel needs no scratch
  if (grad_input.numel() == 0) return;
  if (grad.numel() == 0) {
    grad_input.zero_();
    return;
  }
  const auto g = grad.contiguous();
  const auto layout = collapse_tiling(kRepeatBackwardOp, input_shape, repeats);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "repeat_backward_cpu", [&] {
    repeat_reduce<scalar_t, acc_t>(g.const_data_ptr<scalar_t>(), layout, grad_input.mutable_data_ptr<scalar_t>());
  });
}

at::Tensor repeat_backward_cpu(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape) {
  check_repeat_backward(grad, repeats, input_shape);
  auto grad_input = at::empty(input_shape, grad.options());
  repeat_backward_out_cpu(grad, repeats, input_shape, grad_input, at::empty({0}, grad.options().dtype(at::kByte)));
  return grad_input;
}

// problem = [input dims, *input_shape, *repeats]
KernelChoice repeat_choice(c10::IntArrayRef, c10::ScalarType) { return {"cpu_row_copy", 0}; }
KernelChoice repeat_backward_choice(c10::IntArrayRef, c10::ScalarType) { return {"cpu_ordered_tile_sum", 0}; }

BARACUDA_REGISTER_VARIANT("repeat", c10::DeviceType::CPU, repeat_choice);
BARACUDA_REGISTER_VARIANT("repeat_backward", c10::DeviceType::CPU, repeat_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("repeat", &baracuda::repeat_cpu);
  m.impl("repeat.out", &baracuda::repeat_out_cpu);
  m.impl("repeat_backward", &baracuda::repeat_backward_cpu);
  m.impl("repeat_backward.out", &baracuda::repeat_backward_out_cpu);
}
