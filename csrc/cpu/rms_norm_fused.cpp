// rms_norm_fused family, CPU kernels (the math: baracuda/rms_norm_fused.h).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/rms_norm_fused.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// dW is summed over chunks of whole weight periods (H rows): at most kMaxChunks,
// a function of the shape alone, so dW is the same whatever the thread count.
constexpr int64_t kMaxChunks = 64;

// wo = w + weight_offset for the H * N weight elements, or empty without a weight.
template <typename acc_t, typename W>
std::vector<acc_t> offset_weight(const W* w, int64_t count, acc_t offset) {
  std::vector<acc_t> out(w != nullptr ? count : 0);
  for (size_t j = 0; j < out.size(); ++j) out[j] = fused_weight<W, acc_t>(w, j, offset);
  return out;
}

template <typename acc_t>
acc_t dot(const acc_t* a, const acc_t* b, int64_t N) {
  return cpu::lane_sum<acc_t>(N, [a, b](int64_t i) { return a[i] * b[i]; });
}

// Per row: h = R(x + r) written to h_out (with a residual; else h = x), rstd = 1 / sqrt(mean(h^2) + eps),
// then emit(row, h as acc_t, rstd, wo's row or nullptr, a scratch row) writes the row's outputs.
template <typename T, typename R, typename W, typename acc_t, typename Emit>
void norm_rows(const T* x, const R* res, const W* w, R* h_out, FusedRows s, acc_t eps, acc_t offset,
               const Emit& emit) {
  const std::vector<acc_t> wo = offset_weight<acc_t>(w, s.H * s.N, offset);
  const int64_t N = s.N;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(N, 1));
  at::parallel_for(0, s.M, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> x_buf, h_buf(res != nullptr ? N : 0), scratch;
    cpu::run_vectorized<cpu::VectorIsa::kAvx2>([&](auto) {
      for (int64_t row = begin; row < end; ++row) {
        const acc_t* ha;
        if (res != nullptr) {
          const T* xr = x + row * N;
          const R* rr = res + row * N;
          R* hr = h_out + row * N;
          for (int64_t j = 0; j < N; ++j) {
            hr[j] = static_cast<R>(static_cast<acc_t>(xr[j]) + static_cast<acc_t>(rr[j]));
            h_buf[j] = static_cast<acc_t>(hr[j]);
          }
          ha = h_buf.data();
        } else {
          ha = cpu::row_as_acc<acc_t>(x + row * N, N, x_buf);
        }
        const acc_t r = acc_t(1) / std::sqrt(dot(ha, ha, N) / static_cast<acc_t>(N) + eps);
        emit(row, ha, r, wo.empty() ? nullptr : wo.data() + (row % s.H) * N, scratch);
      }
    });
  });
}

// y = fused_output(h, rstd, wo), and rstd.
template <typename T, typename R, typename W, typename OutT, typename acc_t>
void forward_rows(const T* x, const R* res, const W* w, OutT* y, R* h_out, acc_t* rstd, FusedRows s, acc_t eps,
                  acc_t offset, bool llama) {
  const int64_t N = s.N;
  norm_rows<T, R, W>(x, res, w, h_out, s, eps, offset,
                     [=](int64_t row, const acc_t* ha, acc_t r, const acc_t* wr, std::vector<acc_t>&) {
                       rstd[row] = r;
                       OutT* yr = y + row * N;
                       for (int64_t j = 0; j < N; ++j) {
                         yr[j] = fused_output<OutT, T>(ha[j], r, wr ? wr[j] : acc_t(1), llama);
                       }
                     });
}

// q = fp8_quantize(y, scale) with y = OutT(fused_output(h, rstd, wo)) and scale = *static_scale, or
// per row fp8_row_scale(max |y|) written to row_scale.
template <typename T, typename R, typename W, typename OutT, typename acc_t>
void quant_rows(const T* x, const R* res, const W* w, c10::Float8_e4m3fn* q, R* h_out, const float* static_scale,
                float* row_scale, FusedRows s, acc_t eps, acc_t offset, bool llama) {
  const int64_t N = s.N;
  norm_rows<T, R, W>(x, res, w, h_out, s, eps, offset,
                     [=](int64_t row, const acc_t* ha, acc_t r, const acc_t* wr, std::vector<acc_t>& y) {
                       y.resize(N);
                       acc_t amax = 0;
                       for (int64_t j = 0; j < N; ++j) {
                         y[j] = static_cast<acc_t>(fused_output<OutT, T>(ha[j], r, wr ? wr[j] : acc_t(1), llama));
                         amax = fp8_amax(amax, y[j]);
                       }
                       float scale;
                       if (static_scale != nullptr) {
                         scale = *static_scale;
                       } else {
                         scale = fp8_row_scale(amax);
                         row_scale[row] = scale;
                       }
                       c10::Float8_e4m3fn* qr = q + row * N;
                       for (int64_t j = 0; j < N; ++j) qr[j] = fp8_quantize(y[j], scale);
                     });
}

