// rms_norm backward, CUDA: the launcher of the backward kernels (register rows:
// backward_rows.cuh, streamed cluster rows: backward_streamed.cuh, decode rows:
// backward_decode.cuh, two-pass rows: two_pass.cuh, dW partial-row sum: rms_dw_sum_kernel
// in baracuda/rms_rows.cuh;
// kinds and their choice: baracuda/rms_norm_policy.h).
#include "backward_decode.cuh"
#include "backward_rows.cuh"
#include "backward_streamed.cuh"
#include "common.cuh"
#include "two_pass.cuh"

namespace baracuda {
namespace {

// Calls fn(kernel) with the backward register kernel of the choice: its vectors per
// thread, and the registers capped for two CTAs per SM where the choice says so.
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  with_vpt<T, V, true>(c, [&](auto vpt_tag) {
    constexpr int Vpt = decltype(vpt_tag)::value;
    if constexpr (Vpt == kVpt) {
      if (c.ctas_per_sm == 2) return fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 2>);
      // One row per CTA of more than 256 threads: the dW slots in 16-byte groups
      // (fewer registers for 16-bit elements, faster there); at 256 threads and fewer,
      // and for cluster rows, single slots, which are as fast or faster.
      if (c.cluster == 1 && c.group == c.block && c.block > 256) {
        return fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 1, true>);
      }
    }
    fn(rms_norm_bwd_kernel<T, W, AccT, V, Vpt, 1>);
  });
}

// Calls fn(kernel) with the streamed cluster-row backward kernel (instantiated for
// 16-byte vectors, which the bulk copies need, as the policy picks it).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_streamed_kernel(Fn&& fn) {
  if constexpr (V * sizeof(T) == 16) {
    fn(rms_norm_bwd_streamed_kernel<T, W, AccT, V>);
  } else {
    TORCH_CHECK(false, "rms_norm_backward: no streamed kernel for vectors of ", V * sizeof(T), " bytes");
  }
}

// Calls fn(kernel) with the single-row backward kernel of the choice's vectors per
// thread (1 or kDecodeVpt; instantiated for 16-byte vectors, as the policy picks it).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_bwd_decode_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  static_assert(kDecodeVpt == 2);
  if constexpr (V * sizeof(T) == 16) {
    if (c.vpt == 1) return fn(rms_norm_bwd_decode_kernel<T, W, AccT, V, 1>);
    if (c.vpt == 2) return fn(rms_norm_bwd_decode_kernel<T, W, AccT, V, 2>);
  }
  TORCH_CHECK(false, "rms_norm_backward: no single-row kernel for ", c.vpt, " vectors of ", V, " per thread");
}

// Resident row groups of the backward kernel a shape launches.
int64_t backward_resident_row_groups(const RmsLaunchConfig& c, c10::ScalarType dtype) {
  return min_resident_row_groups(c, dtype, [&]<typename T, typename W, typename AccT, int V>(auto&& fn) {
    if (c.two_pass()) return fn(rms_norm_bwd_looped_kernel<T, W, AccT, V>);
    if (c.stages > 0) return with_bwd_streamed_kernel<T, W, AccT, V>(fn);
    with_bwd_kernel<T, W, AccT, V>(c, fn);
  });
}

RmsLaunchConfig choose_backward(const RmsProblem& p) {
  return choose_rms(p, [&](const RmsLaunchConfig& shape) { return backward_resident_row_groups(shape, p.dtype); });
}

