// rms_norm_fused family, CUDA kernels (the math: baracuda/rms_norm_fused.h).
//
// Forward (and rms_norm_quant): one CTA per row (a grid-stride loop over rows). Pass 1 reads x (and r),
// writes h = R(x + r) and sums h^2 as stored; a fixed-order block reduction gives
// rstd; pass 2 reads h back (each thread its own elements, just written) and
// writes y. Floor: read x, r, w, write y, h, rstd.
// Backward: CTA c owns a contiguous chunk of weight periods (H rows each). Per row,
// pass 1 sums g * h (g = dy * wo), pass 2 writes dh to grad_input / grad_residual
// and adds dy * x_hat into the CTA's own dW partial [H, N] in the workspace (each
// element owned by one thread: no atomics). A second kernel sums the partials in
// chunk order. Floor: read dy, dres, h, w, rstd, write dx (and dr), dW.
// Every sum runs in a fixed order set by the shape and the SM count: bit-identical
// reruns on the same device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/rms_norm_fused.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using cuda::ceil_div;

constexpr int kMaxThreads = 1024;
constexpr int kSumThreads = 256;  // the dW partials' ordered sum: one column per thread

// ---------------------------------------------------------------------------
// Choice of launch: a pure function of the problem and the SM count, used by the
// launchers and by the Plan API (through the variant registry).

struct FusedChoice {
  int threads;         // per CTA: a warp per 4 elements of a row, 32 to 1024
  int64_t ctas;        // forward: rows in flight; backward: chunks of weight periods
  int64_t workspace;   // backward: bytes of dW partials (ctas * H * N acc_t values)
};

int fused_threads(int64_t N) {
  const int64_t want = ceil_div<int64_t>(ceil_div<int64_t>(N, 4), 32) * 32;
  return static_cast<int>(std::clamp<int64_t>(want, 32, kMaxThreads));
}

FusedChoice choose_forward(const FusedRows& s) {
  const int threads = fused_threads(s.N);
  const int64_t resident = int64_t(cuda::num_sms()) * (2048 / threads);
  return {threads, std::max<int64_t>(1, std::min(s.M, resident)), 0};
}

FusedChoice choose_backward(const FusedRows& s, int64_t acc_bytes, bool want_dw) {
  const int threads = fused_threads(s.N);
  const int64_t periods = s.H > 0 ? s.M / s.H : 0;
  const int64_t resident = int64_t(cuda::num_sms()) * (2048 / threads);
  const int64_t ctas = std::max<int64_t>(1, std::min(periods, resident));
  return {threads, ctas, want_dw && periods > 0 ? ctas * s.H * s.N * acc_bytes : 0};
}

std::string forward_variant(const FusedChoice& c) { return "cta_rows<" + std::to_string(c.threads) + ">"; }

std::string backward_variant(const FusedChoice& c) {
  return "cta_rows<" + std::to_string(c.threads) + ">+chunks" + std::to_string(c.ctas) + "_ordered_dw";
}

// ---------------------------------------------------------------------------
// Kernels.

// Pass 1 of a row: h = R(x + r) written to h_out (with a residual), and rstd = 1 / sqrt(mean(h^2) + eps)
// of h as stored, for every thread of the CTA.
template <typename T, typename R, typename AccT>
__device__ __forceinline__ AccT row_rstd(const T* __restrict__ x, const R* __restrict__ res, R* h_out, int64_t base,
                                         int64_t N, AccT eps, cuda::BlockSumScratch<AccT>& scratch) {
  AccT ss = 0;
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
    AccT v;
    if (res != nullptr) {
      const R hv = static_cast<R>(static_cast<AccT>(x[base + j]) + static_cast<AccT>(res[base + j]));
      h_out[base + j] = hv;
      v = static_cast<AccT>(hv);
    } else {
      v = static_cast<AccT>(x[base + j]);
    }
    ss += v * v;
  }
  return AccT(1) / ::sqrt(cuda::block_sum(ss, scratch) / static_cast<AccT>(N) + eps);
}

// Element i of h in a later pass: read back from h_out (written by this same thread in pass 1), or x.
template <typename T, typename R, typename AccT>
__device__ __forceinline__ AccT h_at(const T* __restrict__ x, const R* h_out, bool has_res, int64_t i) {
  return has_res ? static_cast<AccT>(h_out[i]) : static_cast<AccT>(x[i]);
}

