// rms_norm family, CPU kernels.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/rms_norm.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// Rows per dW chunk: the row range is cut into at most kMaxChunks chunks, a
// function of M alone, so dW is the same whatever the thread count.
constexpr int64_t kMaxChunks = 64;

// sum_i a_i * b_i, vectorized, in a fixed order.
template <typename acc_t>
acc_t dot(const acc_t* a, const acc_t* b, int64_t N) {
  return cpu::lane_sum<acc_t>(N, [a, b](int64_t i) { return a[i] * b[i]; });
}

// The weight as acc_t, or ones without one (multiplying by 1 is exact, so the
// results equal the weightless formulas).
template <typename acc_t, typename W>
std::vector<acc_t> weight_as_acc(const W* w, int64_t N) {
  std::vector<acc_t> out(N, acc_t(1));
  if (w != nullptr) {
    for (int64_t j = 0; j < N; ++j) out[j] = static_cast<acc_t>(w[j]);
  }
  return out;
}

// ss = sum_i x_i^2 ; rstd = 1 / sqrt(ss / N + eps) ; y_i = x_i * rstd * w_i.
template <typename T, typename W, typename acc_t>
void forward_rows(const T* x, const W* w, T* y, acc_t* rstd, int64_t M, int64_t N, acc_t eps) {
  const std::vector<acc_t> wa = weight_as_acc<acc_t>(w, N);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(N, 1));
  at::parallel_for(0, M, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> x_buf;
    cpu::run_vectorized<cpu::VectorIsa::kAvx2>([&](auto) {
      for (int64_t row = begin; row < end; ++row) {
        const acc_t* xa = cpu::row_as_acc<acc_t>(x + row * N, N, x_buf);
        T* yr = y + row * N;
        const acc_t r = acc_t(1) / std::sqrt(dot(xa, xa, N) / static_cast<acc_t>(N) + eps);
        rstd[row] = r;
        for (int64_t j = 0; j < N; ++j) yr[j] = static_cast<T>(xa[j] * r * wa[j]);
      }
    });
  });
}

// Per row, with g_i = dy_i * w_i and s = sum_i g_i * x_i:
//   dx_i = rstd * g_i - x_i * rstd^3 * s / N
// and dw_j = sum_rows dy_j * x_j * rstd: each chunk of rows sums into its own
// partial row (rows in order), then the partials are added in chunk order. Chunks of
// one row (M <= kMaxChunks) keep no partial rows: the last pass adds the rows' own
// products, the same terms in the same order, reading dy and x again rather than
// writing and reading a partial row per row.
template <typename T, typename W, typename acc_t>
void backward_rows(const T* dy, const T* x, const acc_t* rstd, const W* w, T* dx, W* dw, int64_t M, int64_t N) {
  const std::vector<acc_t> wa = weight_as_acc<acc_t>(w, N);
  const int64_t chunks = std::min(M, kMaxChunks);
  const int64_t rows_per_chunk = (M + chunks - 1) / chunks;
  const int64_t filled = (M + rows_per_chunk - 1) / rows_per_chunk;  // chunks that hold rows
  const bool partial_rows = dw != nullptr && rows_per_chunk > 1;
  std::unique_ptr<acc_t[]> partials(partial_rows ? new acc_t[filled * N] : nullptr);  // each row written first
  at::parallel_for(0, chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    std::vector<acc_t> dy_buf, x_buf, g_buf(dx != nullptr ? N : 0);
    cpu::run_vectorized<cpu::VectorIsa::kAvx2>([&](auto vector_bytes) {
      constexpr int kBytes = decltype(vector_bytes)::value;
      for (int64_t c = c_begin; c < c_end; ++c) {
        acc_t* part = partial_rows ? partials.get() + c * N : nullptr;
        const int64_t row_begin = c * rows_per_chunk, row_end = std::min(M, (c + 1) * rows_per_chunk);
        for (int64_t row = row_begin; row < row_end; ++row) {
          const acc_t* dya = cpu::row_as_acc<acc_t>(dy + row * N, N, dy_buf);
          const acc_t* xa = cpu::row_as_acc<acc_t>(x + row * N, N, x_buf);
          const acc_t r = rstd[row];
          if (dx != nullptr) {
            acc_t* g = g_buf.data();
            for (int64_t j = 0; j < N; ++j) g[j] = dya[j] * wa[j];
            const acc_t k = r * r * r * dot(g, xa, N) / static_cast<acc_t>(N);
            T* dxr = dx + row * N;
            if constexpr (std::is_same_v<T, acc_t>) {
              for (int64_t j = 0; j < N; ++j) dxr[j] = r * g[j] - xa[j] * k;
            } else {  // 16-bit rows rounded in vectors
              for (int64_t j = 0; j < N; ++j) g[j] = r * g[j] - xa[j] * k;
              cpu::store_from_acc<kBytes>(dxr, g, N);
            }
          }
          if (part == nullptr) continue;
          if (row == row_begin) {  // 0 + p, but for the sign of a zero, which the sum below drops
            for (int64_t j = 0; j < N; ++j) part[j] = dya[j] * xa[j] * r;
          } else {
            for (int64_t j = 0; j < N; ++j) part[j] += dya[j] * xa[j] * r;
          }
        }
      }
    });
  });
  if (dw == nullptr) return;
  constexpr int64_t kCols = 1024;
  at::parallel_for(0, N, kCols, [&](int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    std::vector<acc_t> s(n, acc_t(0)), dy_buf, x_buf;
    cpu::run_vectorized<cpu::VectorIsa::kAvx2>([&](auto) {
      for (int64_t c = 0; c < filled; ++c) {
        if (partial_rows) {
          const acc_t* p = partials.get() + c * N + begin;
          for (int64_t j = 0; j < n; ++j) s[j] += p[j];
        } else {  // chunk c is row c
          const acc_t* dya = cpu::row_as_acc<acc_t>(dy + c * N + begin, n, dy_buf);
          const acc_t* xa = cpu::row_as_acc<acc_t>(x + c * N + begin, n, x_buf);
          const acc_t r = rstd[c];
          for (int64_t j = 0; j < n; ++j) s[j] += dya[j] * xa[j] * r;
        }
      }
      for (int64_t j = begin; j < end; ++j) dw[j] = static_cast<W>(s[j - begin]);
    });
  });
}

