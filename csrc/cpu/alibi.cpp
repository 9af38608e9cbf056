// alibi family, CPU kernels.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "baracuda/alibi.h"
#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// Calls fn(IndexT{}) with the type of the in-row index j: int32_t when K and Q
// fit (its conversions to floating point vectorize; the values are the same).
template <typename Fn>
void with_row_index(const AlibiShape& s, Fn&& fn) {
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  if (s.keys <= kMax32 && s.queries <= kMax32) {
    fn(int32_t{});
  } else {
    fn(int64_t{});
  }
}

// y[row, j] = x[row, j] + slopes[h] * (j - i) over the rows of K elements of the
// contiguous [B, H, Q, K] tensor, row = (b H + h) Q + i. x may equal y (in place).
template <typename scalar_t, typename slope_t, typename acc_t>
void alibi_rows(const scalar_t* x, const slope_t* slopes, scalar_t* y, const AlibiShape& s) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, s.keys));
  with_row_index(s, [&](auto index_tag) {
    using IndexT = decltype(index_tag);
    const auto keys = static_cast<IndexT>(s.keys);
    at::parallel_for(0, s.rows(), grain, [&](int64_t begin, int64_t end) {
      cpu::run_vectorized([&](auto) {
        for (int64_t row = begin; row < end; ++row) {
          const auto i = static_cast<IndexT>(row % s.queries);
          const acc_t m = static_cast<acc_t>(slopes[(row / s.queries) % s.heads]);
          const scalar_t* xr = x + row * s.keys;
          scalar_t* yr = y + row * s.keys;
          for (IndexT j = 0; j < keys; ++j) {
            yr[j] = static_cast<scalar_t>(static_cast<acc_t>(xr[j]) + m * static_cast<acc_t>(j - i));
          }
        }
      });
    });
  });
}

void launch_alibi_rows(const at::Tensor& x, const at::Tensor& slopes, const at::Tensor& y) {
  const auto s = alibi_shape(x);
  const auto sl = slopes.contiguous();
  BARACUDA_DISPATCH_FLOATING(x.scalar_type(), "alibi_cpu", [&] {
    with_slope_type<scalar_t>(sl, [&](auto* tag) {
      using slope_t = std::remove_pointer_t<decltype(tag)>;
      alibi_rows<scalar_t, slope_t, acc_t>(x.const_data_ptr<scalar_t>(), sl.const_data_ptr<slope_t>(),
                                           y.mutable_data_ptr<scalar_t>(), s);
    });
  });
}

void alibi_out_cpu(const at::Tensor& scores, const at::Tensor& slopes, const at::Tensor& out) {
  check_alibi_args(kAlibiOp, "scores", scores, slopes);
  check_out(kAlibiOp, "out", out, scores.sizes(), scores.scalar_type(), scores.device());
  BARACUDA_CHECK_VALUE(out.is_contiguous(), kAlibiOp, ": out must be contiguous");
  check_alibi_out_overlap(scores, slopes, out);
  if (out.numel() == 0) return;
  launch_alibi_rows(scores.contiguous(), slopes, out);
}

at::Tensor alibi_cpu(const at::Tensor& scores, const at::Tensor& slopes) {
  check_alibi_args(kAlibiOp, "scores", scores, slopes);
  auto out = at::empty(scores.sizes(), scores.options().memory_format(at::MemoryFormat::Contiguous));
  alibi_out_cpu(scores, slopes, out);
  return out;
}

// In place on a contiguous tensor; any other layout goes through a contiguous result.
void alibi_inplace_cpu(const at::Tensor& scores, const at::Tensor& slopes) {
  check_alibi_args(kAlibiInplaceOp, "scores", scores, slopes);
  check_no_overlap(kAlibiInplaceOp, {{"scores", scores}}, {{"slopes", slopes}});
  if (scores.numel() == 0) return;
  if (scores.is_contiguous()) {
    launch_alibi_rows(scores, slopes, scores);
  } else {
    scores.copy_(alibi_cpu(scores, slopes));
  }
}

// sum_{j < n} g[j] * (j - i) with the lanes and order of cpu::lane_sum (term j
// added to lane j % kLanes, the lanes combined in order), the lanes held in
// explicit 16-byte vectors: written as lane_sum, the compiler left this loop
// scalar (an int-to-float conversion, a multiply and an add per element). A
// lane's offset is kept as acc_t and stepped by kLanes, which is exact, and so
// the same value as acc_t(j - i), while n and i are at most 2^digits.
template <typename acc_t>
acc_t offset_weighted_sum(const acc_t* g, int64_t n, int64_t i) {
  typedef acc_t Vec __attribute__((vector_size(16)));
  constexpr int kPer = 16 / sizeof(acc_t);        // lanes per vector
  constexpr int kVecs = cpu::kLanes / kPer;       // vectors holding the kLanes lanes
  Vec acc[kVecs] = {}, offset[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    for (int k = 0; k < kPer; ++k) offset[v][k] = static_cast<acc_t>(v * kPer + k) - static_cast<acc_t>(i);
  }
  Vec step;
  for (int k = 0; k < kPer; ++k) step[k] = static_cast<acc_t>(cpu::kLanes);
  const int64_t whole = n - n % cpu::kLanes;
  for (int64_t j = 0; j < whole; j += cpu::kLanes) {
    for (int v = 0; v < kVecs; ++v) {
      Vec gv;
      std::memcpy(&gv, g + j + v * kPer, sizeof(gv));
      acc[v] += gv * offset[v];
      offset[v] += step;
    }
  }
  cpu::Lanes<acc_t> lanes;
  for (int v = 0; v < kVecs; ++v) {
    for (int k = 0; k < kPer; ++k) lanes[v * kPer + k] = acc[v][k];
  }
  for (int64_t j = whole; j < n; ++j) lanes[0] += g[j] * static_cast<acc_t>(j - i);
  return cpu::combine_lanes(lanes);
}