// Max across the block (the order does not matter); every thread receives it. Ends with a barrier.
template <typename AccT>
__device__ __forceinline__ AccT block_max(AccT v, cuda::BlockSumScratch<AccT>& scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fp8_amax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) scratch.warp[threadIdx.x / 32] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) / 32;
  for (int k = 0; k < num_warps; ++k) v = fp8_amax(v, scratch.warp[k]);
  __syncthreads();
  return v;
}

template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    fused_forward_kernel(const T* __restrict__ x, const R* __restrict__ res, const W* __restrict__ w,
                         OutT* __restrict__ y, R* h_out, AccT* __restrict__ rstd, FusedRows s, AccT eps,
                         AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  for (int64_t row = blockIdx.x; row < s.M; row += gridDim.x) {
    const int64_t base = row * N;
    const AccT r = row_rstd(x, res, h_out, base, N, eps, scratch);
    if (threadIdx.x == 0) rstd[row] = r;
    const W* wr = w != nullptr ? w + (row % s.H) * N : nullptr;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const AccT v = h_at<T, R, AccT>(x, h_out, res != nullptr, base + j);
      y[base + j] = fused_output<OutT, T>(v, r, fused_weight<W, AccT>(wr, j, offset), llama);
    }
  }
}

// rms_norm_quant: as the forward, then (dynamic scale) a pass for max|y| and the CTA's max, and a
// pass writing q = fp8_quantize(y, scale).
template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    quant_kernel(const T* __restrict__ x, const R* __restrict__ res, const W* __restrict__ w,
                 c10::Float8_e4m3fn* __restrict__ q, R* h_out, const float* __restrict__ static_scale,
                 float* __restrict__ row_scale, FusedRows s, AccT eps, AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  for (int64_t row = blockIdx.x; row < s.M; row += gridDim.x) {
    const int64_t base = row * N;
    const AccT r = row_rstd(x, res, h_out, base, N, eps, scratch);
    const W* wr = w != nullptr ? w + (row % s.H) * N : nullptr;
    auto y_at = [&](int64_t j) {
      const AccT v = h_at<T, R, AccT>(x, h_out, res != nullptr, base + j);
      return static_cast<AccT>(fused_output<OutT, T>(v, r, fused_weight<W, AccT>(wr, j, offset), llama));
    };
    float scale;
    if (static_scale != nullptr) {
      scale = *static_scale;
    } else {
      AccT amax = 0;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) amax = fp8_amax(amax, y_at(j));
      scale = fp8_row_scale(block_max(amax, scratch));
      if (threadIdx.x == 0) row_scale[row] = scale;
    }
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) q[base + j] = fp8_quantize(y_at(j), scale);
  }
}

// partials: gridDim.x rows of H * N (only with dw_partials != nullptr).
template <typename T, typename R, typename W, typename OutT, typename AccT>
__global__ void __launch_bounds__(kMaxThreads)
    fused_backward_kernel(const OutT* __restrict__ dy, const R* __restrict__ dres, const R* __restrict__ h,
                          const AccT* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                          R* __restrict__ dr, AccT* __restrict__ dw_partials, FusedRows s, int64_t per_cta,
                          AccT offset, bool llama) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int64_t N = s.N;
  const int64_t periods = s.M / s.H;
  const int64_t row_begin = blockIdx.x * per_cta * s.H;
  const int64_t row_end = std::min(periods, (int64_t(blockIdx.x) + 1) * per_cta) * s.H;
  AccT* part = dw_partials != nullptr ? dw_partials + blockIdx.x * s.H * N : nullptr;
  if (part != nullptr) {
    // Same element-to-thread map as the updates below: no barrier needed.
    for (int64_t head = 0; head < s.H; ++head) {
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) part[head * N + j] = AccT(0);
    }
  }
  const bool want_d = dx != nullptr || dr != nullptr;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t base = row * N;
    const int64_t head = row % s.H;
    const W* wr = w != nullptr ? w + head * N : nullptr;
    const AccT r = rstd[row];
    if (want_d) {
      AccT sg = 0;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        sg += static_cast<AccT>(dy[base + j]) * fused_weight<W, AccT>(wr, j, offset) * static_cast<AccT>(h[base + j]);
      }
      const AccT k = r * r * r * cuda::block_sum(sg, scratch) / static_cast<AccT>(N);
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const AccT g = static_cast<AccT>(dy[base + j]) * fused_weight<W, AccT>(wr, j, offset);
        AccT d = r * g - static_cast<AccT>(h[base + j]) * k;
        if (dres != nullptr) d += static_cast<AccT>(dres[base + j]);
        if (dx != nullptr) dx[base + j] = static_cast<T>(d);
        if (dr != nullptr) dr[base + j] = static_cast<R>(d);
      }
    }
    if (part != nullptr) {
      AccT* pr = part + head * N;
      for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        pr[j] += static_cast<AccT>(dy[base + j]) * fused_xhat<T>(static_cast<AccT>(h[base + j]), r, llama);
      }
    }
  }
}

