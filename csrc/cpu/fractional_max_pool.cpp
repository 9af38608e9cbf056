// fractional_max_pool family (2d and 3d), CPU kernels.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "baracuda/checks.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/dispatch.h"
#include "baracuda/fractional_max_pool.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// The first maximum (NaN wins) of the window whose first element is xp[origin] and
// its plane index: KT x K x K elements (K > 0: every pooled axis has kernel size K,
// the loops unrolled) or g.k's (K == 0). Compared in acc_t; the output keeps the
// element's own bits (a NaN's payload included), as PyTorch's kernel does.
template <int KT, int K, typename scalar_t, typename acc_t>
inline void fmp_window_max(const FmpGeometry& g, const scalar_t* xp, int64_t origin, scalar_t& y, int64_t& idx) {
  const int64_t kt = K > 0 ? KT : g.k[0], kh = K > 0 ? K : g.k[1], kw = K > 0 ? K : g.k[2];
  const int64_t in_h = g.in[1], in_w = g.in[2];
  acc_t best = -std::numeric_limits<acc_t>::infinity();
  scalar_t best_value = static_cast<scalar_t>(best);
  int64_t best_index = origin;
  for (int64_t t = 0; t < kt; ++t) {
    for (int64_t h = 0; h < kh; ++h) {
      const int64_t row = origin + (t * in_h + h) * in_w;
      for (int64_t w = 0; w < kw; ++w) {
        const scalar_t raw = xp[row + w];
        const acc_t v = static_cast<acc_t>(raw);
        if (v > best || v != v) {
          best = v;
          best_value = raw;
          best_index = row + w;
        }
      }
    }
  }
  y = best_value;
  idx = best_index;
}

// Forward, one plane at a time: the window starts of each axis from the plane's
// samples (computed in scalar_t, as PyTorch's CPU kernel does), then for every
// output cell the first maximum of its k_T x k_H x k_W window.
template <int KT, int K, typename scalar_t>
void fmp_forward_planes(const FmpGeometry& g, const scalar_t* x, const scalar_t* samples, scalar_t* y,
                        int64_t* idx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int dims = g.dims;
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  // A grain of about 32k window loads: a plane's work is its output cells times the window.
  const int64_t plane_loads = std::max<int64_t>(1, out_plane * g.k[0] * g.k[1] * g.k[2]);
  at::parallel_for(0, g.planes(), std::max<int64_t>(1, 32768 / plane_loads), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> start[3];
    for (int64_t p = begin; p < end; ++p) {
      for (int a = 0; a < 3; ++a) {
        const scalar_t u = g.sample_slot[a] < 0 ? scalar_t(0) : samples[p * dims + g.sample_slot[a]];
        start[a].resize(g.out[a]);
        for (int64_t i = 0; i < g.out[a]; ++i) start[a][i] = fmp_start<scalar_t>(u, i, g.in[a], g.out[a], g.k[a]);
      }
      const scalar_t* xp = x + p * in_plane;
      int64_t o = p * out_plane;
      for (int64_t ot = 0; ot < g.out[0]; ++ot) {
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          const int64_t row = (start[0][ot] * g.in[1] + start[1][oh]) * g.in[2];
          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
            fmp_window_max<KT, K, scalar_t, acc_t>(g, xp, row + start[2][ow], y[o], idx[o]);
          }
        }
      }
    }
  });
}

// The forward with its windows unrolled where every pooled axis has kernel size 2 or 3.
template <typename scalar_t>
void fmp_forward(const FmpGeometry& g, const scalar_t* x, const scalar_t* samples, scalar_t* y, int64_t* idx) {
  const int k = g.uniform_kernel();
  if (k == 2) {
    g.dims == 3 ? fmp_forward_planes<2, 2>(g, x, samples, y, idx) : fmp_forward_planes<1, 2>(g, x, samples, y, idx);
  } else if (k == 3) {
    g.dims == 3 ? fmp_forward_planes<3, 3>(g, x, samples, y, idx) : fmp_forward_planes<1, 3>(g, x, samples, y, idx);
  } else {
    fmp_forward_planes<0, 0>(g, x, samples, y, idx);
  }
}

// Backward, one plane at a time: dx[idx[o]] += dy[o] for o in increasing order
// (PyTorch's order), accumulated in acc_t and rounded once. Deterministic: a
// plane is never split between threads.
template <typename scalar_t, typename acc_t>
void fmp_backward_planes(const FmpGeometry& g, const scalar_t* dy, const int64_t* idx,
                         scalar_t* dx) {
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  at::parallel_for(0, g.planes(), std::max<int64_t>(1, 16384 / std::max<int64_t>(1, in_plane + out_plane)),
                   [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(in_plane);
    cpu::run_vectorized([&](auto) {
      for (int64_t p = begin; p < end; ++p) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        const scalar_t* dyp = dy + p * out_plane;
        const int64_t* ip = idx + p * out_plane;
        for (int64_t o = 0; o < out_plane; ++o) {
          const int64_t i = ip[o];
          BARACUDA_CHECK_INDEX(i >= 0 && i < in_plane, fmp_op_name(g.dims, true), ": indices value ", i,
                            " is out of range for an input plane of ", in_plane, " elements");
          acc[i] += static_cast<acc_t>(dyp[o]);
        }
        scalar_t* dxp = dx + p * in_plane;
        for (int64_t i = 0; i < in_plane; ++i) dxp[i] = static_cast<scalar_t>(acc[i]);
      }
    });
  });
}

