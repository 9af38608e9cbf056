// repeat family, CPU kernels.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/repeat.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// Output-element offset of collapsed input position (row r of the input viewed
// as [input_numel / s_last, s_last], column 0) in tile 0.
int64_t output_base_of_input_row(const TiledLayout& t, int64_t row) {
  int64_t base = 0;
  int64_t out_stride = t.output_row();
  for (int d = t.ndim - 2; d >= 0; --d) {
    base += (row % t.size[d]) * out_stride;
    row /= t.size[d];
    out_stride *= t.size[d] * t.repeat[d];
  }
  return base;
}

// y[i] = x[i_d mod s_d for each collapsed dim d]. The output is a sequence of
// copies of input runs (s_last contiguous elements, r_last times per output row);
// the work is split into pieces of at most kPiece elements of one run, so even a
// single long row is copied by all threads.
void repeat_copy(const at::Tensor& x, const TiledLayout& t, const at::Tensor& out) {
  constexpr int64_t kPiece = 16384;
  const int64_t elem = x.element_size();
  const int64_t s_last = t.size[t.ndim - 1];
  const int64_t r_last = t.repeat[t.ndim - 1];
  const int64_t pieces = (s_last + kPiece - 1) / kPiece;
  const int64_t units = t.output_numel() / s_last * pieces;  // (output row, tile, piece)
  const auto* src = static_cast<const char*>(x.const_data_ptr());
  auto* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t grain = std::max<int64_t>(1, 32768 / (std::min(s_last, kPiece) * elem));
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t piece = u % pieces, run = u / pieces;
      const int64_t row = run / r_last;
      int64_t rem = row, src_row = 0, in_stride = 1;
      for (int d = t.ndim - 2; d >= 0; --d) {
        const int64_t extent = t.size[d] * t.repeat[d];
        src_row += ((rem % extent) % t.size[d]) * in_stride;
        rem /= extent;
        in_stride *= t.size[d];
      }
      const int64_t first = piece * kPiece, n = std::min(kPiece, s_last - first);
      std::memcpy(dst + (run * s_last + first) * elem, src + (src_row * s_last + first) * elem, n * elem);
    }
  });
}

// dx[c] = sum over tiles k (row-major over the repeat grid) of grad[c + offset(k)],
// accumulated in acc_t in that fixed order. Parallel over input elements, each
// chunk split at input-row boundaries so a row's tiles are contiguous runs,
// added in the CPU's widest vectors (cpu::run_vectorized, cpu::accumulate).
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
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, tiles));
  at::parallel_for(0, t.input_numel(), grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc;
    cpu::run_vectorized([&](auto vector_bytes) {
      constexpr int kBytes = decltype(vector_bytes)::value;
      for (int64_t c = begin; c < end;) {
        const int64_t row = c / s_last, col = c % s_last;
        const int64_t n = std::min(end - c, s_last - col);
        const scalar_t* g = grad + output_base_of_input_row(t, row) + col;
        acc.assign(n, acc_t(0));
        int64_t digit[kMaxTileDims] = {};
        int64_t offset = 0;
        for (int64_t k = 0; k < tiles; ++k) {
          const scalar_t* gk = g + offset;
          cpu::accumulate<kBytes>(acc.data(), gk, n);
          for (int d = t.ndim - 1; d >= 0; --d) {
            offset += step[d];
            if (++digit[d] < t.repeat[d]) break;
            offset -= step[d] * t.repeat[d];
            digit[d] = 0;
          }
        }
        for (int64_t i = 0; i < n; ++i) dx[c + i] = static_cast<scalar_t>(acc[i]);
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