// Per row, with g = dy * wo and s = sum(g * h):
//   dh = rstd * g - h * rstd^3 * s / N + dres,  dx = T(dh), dr = R(dh)
// and dw = sum over rows of dy * x_hat, per weight row: each chunk of weight
// periods (H rows) sums into its own partial [H, N] (rows in order), then the
// partials are added in chunk order.
template <typename T, typename R, typename W, typename OutT, typename acc_t>
void backward_rows(const OutT* dy, const R* dres, const R* h, const acc_t* rstd, const W* w, T* dx, R* dr, W* dw,
                   FusedRows s, acc_t offset, bool llama) {
  const int64_t N = s.N, HN = s.H * s.N;
  const std::vector<acc_t> wo = offset_weight<acc_t>(w, HN, offset);
  const int64_t periods = s.M / s.H;
  const int64_t chunks = std::min(periods, kMaxChunks);
  const int64_t per_chunk = (periods + chunks - 1) / chunks;
  const bool want_d = dx != nullptr || dr != nullptr;
  std::vector<acc_t> partials(dw != nullptr ? chunks * HN : 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    std::vector<acc_t> dy_buf, h_buf, g(want_d ? N : 0);
    cpu::run_vectorized<cpu::VectorIsa::kAvx2>([&](auto) {
      for (int64_t c = c_begin; c < c_end; ++c) {
        const int64_t row_end = std::min(periods, (c + 1) * per_chunk) * s.H;
        for (int64_t row = c * per_chunk * s.H; row < row_end; ++row) {
          const int64_t head = row % s.H;
          const acc_t* dya = cpu::row_as_acc<acc_t>(dy + row * N, N, dy_buf);
          const acc_t* ha = cpu::row_as_acc<acc_t>(h + row * N, N, h_buf);
          const acc_t* wr = wo.empty() ? nullptr : wo.data() + head * N;
          const acc_t r = rstd[row];
          if (want_d) {
            for (int64_t j = 0; j < N; ++j) g[j] = wr ? dya[j] * wr[j] : dya[j];
            const acc_t k = r * r * r * dot(g.data(), ha, N) / static_cast<acc_t>(N);
            const R* dresr = dres != nullptr ? dres + row * N : nullptr;
            for (int64_t j = 0; j < N; ++j) {
              acc_t d = r * g[j] - ha[j] * k;
              if (dresr != nullptr) d += static_cast<acc_t>(dresr[j]);
              if (dx != nullptr) dx[row * N + j] = static_cast<T>(d);
              if (dr != nullptr) dr[row * N + j] = static_cast<R>(d);
            }
          }
          if (dw != nullptr) {
            acc_t* part = partials.data() + c * HN + head * N;
            for (int64_t j = 0; j < N; ++j) part[j] += dya[j] * fused_xhat<T>(ha[j], r, llama);
          }
        }
      }
    });
  });
  if (dw == nullptr) return;
  constexpr int64_t kCols = 4096;
  at::parallel_for(0, HN, kCols, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(end - begin, acc_t(0));
    for (int64_t c = 0; c < chunks; ++c) {
      const acc_t* p = partials.data() + c * HN + begin;
      for (int64_t j = 0; j < end - begin; ++j) sum[j] += p[j];
    }
    for (int64_t j = begin; j < end; ++j) dw[j] = static_cast<W>(sum[j - begin]);
  });
}

void rms_norm_fused_out_cpu(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                            at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                            std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                            const at::Tensor& output, const at::Tensor& residual_out, const at::Tensor& rstd) {
  const Casting casting = parse_casting(kRmsNormFusedOp, casting_name);
  const auto rows = check_rms_norm_fused(kRmsNormFusedOp, input, residual, normalized_shape, weight, weight_offset);
  check_fused_forward_outputs(input, residual, normalized_shape, weight, casting, output, residual_out, rstd);
  if (rows.M == 0) return;
  const auto x = input.contiguous();
  const auto r = has_tensor(residual) ? residual->contiguous() : at::Tensor();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const bool llama = casting == Casting::kLlama;
  dispatch_fused_types(input.scalar_type(), r.defined() && r.scalar_type() != input.scalar_type(),
                       w.defined() && w.scalar_type() != input.scalar_type(),
                       output.scalar_type() != input.scalar_type(), [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using acc_t = at::opmath_type<T>;
    forward_rows<T, R, W, OutT, acc_t>(x.const_data_ptr<T>(), r.defined() ? r.const_data_ptr<R>() : nullptr,
                                       w.defined() ? w.const_data_ptr<W>() : nullptr, output.mutable_data_ptr<OutT>(),
                                       r.defined() ? residual_out.mutable_data_ptr<R>() : nullptr,
                                       rstd.mutable_data_ptr<acc_t>(), rows, static_cast<acc_t>(e),
                                       static_cast<acc_t>(weight_offset), llama);
  });
}

