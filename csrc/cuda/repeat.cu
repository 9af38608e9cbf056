// repeat family, CUDA kernels.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <string>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/repeat.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// ---------------------------------------------------------------------------
// Choice of kernel: a pure function of the problem, used by the launchers and
// by the Plan API (through the variant registry).

struct RepeatChoice {
  int vec_bytes;        // bytes per access: 16 when the innermost input run allows it
  bool index32;         // 32-bit index math (fast division) when the output fits
  int64_t splits = 1;   // backward: tile-range splits reduced by a second, ordered pass
  int64_t tiles_per_split = 1;
};

RepeatChoice choose_repeat(const TiledLayout& t, int64_t elem_bytes) {
  const int64_t s_last = t.size[t.ndim - 1];
  const bool vec = elem_bytes < 16 && (s_last * elem_bytes) % 16 == 0;
  return {vec ? 16 : static_cast<int>(elem_bytes), t.output_numel() < (int64_t(1) << 31)};
}

RepeatChoice choose_repeat_backward(const TiledLayout& t, int64_t elem_bytes) {
  RepeatChoice c = choose_repeat(t, elem_bytes);
  const int64_t vectors = t.input_numel() / (c.vec_bytes / elem_bytes);
  const int64_t tiles = t.tiles();
  if (tiles == 0 || vectors == 0) return c;
  // Enough threads for about two waves of the whole GPU; each split sums at
  // least 8 tiles so the partials stay small next to the grad it reads.
  const int64_t want = 2 * int64_t(cuda::num_sms()) * 2048;
  int64_t splits = std::min<int64_t>(ceil_div<int64_t>(want, std::max<int64_t>(vectors, 1)), ceil_div<int64_t>(tiles, 8));
  splits = std::clamp<int64_t>(splits, 1, 65535);  // splits run on grid.y
  c.tiles_per_split = ceil_div(tiles, splits);
  c.splits = ceil_div(tiles, c.tiles_per_split);
  return c;
}

std::string repeat_variant(const RepeatChoice& c) {
  return "tile_copy<" + std::to_string(c.vec_bytes) + "B," + (c.index32 ? "i32" : "i64") + ">";
}

std::string repeat_backward_variant(const RepeatChoice& c) {
  std::string v = "tile_sum<" + std::to_string(c.vec_bytes) + "B," + (c.index32 ? "i32" : "i64") + ">";
  return c.splits == 1 ? v : v + "+split" + std::to_string(c.splits) + "_ordered_combine";
}

// ---------------------------------------------------------------------------
// Forward: y[q] = x[sum_d ((q_d mod (s_d r_d)) mod s_d) * in_stride_d], where q_d
// are the digits of output index q over the output extents s_d * r_d. Each
// thread moves whole vectors; a vector never straddles an input run because
// s_last is a multiple of the vector length.

template <typename IndexT>
struct TileIndexer {
  int ndim;
  IntDivider<IndexT> out_extent[kMaxTileDims];  // s_d * r_d
  IntDivider<IndexT> in_extent[kMaxTileDims];   // s_d
  IndexT in_stride[kMaxTileDims];               // input elements per step of dim d

  explicit TileIndexer(const TiledLayout& t) : ndim(t.ndim) {
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      out_extent[d] = IntDivider<IndexT>(static_cast<IndexT>(t.size[d] * t.repeat[d]));
      in_extent[d] = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(t.size[d], 1)));
      in_stride[d] = static_cast<IndexT>(stride);
      stride *= t.size[d];
    }
  }

  __device__ __forceinline__ IndexT input_offset(IndexT out_index) const {
    IndexT src = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const auto q = out_extent[d].divmod(out_index);
      out_index = q.div;
      src += in_extent[d].divmod(q.mod).mod * in_stride[d];
    }
    return src;
  }
};

template <typename W, int V, typename IndexT>
__global__ void __launch_bounds__(kThreads) repeat_copy_kernel(const W* __restrict__ x, W* __restrict__ y,
                                                               TileIndexer<IndexT> ix, IndexT num_vectors) {
  const IndexT stride = IndexT(gridDim.x) * kThreads;
  for (IndexT first = IndexT(blockIdx.x) * kThreads + threadIdx.x; first < num_vectors; first += stride * kUnroll) {
    cuda::Vec<W, V> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const IndexT q = first + u * stride;
      if (q < num_vectors) v[u] = cuda::load_vec<W, V>(x + ix.input_offset(q * V));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const IndexT q = first + u * stride;
      if (q < num_vectors) cuda::store_vec<W, V>(y + q * V, v[u]);
    }
  }
}