// The backward into the outputs. `workspace` is the caller's (checked to hold the
// dW partials), or none: one of the needed size is allocated (the functional op).
void rms_norm_backward_into(const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                            const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                            std::array<bool, 2> output_mask, const at::Tensor& grad_input,
                            const at::Tensor& grad_weight, const std::optional<at::Tensor>& workspace) {
  const char* op = kRmsNormBackwardOp;
  const auto rows = check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);
  const bool want_dx = output_mask[0];
  const bool want_dw = output_mask[1] && has_tensor(weight);
  if (want_dx) {
    check_out(op, "grad_input", grad_input, input.sizes(), input.scalar_type(), input.device());
    cuda::check_out_aligned(op, "grad_input", grad_input);
  }
  if (want_dw) {
    check_out(op, "grad_weight", grad_weight, normalized_shape, weight->scalar_type(), input.device());
    BARACUDA_CHECK_VALUE(grad_weight.is_contiguous(), op, ": grad_weight must be contiguous");
  }
  check_rms_norm_backward_overlap(grad_out, input, rstd, weight, if_used(want_dx, grad_input),
                                  if_used(want_dw, grad_weight), at::Tensor());
  if (rows.N == 0 || (!want_dx && !want_dw)) return;
  const c10::cuda::CUDAGuard guard(input.device());
  cuda::check_device_arch(op);
  if (rows.M == 0) {
    if (want_dw) grad_weight.zero_();
    return;
  }
  const int64_t acc_bytes = acc_bytes_of(input.scalar_type());
  const RmsProblem problem{rows.M, rows.N, input.scalar_type(), true, want_dw ? weight->element_size() : 0};
  const auto c = choose_backward(problem);
  at::Tensor ws;
  if (want_dw) {
    const int64_t need = rms_dw_workspace_bytes(c, problem);
    if (workspace.has_value()) {
      check_workspace(op, *workspace, need, 16, input.device(),
                      {{"grad_out", grad_out}, {"input", input}, {"rstd", rstd}, {"weight", *weight},
                       {"grad_input", if_used(want_dx, grad_input)}, {"grad_weight", grad_weight}});
    }
    ws = workspace.has_value() ? *workspace : at::empty({need}, input.options().dtype(at::kByte));
  }
  const auto dy = cuda::aligned_contiguous(grad_out);
  const auto x = cuda::aligned_contiguous(input);
  const auto r = rstd.contiguous();
  const auto w = has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor();
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_backward_cuda", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      with_vec<scalar_t>(c, [&](auto v_tag) {
        constexpr int V = decltype(v_tag)::value;
        const auto* gp = dy.const_data_ptr<scalar_t>();
        const auto* xp = x.const_data_ptr<scalar_t>();
        const auto* rp = r.const_data_ptr<acc_t>();
        const W* wp = w.defined() ? w.const_data_ptr<W>() : nullptr;
        scalar_t* dxp = want_dx ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
        const bool direct = want_dw && c.dw != RmsDwSum::kOrdered;
        acc_t* parts = want_dw && !direct ? static_cast<acc_t*>(ws.mutable_data_ptr()) : nullptr;
        W* dwp = direct ? grad_weight.mutable_data_ptr<W>() : nullptr;
        if (c.two_pass()) {
          cuda::launch(rms_norm_bwd_looped_kernel<scalar_t, W, acc_t, V>,
                       {.grid = dim3(c.clusters), .block = dim3(c.block)}, gp, xp, rp, wp, dxp, parts, rows.M,
                       rows.N);
        } else if (c.decode()) {
          with_bwd_decode_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            const int64_t col_smem = c.dw_columns > 0 ? int64_t(c.block) * V * acc_bytes : 0;  // decode_dw_columns
            cuda::launch(kernel, {.grid = dim3(c.clusters + c.dw_columns), .block = dim3(c.block), .smem = col_smem},
                         gp, xp, rp, wp, dxp, dwp, static_cast<int>(rows.M), static_cast<int>(rows.N),
                         inverse_row_length<acc_t>(rows.N));
          });
        } else if (c.stages > 0) {
          with_bwd_streamed_kernel<scalar_t, W, acc_t, V>([&](auto kernel) {
            // A launch cluster is a row's CTAs (cluster rows) or the CTAs that fold dW (dw_fold).
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block),
                          .cluster = c.cluster * c.dw_fold, .smem = c.smem},
                         gp, xp, rp, wp, dxp, parts, dwp, rows.M, static_cast<int>(rows.N), c.cluster,
                         c.dw_fold, c.refill_after_dx);
          });
        } else {
          with_bwd_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            const int staged = staged_weight_vectors(kernel, c, true, wp != nullptr, int64_t(sizeof(W)) * V);
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster,
                          .smem = c.smem + int64_t(c.block) * staged * int64_t(sizeof(W)) * V},
                         gp, xp, rp, wp, dxp, parts, dwp, rows.M, static_cast<int>(rows.N), c.group, c.cluster,
                         staged, c.prefetch_next);
          });
        }
        if (want_dw && !direct) {
          launch_rms_dw_sum(parts, grad_weight.mutable_data_ptr<W>(), c.dw_partial_rows(), rows.N);
        }
      });
    });
  });
}

// Outputs that output_mask leaves out (and grad_weight without a weight) are
// undefined tensors (None in Python), as aten::_fused_rms_norm_backward returns.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input,
                                                          at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                          const std::optional<at::Tensor>& weight,
                                                          std::array<bool, 2> output_mask) {
  check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight);  // before allocating by its shapes
  at::Tensor grad_input, grad_weight;
  if (output_mask[0]) grad_input = at::empty(input.sizes(), input.options());
  const bool want_dw = output_mask[1] && has_tensor(weight);
  if (want_dw) grad_weight = at::empty(normalized_shape, weight->options());
  const auto none = at::empty({0}, input.options());
  rms_norm_backward_into(grad_out, input, normalized_shape, rstd, weight, output_mask,
                         grad_input.defined() ? grad_input : none, grad_weight.defined() ? grad_weight : none,
                         std::nullopt);
  return {grad_input, grad_weight};
}

void rms_norm_backward_out_cuda(const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                                const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                std::array<bool, 2> output_mask, const at::Tensor& grad_input,
                                const at::Tensor& grad_weight, const at::Tensor& workspace) {
  rms_norm_backward_into(grad_out, input, normalized_shape, rstd, weight, output_mask, grad_input, grad_weight,
                         workspace);
}

// problem = [M, N, grad_weight's element size or 0: no dW] (rms_problem).
KernelChoice rms_norm_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const RmsProblem p = rms_problem(problem, dtype, true);
  return rms_choice(p, [&](const RmsLaunchConfig& shape) { return backward_resident_row_groups(shape, p.dtype); });
}

BARACUDA_REGISTER_VARIANT("rms_norm_backward", c10::DeviceType::CUDA, rms_norm_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm_backward", &baracuda::rms_norm_backward_cuda);
  m.impl("rms_norm_backward.out", &baracuda::rms_norm_backward_out_cuda);
}