template <int Dims>
void fmp_out_cpu(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef output_size,
                 const at::Tensor& random_samples, const at::Tensor& output, const at::Tensor& indices) {
  const auto g = check_fmp_forward(Dims, self, kernel_size, output_size, random_samples);
  check_fmp_forward_outs(Dims, self, output_size, output, indices);
  check_no_overlap(fmp_op_name(Dims, false), {{"output", output}, {"indices", indices}},
                   {{"self", self}, {"random_samples", random_samples}});
  if (output.numel() == 0) return;
  const auto x = self.contiguous();
  const auto s = random_samples.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_cpu", [&] {
    fmp_forward<scalar_t>(g, x.const_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(),
                          output.mutable_data_ptr<scalar_t>(), indices.mutable_data_ptr<int64_t>());
  });
}

template <int Dims>
std::tuple<at::Tensor, at::Tensor> fmp_cpu(const at::Tensor& self, at::IntArrayRef kernel_size,
                                           at::IntArrayRef output_size, const at::Tensor& random_samples) {
  check_fmp_forward(Dims, self, kernel_size, output_size, random_samples);
  const auto shape = fmp_output_shape(Dims, self.sizes(), output_size);
  auto output = at::empty(shape, self.options());
  auto indices = at::empty(shape, self.options().dtype(at::kLong));
  fmp_out_cpu<Dims>(self, kernel_size, output_size, random_samples, output, indices);
  return {output, indices};
}

template <int Dims>
void fmp_backward_out_cpu(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                          at::IntArrayRef output_size, const at::Tensor& indices, const at::Tensor& grad_input,
                          const at::Tensor& workspace) {
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  check_fmp_grad_input(Dims, self, grad_input);
  check_no_overlap(fmp_op_name(Dims, true), {{"grad_input", grad_input}},
                   {{"grad_output", grad_output}, {"self", self}, {"indices", indices}});
  (void)workspace;  // the CPU kernel needs no caller scratch
  if (grad_input.numel() == 0) return;
  const auto dy = grad_output.contiguous();
  const auto idx = indices.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_backward_cpu", [&] {
    fmp_backward_planes<scalar_t, acc_t>(g, dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(),
                                         grad_input.mutable_data_ptr<scalar_t>());
  });
}

template <int Dims>
at::Tensor fmp_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                            at::IntArrayRef output_size, const at::Tensor& indices) {
  check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  auto grad_input = at::empty(self.sizes(), self.options());
  auto workspace = at::empty({0}, self.options().dtype(at::kByte));
  fmp_backward_out_cpu<Dims>(grad_output, self, kernel_size, output_size, indices, grad_input, workspace);
  return grad_input;
}

// problem = [dims, input ndim, *input_shape, *kernel_size, *output_size]
KernelChoice fmp_choice(c10::IntArrayRef problem, c10::ScalarType) {
  fmp_geometry_of_problem(false, problem);
  return {"cpu_plane_window_max", 0};
}
KernelChoice fmp_backward_choice(c10::IntArrayRef problem, c10::ScalarType) {
  fmp_geometry_of_problem(true, problem);
  return {"cpu_plane_ordered_scatter", 0};
}

BARACUDA_REGISTER_VARIANT("fractional_max_pool2d", c10::DeviceType::CPU, fmp_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d", c10::DeviceType::CPU, fmp_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool2d_backward", c10::DeviceType::CPU, fmp_backward_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d_backward", c10::DeviceType::CPU, fmp_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("fractional_max_pool2d", &baracuda::fmp_cpu<2>);
  m.impl("fractional_max_pool2d.out", &baracuda::fmp_out_cpu<2>);
  m.impl("fractional_max_pool2d_backward", &baracuda::fmp_backward_cpu<2>);
  m.impl("fractional_max_pool2d_backward.out", &baracuda::fmp_backward_out_cpu<2>);
  m.impl("fractional_max_pool3d", &baracuda::fmp_cpu<3>);
  m.impl("fractional_max_pool3d.out", &baracuda::fmp_out_cpu<3>);
  m.impl("fractional_max_pool3d_backward", &baracuda::fmp_backward_cpu<3>);
  m.impl("fractional_max_pool3d_backward.out", &baracuda::fmp_backward_out_cpu<3>);
}