void check_contiguous_out(const char* op, const char* name, const at::Tensor& t) {
  BARACUDA_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void rms_norm_out_cpu(const at::Tensor& input, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight, std::optional<double> eps, const at::Tensor& output,
                      const at::Tensor& rstd) {
  const auto rows = check_rms_norm(input, normalized_shape, weight);
  check_out(kRmsNormOp, "output", output, input.sizes(), input.scalar_type(), input.device());
  check_out(kRmsNormOp, "rstd", rstd, rms_rstd_shape(input.sizes(), normalized_shape.size()),
            rms_acc_dtype(input.scalar_type()), input.device());
  check_contiguous_out(kRmsNormOp, "output", output);
  check_contiguous_out(kRmsNormOp, "rstd", rstd);
  check_rms_norm_out_overlap(input, weight, output, rstd);
  if (rows.M == 0) return;
  const auto x = input.contiguous();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_cpu", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      forward_rows<scalar_t, W, acc_t>(x.const_data_ptr<scalar_t>(), w.defined() ? w.const_data_ptr<W>() : nullptr,
                                       output.mutable_data_ptr<scalar_t>(), rstd.mutable_data_ptr<acc_t>(), rows.M,
                                       rows.N, static_cast<acc_t>(e));
    });
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  check_rms_norm(input, normalized_shape, weight);
  auto output = at::empty(input.sizes(), input.options());
  auto rstd = at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                        input.options().dtype(rms_acc_dtype(input.scalar_type())));
  rms_norm_out_cpu(input, normalized_shape, weight, eps, output, rstd);
  return {output, rstd};
}

void rms_norm_backward_out_cpu(const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                               std::array<bool, 2> output_mask, const at::Tensor& grad_input,
                               const at::Tensor& grad_weight, const at::Tensor& workspace) {
  const char* op = kRmsNormBackwardOp;
  const auto rows = check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);
  const bool want_dx = output_mask[0];
  const bool want_dw = output_mask[1] && has_tensor(weight);
  if (want_dx) {
    check_out(op, "grad_input", grad_input, input.sizes(), input.scalar_type(), input.device());
    check_contiguous_out(op, "grad_input", grad_input);
  }
  if (want_dw) {
    check_out(op, "grad_weight", grad_weight, normalized_shape, weight->scalar_type(), input.device());
    check_contiguous_out(op, "grad_weight", grad_weight);
  }
  check_rms_norm_backward_overlap(grad_out, input, rstd, weight, if_used(want_dx, grad_input),
                                  if_used(want_dw, grad_weight), at::Tensor());
  (void)workspace;  // the CPU kernel keeps its few partial rows itself
  if (rows.N == 0 || (!want_dx && !want_dw)) return;
  if (rows.M == 0) {
    if (want_dw) grad_weight.zero_();
    return;
  }
  const auto dy = grad_out.contiguous();
  const auto x = input.contiguous();
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_backward_cpu", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      backward_rows<scalar_t, W, acc_t>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                        r.const_data_ptr<acc_t>(), w.defined() ? w.const_data_ptr<W>() : nullptr,
                                        want_dx ? grad_input.mutable_data_ptr<scalar_t>() : nullptr,
                                        want_dw ? grad_weight.mutable_data_ptr<W>() : nullptr, rows.M, rows.N);
    });
  });
}

// Outputs that output_mask leaves out (and grad_weight without a weight) are
// undefined tensors (None in Python), as aten::_fused_rms_norm_backward returns.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_out, const at::Tensor& input,
                                                         at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                         const std::optional<at::Tensor>& weight,
                                                         std::array<bool, 2> output_mask) {
  check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);
  at::Tensor grad_input, grad_weight;
  if (output_mask[0]) grad_input = at::empty(input.sizes(), input.options());
  if (output_mask[1] && has_tensor(weight)) grad_weight = at::empty(normalized_shape, weight->options());
  const auto none = at::empty({0}, input.options());
  rms_norm_backward_out_cpu(grad_out, input, normalized_shape, rstd, weight, output_mask,
                            grad_input.defined() ? grad_input : none, grad_weight.defined() ? grad_weight : none,
                            at::empty({0}, input.options().dtype(at::kByte)));
  return {grad_input, grad_weight};
}

// problem = [M, N] (forward), [M, N, grad_weight's element size or 0: no dW] (backward)
KernelChoice rms_norm_choice(c10::IntArrayRef, c10::ScalarType) { return {"cpu_rows", 0}; }
KernelChoice rms_norm_backward_choice(c10::IntArrayRef, c10::ScalarType) { return {"cpu_rows+chunked_dw", 0}; }

BARACUDA_REGISTER_VARIANT("rms_norm", c10::DeviceType::CPU, rms_norm_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_backward", c10::DeviceType::CPU, rms_norm_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("rms_norm", &baracuda::rms_norm_cpu);
  m.impl("rms_norm.out", &baracuda::rms_norm_out_cpu);
  m.impl("rms_norm_backward", &baracuda::rms_norm_backward_cpu);
  m.impl("rms_norm_backward.out", &baracuda::rms_norm_backward_out_cpu);
}