template <typename W, typename IndexT>
void launch_repeat_copy(const at::Tensor& x, const at::Tensor& out, const TiledLayout& t, const RepeatChoice& c) {
  const int v = c.vec_bytes / int(sizeof(W));
  const IndexT num_vectors = static_cast<IndexT>(t.output_numel() / v);
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(num_vectors, kThreads * kUnroll),
                                           int64_t(cuda::num_sms()) * (2048 / kThreads) * 4);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto* src = static_cast<const W*>(x.const_data_ptr());
  auto* dst = static_cast<W*>(out.mutable_data_ptr());
  if (v == 1) {
    repeat_copy_kernel<W, 1, IndexT><<<blocks, kThreads, 0, stream>>>(src, dst, TileIndexer<IndexT>(t), num_vectors);
  } else {
    constexpr int kV = 16 / sizeof(W) > 0 ? 16 / sizeof(W) : 1;
    repeat_copy_kernel<W, kV, IndexT><<<blocks, kThreads, 0, stream>>>(src, dst, TileIndexer<IndexT>(t), num_vectors);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename IndexT>
void repeat_copy_by_size(const at::Tensor& x, const at::Tensor& out, const TiledLayout& t, const RepeatChoice& c) {
  switch (x.element_size()) {
    case 1: return launch_repeat_copy<uint8_t, IndexT>(x, out, t, c);
    case 2: return launch_repeat_copy<uint16_t, IndexT>(x, out, t, c);
    case 4: return launch_repeat_copy<uint32_t, IndexT>(x, out, t, c);
    case 8: return launch_repeat_copy<uint64_t, IndexT>(x, out, t, c);
    case 16: return launch_repeat_copy<uint4, IndexT>(x, out, t, c);
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, kRepeatOp, ": element size ", x.element_size(), " is not supported");
  }
}

// Inputs that are not 16-byte aligned (views with an offset) are copied once, so
// the kernel choice depends on the problem alone.
at::Tensor aligned_contiguous(const at::Tensor& t) {
  auto c = t.contiguous();
  return cuda::is_aligned(c.const_data_ptr(), 16) ? c : c.clone();
}

void check_out_aligned(const char* op, const char* name, const at::Tensor& out) {
  TORCH_CHECK_VALUE(out.numel() == 0 || (out.is_contiguous() && cuda::is_aligned(out.const_data_ptr(), 16)), op,
                    ": ", name, " must be contiguous and 16-byte aligned on CUDA");
}

void repeat_out_cuda(const at::Tensor& self, at::IntArrayRef repeats, const at::Tensor& out) {
  const auto shape = repeat_output_shape(kRepeatOp, self.sizes(), repeats);
  check_out(kRepeatOp, "out", out, shape, self.scalar_type(), self.device());
  check_out_aligned(kRepeatOp, "out", out);
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  const auto t = collapse_tiling(kRepeatOp, self.sizes(), repeats);
  const auto c = choose_repeat(t, self.element_size());
  const auto x = aligned_contiguous(self);
  if (c.index32) {
    repeat_copy_by_size<uint32_t>(x, out, t, c);
  } else {
    repeat_copy_by_size<uint64_t>(x, out, t, c);
  }
}

at::Tensor repeat_cuda(const at::Tensor& self, at::IntArrayRef repeats) {
  auto out = at::empty(repeat_output_shape(kRepeatOp, self.sizes(), repeats), self.options());
  repeat_out_cuda(self, repeats, out);
  return out;
}

// ---------------------------------------------------------------------------
// Backward: dx[c] = sum_{k in tiles, row-major over the repeat grid} grad[base(c) + offset(k)],
// base(c) = sum_d c_d * out_stride_d, offset(k) = sum_d k_d * s_d * out_stride_d.
// One thread owns V consecutive dx elements and one contiguous range of tiles;
// it walks the tiles in order with an odometer (no division per tile). With one
// split it writes dx; with several, each writes an acc_t partial and a second
// kernel adds the partials in split order. No atomics: bit-stable run to run.

template <typename IndexT>
struct TileWalker {
  int ndim;
  IntDivider<IndexT> in_extent[kMaxTileDims];  // s_d, to split c into digits
  IndexT out_stride[kMaxTileDims];             // grad elements per step of output dim d
  IndexT step[kMaxTileDims];                   // s_d * out_stride_d: one tile further along d
  IndexT repeat[kMaxTileDims];

  explicit TileWalker(const TiledLayout& t) : ndim(t.ndim) {
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      in_extent[d] = IntDivider<IndexT>(static_cast<IndexT>(t.size[d]));
      out_stride[d] = static_cast<IndexT>(stride);
      step[d] = static_cast<IndexT>(t.size[d] * stride);
      repeat[d] = static_cast<IndexT>(t.repeat[d]);
      stride *= t.size[d] * t.repeat[d];
    }
  }
};