void rms_norm_quant_out_cpu(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                            at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                            std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                            const std::optional<at::Tensor>& scale, const at::Tensor& output,
                            const at::Tensor& residual_out, const at::Tensor& scale_out) {
  const Casting casting = parse_casting(kRmsNormQuantOp, casting_name);
  const auto rows = check_rms_norm_fused(kRmsNormQuantOp, input, residual, normalized_shape, weight, weight_offset);
  if (has_tensor(scale)) check_fp8_scale(kRmsNormQuantOp, input, *scale);
  check_quant_outputs(input, residual, normalized_shape, !has_tensor(scale), output, residual_out, scale_out);
  if (rows.M == 0) return;
  const auto x = input.contiguous();
  const auto r = has_tensor(residual) ? residual->contiguous() : at::Tensor();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const auto out_dtype = fused_output_dtype(input.scalar_type(), weight, casting);
  dispatch_fused_types(input.scalar_type(), r.defined() && r.scalar_type() != input.scalar_type(),
                       w.defined() && w.scalar_type() != input.scalar_type(), out_dtype != input.scalar_type(),
                       [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using acc_t = at::opmath_type<T>;
    quant_rows<T, R, W, OutT, acc_t>(x.const_data_ptr<T>(), r.defined() ? r.const_data_ptr<R>() : nullptr,
                                     w.defined() ? w.const_data_ptr<W>() : nullptr,
                                     output.mutable_data_ptr<c10::Float8_e4m3fn>(),
                                     r.defined() ? residual_out.mutable_data_ptr<R>() : nullptr,
                                     has_tensor(scale) ? scale->const_data_ptr<float>() : nullptr,
                                     has_tensor(scale) ? nullptr : scale_out.mutable_data_ptr<float>(), rows,
                                     static_cast<acc_t>(e), static_cast<acc_t>(weight_offset),
                                     casting == Casting::kLlama);
  });
}

void rms_norm_fused_backward_out_cpu(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out,
                                     const at::Tensor& h, at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                     const std::optional<at::Tensor>& weight, double weight_offset,
                                     c10::string_view casting_name, at::ScalarType input_dtype,
                                     std::array<bool, 3> output_mask, const at::Tensor& grad_input,
                                     const at::Tensor& grad_residual, const at::Tensor& grad_weight,
                                     const at::Tensor& workspace) {
  const auto q = fused_backward_request(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset,
                                        casting_name, input_dtype, output_mask, grad_input, grad_residual, grad_weight);
  (void)workspace;  // the CPU kernel keeps its few partials itself
  if (!q.run) return;
  const auto dy = grad_out.contiguous();
  const auto dres = has_tensor(grad_residual_out) ? grad_residual_out->contiguous() : at::Tensor();
  const auto hc = h.contiguous();
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const bool llama = q.casting == Casting::kLlama;
  dispatch_fused_types(input_dtype, h.scalar_type() != input_dtype, w.defined() && w.scalar_type() != input_dtype,
                       grad_out.scalar_type() != input_dtype, [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using acc_t = at::opmath_type<T>;
    backward_rows<T, R, W, OutT, acc_t>(
        dy.const_data_ptr<OutT>(), dres.defined() ? dres.const_data_ptr<R>() : nullptr, hc.const_data_ptr<R>(),
        r.const_data_ptr<acc_t>(), w.defined() ? w.const_data_ptr<W>() : nullptr,
        q.dx ? grad_input.mutable_data_ptr<T>() : nullptr, q.dr ? grad_residual.mutable_data_ptr<R>() : nullptr,
        q.dw ? grad_weight.mutable_data_ptr<W>() : nullptr, q.rows, static_cast<acc_t>(weight_offset), llama);
  });
}

// The CPU kernel keeps its few dW partials itself: no workspace.
int64_t no_workspace(const FusedRows&, const at::Tensor&, const at::Tensor&, at::ScalarType, bool) { return 0; }

// problem = [M, N, H] (forward), [M, N, H, grad_weight's element size or 0: no dW] (backward)
KernelChoice rms_norm_fused_choice(c10::IntArrayRef, c10::ScalarType) { return {"cpu_rows", 0}; }
KernelChoice rms_norm_fused_backward_choice(c10::IntArrayRef, c10::ScalarType) {
  return {"cpu_rows+chunked_dw", 0};
}

BARACUDA_REGISTER_VARIANT("rms_norm_fused", c10::DeviceType::CPU, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_quant", c10::DeviceType::CPU, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_fused_backward", c10::DeviceType::CPU, rms_norm_fused_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("rms_norm_fused", &baracuda::rms_norm_fused_functional<baracuda::rms_norm_fused_out_cpu>);
  m.impl("rms_norm_fused.out", &baracuda::rms_norm_fused_out_cpu);
  m.impl("rms_norm_quant", &baracuda::rms_norm_quant_functional<baracuda::rms_norm_quant_out_cpu>);
  m.impl("rms_norm_quant.out", &baracuda::rms_norm_quant_out_cpu);
  m.impl("rms_norm_fused_backward",
         &baracuda::rms_norm_fused_backward_functional<baracuda::rms_norm_fused_backward_out_cpu,
                                                       baracuda::no_workspace>);
  m.impl("rms_norm_fused_backward.out", &baracuda::rms_norm_fused_backward_out_cpu);
}