// grad_slopes[h] = sum over b, then i, of row_sum[(b H + h) Q + i], with
// row_sum[row] = sum_j grad[row, j] * (j - i) accumulated in acc_t in the lanes
// of cpu::lane_sum (a fixed order; offset_weighted_sum where its offsets are
// exact). The row sums run in parallel; their order of combination is fixed, so
// the result does not depend on the thread count.
template <typename scalar_t, typename slope_t, typename acc_t>
void alibi_slope_grad(const scalar_t* grad, slope_t* grad_slopes, const AlibiShape& s) {
  std::vector<acc_t> row_sum(s.rows());
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, s.keys));
  const int64_t exact = int64_t(1) << std::numeric_limits<acc_t>::digits;
  const bool vectors = s.keys <= exact && s.queries <= exact;
  with_row_index(s, [&](auto index_tag) {
    using IndexT = decltype(index_tag);
    at::parallel_for(0, s.rows(), grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> g_buf;
      for (int64_t row = begin; row < end; ++row) {
        const auto i = static_cast<IndexT>(row % s.queries);
        const acc_t* g = cpu::row_as_acc<acc_t>(grad + row * s.keys, s.keys, g_buf);
        row_sum[row] = vectors ? offset_weighted_sum<acc_t>(g, s.keys, i)
                               : cpu::lane_sum<acc_t>(static_cast<IndexT>(s.keys), [g, i](IndexT j) {
                                   return g[j] * static_cast<acc_t>(j - i);
                                 });
      }
    });
  });
  for (int64_t h = 0; h < s.heads; ++h) {
    acc_t total = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const acc_t* r = row_sum.data() + (b * s.heads + h) * s.queries;
      for (int64_t i = 0; i < s.queries; ++i) total += r[i];
    }
    grad_slopes[h] = static_cast<slope_t>(total);
  }
}

void alibi_backward_out_cpu(const at::Tensor& grad, const at::Tensor& slopes, std::array<bool, 2> output_mask,
                            const at::Tensor& grad_scores, const at::Tensor& grad_slopes,
                            const at::Tensor& workspace) {
  check_alibi_args(kAlibiBackwardOp, "grad", grad, slopes);
  (void)workspace;  // the CPU kernel needs no caller scratch
  check_alibi_backward_overlap(grad, slopes, output_mask, grad_scores, grad_slopes, at::Tensor());
  if (output_mask[0]) {
    check_out(kAlibiBackwardOp, "grad_scores", grad_scores, grad.sizes(), grad.scalar_type(), grad.device());
  }
  if (output_mask[1]) {
    check_out(kAlibiBackwardOp, "grad_slopes", grad_slopes, slopes.sizes(), slopes.scalar_type(), slopes.device());
    BARACUDA_CHECK_VALUE(grad_slopes.is_contiguous(), kAlibiBackwardOp, ": grad_slopes must be contiguous");
  }
  if (output_mask[0]) grad_scores.copy_(grad);
  if (!output_mask[1] || grad_slopes.numel() == 0) return;
  if (grad.numel() == 0) {
    grad_slopes.zero_();
    return;
  }
  const auto g = grad.contiguous();
  const auto s = alibi_shape(g);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "alibi_backward_cpu", [&] {
    with_slope_type<scalar_t>(slopes, [&](auto* tag) {
      using slope_t = std::remove_pointer_t<decltype(tag)>;
      alibi_slope_grad<scalar_t, slope_t, acc_t>(g.const_data_ptr<scalar_t>(),
                                                 grad_slopes.mutable_data_ptr<slope_t>(), s);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> alibi_backward_cpu(const at::Tensor& grad, const at::Tensor& slopes,
                                                      std::array<bool, 2> output_mask) {
  check_alibi_args(kAlibiBackwardOp, "grad", grad, slopes);
  at::Tensor grad_scores, grad_slopes;
  if (output_mask[0]) grad_scores = at::empty(grad.sizes(), grad.options());
  if (output_mask[1]) grad_slopes = at::empty(slopes.sizes(), slopes.options());
  alibi_backward_out_cpu(grad, slopes, output_mask, grad_scores, grad_slopes,
                         at::empty({0}, grad.options().dtype(at::kByte)));
  return {grad_scores, grad_slopes};
}

// problem = [B, H, Q, K]
KernelChoice alibi_choice(c10::IntArrayRef problem, c10::ScalarType) {
  alibi_shape_of_problem(kAlibiOp, problem);
  return {"cpu_row_bias", 0};
}
KernelChoice alibi_backward_choice(c10::IntArrayRef problem, c10::ScalarType) {
  alibi_shape_of_problem(kAlibiBackwardOp, problem);
  return {"cpu_row_sums_ordered", 0};
}

BARACUDA_REGISTER_VARIANT("alibi", c10::DeviceType::CPU, alibi_choice);
BARACUDA_REGISTER_VARIANT("alibi_backward", c10::DeviceType::CPU, alibi_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("alibi", &baracuda::alibi_cpu);
  m.impl("alibi.out", &baracuda::alibi_out_cpu);
  m.impl("alibi_inplace", &baracuda::alibi_inplace_cpu);
  m.impl("alibi_backward", &baracuda::alibi_backward_cpu);
  m.impl("alibi_backward.out", &baracuda::alibi_backward_out_cpu);
}