template <typename T, typename AccT, int V, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    repeat_tile_sum_kernel(const T* __restrict__ grad, T* __restrict__ dx, AccT* __restrict__ partials,
                           TileWalker<IndexT> w, IndexT num_vectors, IndexT tiles, IndexT tiles_per_split) {
  const IndexT vec = IndexT(blockIdx.x) * kThreads + threadIdx.x;
  if (vec >= num_vectors) return;
  const IndexT split = blockIdx.y;
  const IndexT c = vec * V;

  IndexT base = 0, rem = c;
  for (int d = w.ndim - 1; d >= 0; --d) {
    const auto q = w.in_extent[d].divmod(rem);
    rem = q.div;
    base += q.mod * w.out_stride[d];
  }
  const IndexT k_begin = split * tiles_per_split;
  const IndexT k_end = k_begin + tiles_per_split < tiles ? k_begin + tiles_per_split : tiles;

  // Odometer over the repeat grid, started at k_begin. The innermost digit lives
  // in a register; outer digits change only on a wrap.
  IndexT digit[kMaxTileDims];
  IndexT offset = 0;
  rem = k_begin;
  for (int d = w.ndim - 1; d >= 0; --d) {
    digit[d] = rem % w.repeat[d];
    rem /= w.repeat[d];
    offset += digit[d] * w.step[d];
  }
  const int last = w.ndim - 1;
  const IndexT last_step = w.step[last], last_repeat = w.repeat[last];
  IndexT last_digit = digit[last];
  auto advance = [&]() {
    offset += last_step;
    if (++last_digit < last_repeat) return;
    offset -= last_step * last_repeat;
    last_digit = 0;
    for (int d = last - 1; d >= 0; --d) {
      offset += w.step[d];
      if (++digit[d] < w.repeat[d]) return;
      offset -= w.step[d] * w.repeat[d];
      digit[d] = 0;
    }
  };

  AccT acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = AccT(0);
  const T* g = grad + base;
  for (IndexT k = k_begin; k < k_end; k += kUnroll) {
    cuda::Vec<T, V> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u < k_end) {
        v[u] = cuda::load_vec<T, V>(g + offset);
        advance();
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u < k_end) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += static_cast<AccT>(v[u].v[i]);
      }
    }
  }

  if (partials == nullptr) {
    cuda::Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(acc[i]);
    cuda::store_vec<T, V>(dx + c, out);
  } else {
    AccT* p = partials + split * (num_vectors * V) + c;
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = acc[i];
  }
}

// dx[c] = sum_{s = 0..splits-1} partials[s][c], in split order.
template <typename T, typename AccT, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    repeat_combine_kernel(const AccT* __restrict__ partials, T* __restrict__ dx, IndexT n, IndexT splits) {
  const IndexT stride = IndexT(gridDim.x) * kThreads;
  for (IndexT c = IndexT(blockIdx.x) * kThreads + threadIdx.x; c < n; c += stride) {
    AccT acc = 0;
    for (IndexT s = 0; s < splits; ++s) acc += partials[s * n + c];
    dx[c] = static_cast<T>(acc);
  }
}

template <typename T, typename AccT, int V, typename IndexT>
void launch_repeat_tile_sum(const at::Tensor& grad, const at::Tensor& dx, const at::Tensor& workspace,
                            const TiledLayout& t, const RepeatChoice& c) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const IndexT n = static_cast<IndexT>(t.input_numel());
  const IndexT num_vectors = n / V;
  AccT* partials = c.splits > 1 ? reinterpret_cast<AccT*>(workspace.mutable_data_ptr()) : nullptr;
  const dim3 grid(ceil_div<int64_t>(num_vectors, kThreads), c.splits);
  repeat_tile_sum_kernel<T, AccT, V, IndexT><<<grid, kThreads, 0, stream>>>(
      grad.const_data_ptr<T>(), dx.mutable_data_ptr<T>(), partials, TileWalker<IndexT>(t),
      num_vectors, static_cast<IndexT>(t.tiles()), static_cast<IndexT>(c.tiles_per_split));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (partials != nullptr) {
    const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(n, kThreads), int64_t(cuda::num_sms()) * 8);
    repeat_combine_kernel<T, AccT, IndexT><<<blocks, kThreads, 0, stream>>>(partials, dx.mutable_data_ptr<T>(), n,
                                                                          static_cast<IndexT>(c.splits));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

int64_t repeat_backward_workspace_bytes(const TiledLayout& t, const RepeatChoice& c, int64_t acc_bytes) {
  return c.splits > 1 ? c.splits * t.input_numel() * acc_bytes : 0;
}