// dw[col] = sum over c of partials[c][col], c in order.
template <typename W, typename AccT>
__global__ void __launch_bounds__(kSumThreads)
    dw_sum_kernel(const AccT* __restrict__ partials, W* __restrict__ dw, int64_t chunks, int64_t cols) {
  const int64_t col = int64_t(blockIdx.x) * kSumThreads + threadIdx.x;
  if (col >= cols) return;
  AccT sum = 0;
  for (int64_t c = 0; c < chunks; ++c) sum += partials[c * cols + col];
  dw[col] = static_cast<W>(sum);
}

// ---------------------------------------------------------------------------
// Glue.

void rms_norm_fused_out_cuda(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                             const at::Tensor& output, const at::Tensor& residual_out, const at::Tensor& rstd) {
  const Casting casting = parse_casting(kRmsNormFusedOp, casting_name);
  const auto rows = check_rms_norm_fused(kRmsNormFusedOp, input, residual, normalized_shape, weight, weight_offset);
  check_fused_forward_outputs(input, residual, normalized_shape, weight, casting, output, residual_out, rstd);
  if (rows.M == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const auto x = input.contiguous();
  const auto r = has_tensor(residual) ? residual->contiguous() : at::Tensor();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const FusedChoice c = choose_forward(rows);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input.scalar_type(), r.defined() && r.scalar_type() != input.scalar_type(),
                       w.defined() && w.scalar_type() != input.scalar_type(),
                       output.scalar_type() != input.scalar_type(), [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    fused_forward_kernel<T, R, W, OutT, AccT><<<c.ctas, c.threads, 0, stream>>>(
        x.const_data_ptr<T>(), r.defined() ? r.const_data_ptr<R>() : nullptr,
        w.defined() ? w.const_data_ptr<W>() : nullptr, output.mutable_data_ptr<OutT>(),
        r.defined() ? residual_out.mutable_data_ptr<R>() : nullptr, rstd.mutable_data_ptr<AccT>(), rows,
        static_cast<AccT>(e), static_cast<AccT>(weight_offset), casting == Casting::kLlama);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name) {
  const Casting casting = parse_casting(kRmsNormFusedOp, casting_name);
  check_rms_norm_fused(kRmsNormFusedOp, input, residual, normalized_shape, weight, weight_offset);
  auto output =
      at::empty(input.sizes(), input.options().dtype(fused_output_dtype(input.scalar_type(), weight, casting)));
  auto residual_out =
      has_tensor(residual) ? at::empty(input.sizes(), residual->options()) : at::empty({0}, input.options());
  auto rstd = at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                        input.options().dtype(rms_acc_dtype(input.scalar_type())));
  rms_norm_fused_out_cuda(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, output,
                          residual_out, rstd);
  return {output, residual_out, rstd};
}

void rms_norm_quant_out_cuda(const at::Tensor& input, const std::optional<at::Tensor>& residual,
                             at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps, double weight_offset, c10::string_view casting_name,
                             const std::optional<at::Tensor>& scale, const at::Tensor& output,
                             const at::Tensor& residual_out, const at::Tensor& scale_out) {
  const Casting casting = parse_casting(kRmsNormQuantOp, casting_name);
  const auto rows = check_rms_norm_fused(kRmsNormQuantOp, input, residual, normalized_shape, weight, weight_offset);
  if (has_tensor(scale)) check_fp8_scale(kRmsNormQuantOp, input, *scale);
  check_quant_outputs(input, residual, normalized_shape, !has_tensor(scale), output, residual_out, scale_out);
  if (rows.M == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const auto x = input.contiguous();
  const auto r = has_tensor(residual) ? residual->contiguous() : at::Tensor();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  const auto out_dtype = fused_output_dtype(input.scalar_type(), weight, casting);
  const FusedChoice c = choose_forward(rows);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input.scalar_type(), r.defined() && r.scalar_type() != input.scalar_type(),
                       w.defined() && w.scalar_type() != input.scalar_type(), out_dtype != input.scalar_type(),
                       [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    quant_kernel<T, R, W, OutT, AccT><<<c.ctas, c.threads, 0, stream>>>(
        x.const_data_ptr<T>(), r.defined() ? r.const_data_ptr<R>() : nullptr,
        w.defined() ? w.const_data_ptr<W>() : nullptr, output.mutable_data_ptr<c10::Float8_e4m3fn>(),
        r.defined() ? residual_out.mutable_data_ptr<R>() : nullptr,
        has_tensor(scale) ? scale->const_data_ptr<float>() : nullptr,
        has_tensor(scale) ? nullptr : scale_out.mutable_data_ptr<float>(), rows, static_cast<AccT>(e),
        static_cast<AccT>(weight_offset), casting == Casting::kLlama);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_quant_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double weight_offset,
    c10::string_view casting_name, const std::optional<at::Tensor>& scale) {
  parse_casting(kRmsNormQuantOp, casting_name);
  check_rms_norm_fused(kRmsNormQuantOp, input, residual, normalized_shape, weight, weight_offset);
  auto output = at::empty(input.sizes(), input.options().dtype(at::kFloat8_e4m3fn));
  auto residual_out =
      has_tensor(residual) ? at::empty(input.sizes(), residual->options()) : at::empty({0}, input.options());
  auto scale_out = has_tensor(scale) ? at::empty({0}, input.options().dtype(at::kFloat))
                                     : at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                                                 input.options().dtype(at::kFloat));
  rms_norm_quant_out_cuda(input, residual, normalized_shape, weight, eps, weight_offset, casting_name, scale, output,
                          residual_out, scale_out);
  return {output, residual_out, scale_out};
}

int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == at::kDouble ? 8 : 4; }

void rms_norm_fused_backward_out_cuda(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out,
                                      const at::Tensor& h, at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                      const std::optional<at::Tensor>& weight, double weight_offset,
                                      c10::string_view casting_name, at::ScalarType input_dtype,
                                      std::array<bool, 3> output_mask, const at::Tensor& grad_input,
                                      const at::Tensor& grad_residual, const at::Tensor& grad_weight,
                                      const at::Tensor& workspace) {
  const char* op = kRmsNormFusedBackwardOp;
  const Casting casting = parse_casting(op, casting_name);
  const auto rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                  weight_offset, casting, input_dtype);
  const bool want_dx = output_mask[0], want_dr = output_mask[1];
  const bool want_dw = output_mask[2] && has_tensor(weight);
  check_fused_backward_outputs(h, weight, input_dtype, output_mask, grad_input, grad_residual, grad_weight);
  if (rows.N == 0 || (!want_dx && !want_dr && !want_dw)) return;
  const c10::cuda::CUDAGuard guard(h.device());
  if (rows.M == 0) {
    if (want_dw) grad_weight.zero_();
    return;
  }
  const FusedChoice c = choose_backward(rows, acc_bytes_of(input_dtype), want_dw);
  check_workspace(op, workspace, c.workspace, 16, h.device());
  const auto dy = grad_out.contiguous();
  const auto dres = has_tensor(grad_residual_out) ? grad_residual_out->contiguous() : at::Tensor();
  const auto hc = h.contiguous();
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? weight->contiguous() : at::Tensor();
  const int64_t periods = rows.M / rows.H;
  const int64_t per_cta = ceil_div<int64_t>(periods, c.ctas);
  const int64_t ctas = ceil_div<int64_t>(periods, per_cta);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_fused_types(input_dtype, h.scalar_type() != input_dtype, w.defined() && w.scalar_type() != input_dtype,
                       grad_out.scalar_type() != input_dtype, [&](auto t, auto r_tag, auto w_tag, auto o_tag) {
    using T = decltype(t);
    using R = decltype(r_tag);
    using W = decltype(w_tag);
    using OutT = decltype(o_tag);
    using AccT = at::opmath_type<T>;
    AccT* partials = want_dw ? static_cast<AccT*>(workspace.mutable_data_ptr()) : nullptr;
    fused_backward_kernel<T, R, W, OutT, AccT><<<ctas, c.threads, 0, stream>>>(
        dy.const_data_ptr<OutT>(), dres.defined() ? dres.const_data_ptr<R>() : nullptr, hc.const_data_ptr<R>(),
        r.const_data_ptr<AccT>(), w.defined() ? w.const_data_ptr<W>() : nullptr,
        want_dx ? grad_input.mutable_data_ptr<T>() : nullptr, want_dr ? grad_residual.mutable_data_ptr<R>() : nullptr,
        partials, rows, per_cta, static_cast<AccT>(weight_offset), casting == Casting::kLlama);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (want_dw) {
      const int64_t cols = rows.H * rows.N;
      dw_sum_kernel<W, AccT><<<ceil_div<int64_t>(cols, kSumThreads), kSumThreads, 0, stream>>>(
          partials, grad_weight.mutable_data_ptr<W>(), ctas, cols);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fused_backward_cuda(
    const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_residual_out, const at::Tensor& h,
    at::IntArrayRef normalized_shape, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    double weight_offset, c10::string_view casting_name, at::ScalarType input_dtype, std::array<bool, 3> output_mask) {
  const Casting casting = parse_casting(kRmsNormFusedBackwardOp, casting_name);
  const auto rows = check_rms_norm_fused_backward(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                                  weight_offset, casting, input_dtype);
  const c10::cuda::CUDAGuard guard(h.device());
  at::Tensor grad_input, grad_residual, grad_weight;
  if (output_mask[0]) grad_input = at::empty(h.sizes(), h.options().dtype(input_dtype));
  if (output_mask[1]) grad_residual = at::empty(h.sizes(), h.options());
  const bool want_dw = output_mask[2] && has_tensor(weight);
  if (want_dw) grad_weight = at::empty(weight->sizes(), weight->options());
  const auto none = at::empty({0}, h.options());
  const int64_t need = rows.M > 0 ? choose_backward(rows, acc_bytes_of(input_dtype), want_dw).workspace : 0;
  rms_norm_fused_backward_out_cuda(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset,
                                   casting_name, input_dtype, output_mask, grad_input.defined() ? grad_input : none,
                                   grad_residual.defined() ? grad_residual : none,
                                   grad_weight.defined() ? grad_weight : none,
                                   at::empty({need}, h.options().dtype(at::kByte)));
  return {grad_input, grad_residual, grad_weight};
}

// problem = [M, N, H] (forward), [M, N, H, grad_weight's element size or 0: no dW] (backward)
KernelChoice rms_norm_fused_choice(c10::IntArrayRef p, c10::ScalarType) {
  return {forward_variant(choose_forward({p[0], p[1], p[2]})), 0};
}

KernelChoice rms_norm_fused_backward_choice(c10::IntArrayRef p, c10::ScalarType dtype) {
  const FusedChoice c = choose_backward({p[0], p[1], p[2]}, acc_bytes_of(dtype), p[3] > 0);
  return {backward_variant(c), p[0] > 0 && p[1] > 0 ? c.workspace : 0};
}

BARACUDA_REGISTER_VARIANT("rms_norm_fused", c10::DeviceType::CUDA, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_quant", c10::DeviceType::CUDA, rms_norm_fused_choice);
BARACUDA_REGISTER_VARIANT("rms_norm_fused_backward", c10::DeviceType::CUDA, rms_norm_fused_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm_fused", &baracuda::rms_norm_fused_cuda);
  m.impl("rms_norm_fused.out", &baracuda::rms_norm_fused_out_cuda);
  m.impl("rms_norm_quant", &baracuda::rms_norm_quant_cuda);
  m.impl("rms_norm_quant.out", &baracuda::rms_norm_quant_out_cuda);
  m.impl("rms_norm_fused_backward", &baracuda::rms_norm_fused_backward_cuda);
  m.impl("rms_norm_fused_backward.out", &baracuda::rms_norm_fused_backward_out_cuda);
}