int64_t acc_bytes_of(c10::ScalarType dtype) { return dtype == at::kDouble ? 8 : 4; }

void repeat_backward_out_cuda(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape,
                              const at::Tensor& grad_input, const at::Tensor& workspace) {
  check_repeat_backward(grad, repeats, input_shape);
  check_out(kRepeatBackwardOp, "grad_input", grad_input, input_shape, grad.scalar_type(), grad.device());
  check_out_aligned(kRepeatBackwardOp, "grad_input", grad_input);
  if (grad_input.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(grad.device());
  if (grad.numel() == 0) {
    grad_input.zero_();
    return;
  }
  const auto t = collapse_tiling(kRepeatBackwardOp, input_shape, repeats);
  const auto c = choose_repeat_backward(t, grad.element_size());
  const int64_t need = repeat_backward_workspace_bytes(t, c, acc_bytes_of(grad.scalar_type()));
  if (need > 0) {
    check_same_device(kRepeatBackwardOp, "grad", grad, "workspace", workspace);
    TORCH_CHECK_VALUE(workspace.is_contiguous() && workspace.nbytes() >= static_cast<size_t>(need) &&
                          cuda::is_aligned(workspace.const_data_ptr(), 16),
                      kRepeatBackwardOp, ": workspace has ", workspace.nbytes(), " bytes, needs ", need,
                      " contiguous 16-byte-aligned bytes");
  }
  const auto g = aligned_contiguous(grad);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "repeat_backward_cuda", [&] {
    constexpr int kV = 16 / sizeof(scalar_t);
    const bool vec = c.vec_bytes == 16;
    if (c.index32) {
      vec ? launch_repeat_tile_sum<scalar_t, acc_t, kV, uint32_t>(g, grad_input, workspace, t, c)
          : launch_repeat_tile_sum<scalar_t, acc_t, 1, uint32_t>(g, grad_input, workspace, t, c);
    } else {
      vec ? launch_repeat_tile_sum<scalar_t, acc_t, kV, uint64_t>(g, grad_input, workspace, t, c)
          : launch_repeat_tile_sum<scalar_t, acc_t, 1, uint64_t>(g, grad_input, workspace, t, c);
    }
  });
}

at::Tensor repeat_backward_cuda(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape) {
  check_repeat_backward(grad, repeats, input_shape);
  auto grad_input = at::empty(input_shape, grad.options());
  int64_t need = 0;
  if (grad.numel() > 0 && grad_input.numel() > 0) {
    const c10::cuda::CUDAGuard guard(grad.device());
    const auto t = collapse_tiling(kRepeatBackwardOp, input_shape, repeats);
    need = repeat_backward_workspace_bytes(t, choose_repeat_backward(t, grad.element_size()),
                                           acc_bytes_of(grad.scalar_type()));
  }
  const auto workspace = at::empty({need}, grad.options().dtype(at::kByte));
  repeat_backward_out_cuda(grad, repeats, input_shape, grad_input, workspace);
  return grad_input;
}

// problem = [input dims, *input_shape, *repeats]
TiledLayout layout_of_problem(const char* op, c10::IntArrayRef problem) {
  TORCH_CHECK_VALUE(!problem.empty() && problem[0] >= 0 && int64_t(problem.size()) >= 1 + problem[0], op,
                    ": malformed problem ", problem);
  const auto input_shape = problem.slice(1, problem[0]);
  const auto repeats = problem.slice(1 + problem[0]);
  repeat_output_shape(op, input_shape, repeats);
  return collapse_tiling(op, input_shape, repeats);
}

KernelChoice repeat_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto t = layout_of_problem(kRepeatOp, problem);
  return {repeat_variant(choose_repeat(t, c10::elementSize(dtype))), 0};
}

KernelChoice repeat_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto t = layout_of_problem(kRepeatBackwardOp, problem);
  const auto c = choose_repeat_backward(t, c10::elementSize(dtype));
  const bool empty = t.input_numel() == 0 || t.tiles() == 0;
  return {repeat_backward_variant(c), empty ? 0 : repeat_backward_workspace_bytes(t, c, acc_bytes_of(dtype))};
}

BARACUDA_REGISTER_VARIANT("repeat", c10::DeviceType::CUDA, repeat_choice);
BARACUDA_REGISTER_VARIANT("repeat_backward", c10::DeviceType::CUDA, repeat_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("repeat", &baracuda::repeat_cuda);
  m.impl("repeat.out", &baracuda::repeat_out_cuda);
  m.impl("repeat_backward", &baracuda::repeat_backward_cuda);
  m.impl("repeat_backward.out", &baracuda::repeat_backward_out_cuda);
}
