// repeat family, CUDA kernels.
//
// Both directions walk the same geometry (baracuda/repeat.h): input element c
// appears in tile k of the output at
//   base(c) + offset(k),  base(c) = sum_d c_d * out_stride_d,  offset(k) = sum_d k_d * s_d * out_stride_d,
// with c_d the digits of c over the input extents s_d and k_d the digits of k
// over the repeat counts r_d. A thread owns V consecutive input elements (one
// vector of 16, 8 or 4 bytes: the widest that divides the innermost run) and a
// contiguous range of tiles, which it visits in order with an odometer (no
// division per tile). The forward moves opaque words of the vector's width.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <string>

#include "baracuda/checks.h"
#include "baracuda/cuda_utils.cuh"
#include "baracuda/dispatch.h"
#include "baracuda/repeat.h"
#include "baracuda/repeat_policy.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

using at::cuda::detail::IntDivider;
using cuda::ceil_div;

// The choice of kernel and its launch shape: repeat_forward_config and
// repeat_backward_config (baracuda/repeat_policy.h), with the device's facts.
constexpr int kThreads = kRepeatThreads;
constexpr int kTileLanes = kRepeatTileLanes;

// ---------------------------------------------------------------------------
// Geometry on the device, on D dim slots (D = 2, 4 or 8: kernels are built for
// each; dims_for() picks the smallest D >= ndim). Collapsed dim e sits in slot
// D - ndim + e; the slots before it are padding (extent 1, repeat 1), so the
// innermost dim is always slot D - 1, loops over slots are unrolled with
// compile-time indices (registers and kernel parameters, never local memory),
// and unused slots cost nothing.
template <typename IndexT, int D>
struct TileOdometer;

template <typename IndexT, int D>
struct TileWalker {
  int first;                       // D - ndim: the first used slot
  IntDivider<IndexT> in_extent[D];   // s_d
  IntDivider<IndexT> out_extent[D];  // s_d * r_d
  IntDivider<IndexT> repeat[D];      // r_d
  IndexT in_stride[D];               // input elements per step of slot d
  IndexT out_stride[D];              // output elements per step of slot d
  IndexT step[D];                    // s_d * out_stride_d: one tile further along d
  IndexT wrap[D];                    // step_d * r_d: back to tile 0 along d
  IndexT first_offsets[4];           // offset(k) of tiles 0..3; past the last tile, the last tile's

  explicit TileWalker(const TiledLayout& t) : first(D - t.ndim) {
    uint64_t in = 1, out = 1;
    for (int d = D - 1; d >= 0; --d) {
      const bool used = d >= first;
      const uint64_t s = used ? std::max<int64_t>(t.size[d - first], 1) : 1;
      const uint64_t r = used ? std::max<int64_t>(t.repeat[d - first], 1) : 1;
      in_extent[d] = IntDivider<IndexT>(static_cast<IndexT>(s));
      out_extent[d] = IntDivider<IndexT>(static_cast<IndexT>(s * r));
      repeat[d] = IntDivider<IndexT>(static_cast<IndexT>(r));
      in_stride[d] = static_cast<IndexT>(in);
      out_stride[d] = static_cast<IndexT>(out);
      step[d] = static_cast<IndexT>(s * out);
      wrap[d] = static_cast<IndexT>(s * out * r);
      in *= s;
      out *= s * r;
    }
    const auto last = static_cast<IndexT>(std::max<int64_t>(t.tiles(), 1) - 1);
    for (IndexT k = 0; k < 4; ++k) first_offsets[k] = TileOdometer<IndexT, D>(*this, std::min(k, last)).offset;
  }

  // Output offset of input element c in tile 0. Slot 0 takes what is left of c
  // (0 when it is padding), so it needs no division.
  __device__ __forceinline__ IndexT base(IndexT c) const {
    IndexT b = 0;
#pragma unroll
    for (int d = D - 1; d >= 1; --d) {
      if (d >= first) {
        const auto q = in_extent[d].divmod(c);
        c = q.div;
        b += q.mod * out_stride[d];
      }
    }
    return b + c * out_stride[0];
  }

  // Input offset of output element q: sum_d ((q_d mod (s_d r_d)) mod s_d) * in_stride_d.
  __device__ __forceinline__ IndexT source(IndexT q) const {
    IndexT src = 0;
#pragma unroll
    for (int d = D - 1; d >= 1; --d) {
      if (d >= first) {
        const auto o = out_extent[d].divmod(q);
        q = o.div;
        src += in_extent[d].mod(o.mod) * in_stride[d];
      }
    }
    return src + in_extent[0].mod(q) * in_stride[0];
  }
};

// Visits tiles k, k+1, ... in row-major order over the repeat grid, keeping
// offset(k). The innermost digit changes every step; outer digits only when it
// wraps. Slot 0's digit is not kept: it only changes once k passes the last tile.
template <typename IndexT, int D>
struct TileOdometer {
  IndexT digit[D];
  IndexT offset = 0;

  C10_HOST_DEVICE TileOdometer(const TileWalker<IndexT, D>& w, IndexT k) {
#pragma unroll
    for (int d = D - 1; d >= 1; --d) {
      const auto q = w.repeat[d].divmod(k);
      digit[d] = q.mod;
      k = q.div;
      offset += q.mod * w.step[d];
    }
    digit[0] = 0;
    offset += k * w.step[0];
  }

  __device__ __forceinline__ void advance(const TileWalker<IndexT, D>& w) {
    offset += w.step[D - 1];
    if (++digit[D - 1] != w.repeat[D - 1].divisor) return;
    digit[D - 1] = 0;
    offset -= w.wrap[D - 1];
#pragma unroll
    for (int d = D - 2; d >= 1; --d) {
      offset += w.step[d];
      if (++digit[d] != w.repeat[d].divisor) return;
      digit[d] = 0;
      offset -= w.wrap[d];
    }
    offset += w.step[0];
  }
};

// Calls f(std::integral_constant<int, D>) with the smallest D in {2, 4, 8} that
// holds the layout's dims.
template <typename F>
void with_dims(const TiledLayout& t, F&& f) {
  static_assert(kMaxTileDims == 8, "with_dims covers up to 8 dims");
  if (t.ndim <= 2) return f(std::integral_constant<int, 2>{});
  if (t.ndim <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

template <typename IndexT>
__device__ __forceinline__ IndexT min_index(IndexT a, IndexT b) {
  return a < b ? a : b;
}

// ---------------------------------------------------------------------------
// Forward kernels: y[base(c) + offset(k)] = x[c] for every tile k, over words W of
// the vector's width (words_of: the same layout counted in words). y is stored with
// streaming hints (written once, not read back here), faster than plain stores.

// Broadcast: thread (word c, split s) reads x[c] once and stores it into tiles
// [s * tiles_per_split, (s + 1) * tiles_per_split).
template <typename W, int D, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    repeat_broadcast_kernel(const W* __restrict__ x, W* __restrict__ y, TileWalker<IndexT, D> w, IndexT num_words,
                            IndexT tiles, IndexT tiles_per_split) {
  const IndexT c = IndexT(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= num_words) return;
  const IndexT k_begin = IndexT(blockIdx.y) * tiles_per_split;
  const IndexT k_end = min_index(tiles, k_begin + tiles_per_split);
  const W v = x[c];
  W* out = y + w.base(c);
  TileOdometer<IndexT, D> odo(w, k_begin);
  for (IndexT k = k_begin; k < k_end; ++k) {
    cuda::store_streaming(out + odo.offset, v);
    odo.advance(w);
  }
}

// Gather: y[q] = x[source(q)], one output word a thread (a grid-stride loop
// only past 2^31 - 1 CTAs), faster than 4 words a thread on a capped grid.
template <typename W, int D, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    repeat_gather_kernel(const W* __restrict__ x, W* __restrict__ y, TileWalker<IndexT, D> w, IndexT num_words) {
  const IndexT stride = IndexT(gridDim.x) * kThreads;
  for (IndexT q = IndexT(blockIdx.x) * kThreads + threadIdx.x; q < num_words; q += stride) {
    cuda::store_streaming(y + q, x[w.source(q)]);
  }
}

// The layout counted in words of `word_bytes` (a divisor of the innermost run):
// repeating elements and repeating the words they pack are the same copy.
TiledLayout words_of(TiledLayout t, int64_t elem_bytes, int64_t word_bytes) {
  t.size[t.ndim - 1] = t.size[t.ndim - 1] * elem_bytes / word_bytes;
  return t;
}

template <typename W, typename IndexT>
void launch_repeat(const at::Tensor& x, const at::Tensor& out, const TiledLayout& t, const RepeatLaunchConfig& c) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto* src = static_cast<const W*>(x.const_data_ptr());
  auto* dst = static_cast<W*>(out.mutable_data_ptr());
  const TiledLayout words = words_of(t, x.element_size(), sizeof(W));
  with_dims(words, [&](auto dims) {
    constexpr int D = decltype(dims)::value;
    const TileWalker<IndexT, D> walker(words);
    if (c.kind == RepeatKernel::kBroadcast) {
      const auto num_words = static_cast<IndexT>(words.input_numel());
      const dim3 grid(c.blocks, c.splits);
      repeat_broadcast_kernel<W, D, IndexT><<<grid, c.threads, 0, stream>>>(
          src, dst, walker, num_words, static_cast<IndexT>(words.tiles()), static_cast<IndexT>(c.tiles_per_split));
    } else {
      const auto num_words = static_cast<IndexT>(words.output_numel());
      repeat_gather_kernel<W, D, IndexT><<<c.blocks, c.threads, 0, stream>>>(src, dst, walker, num_words);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// Elements are moved as opaque words of the vector's width.
template <typename IndexT>
void launch_repeat_words(const at::Tensor& x, const at::Tensor& out, const TiledLayout& t, const RepeatLaunchConfig& c) {
  switch (c.vec_bytes) {
    case 1: return launch_repeat<uint8_t, IndexT>(x, out, t, c);
    case 2: return launch_repeat<uint16_t, IndexT>(x, out, t, c);
    case 4: return launch_repeat<uint32_t, IndexT>(x, out, t, c);
    case 8: return launch_repeat<uint64_t, IndexT>(x, out, t, c);
    case 16: return launch_repeat<uint4, IndexT>(x, out, t, c);
    default: BARACUDA_CHECK_NOT_IMPLEMENTED(false, kRepeatOp, ": element size ", x.element_size(), " is not supported");
  }
}

void repeat_out_cuda(const at::Tensor& self, at::IntArrayRef repeats, const at::Tensor& out) {
  const auto shape = repeat_output_shape(kRepeatOp, self.sizes(), repeats);
  check_out(kRepeatOp, "out", out, shape, self.scalar_type(), self.device());
  cuda::check_out_aligned(kRepeatOp, "out", out);
  check_no_overlap(kRepeatOp, {{"out", out}}, {{"self", self}});
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  cuda::check_device_arch(kRepeatOp);
  const auto t = collapse_tiling(kRepeatOp, self.sizes(), repeats);
  const auto c = repeat_forward_config(t, self.scalar_type(), cuda::device_facts());
  const auto x = cuda::aligned_contiguous(self);
  c.index32 ? launch_repeat_words<uint32_t>(x, out, t, c) : launch_repeat_words<uint64_t>(x, out, t, c);
}

at::Tensor repeat_cuda(const at::Tensor& self, at::IntArrayRef repeats) {
  auto out = at::empty(repeat_output_shape(kRepeatOp, self.sizes(), repeats), self.options());
  repeat_out_cuda(self, repeats, out);
  return out;
}

// ---------------------------------------------------------------------------
// Backward: dx[c] = sum_{k in tiles, row-major over the repeat grid} grad[base(c) + offset(k)].
// Block = (TX vector lanes) x (L tile lanes). Thread (tx, l) of split s sums, in
// order, the l-th contiguous chunk of the split's tile range, U tiles per step
// (OneStep: all of a thread's tiles, at most U, no splits, no lanes, in one step at
// offsets the host computed, TileWalker::first_offsets, instead of an odometer);
// the L lane sums are added in lane order through shared memory. With one split
// the block writes dx, otherwise an acc_t partial per split, which
// repeat_combine_kernel, launched early, adds in split order. No atomics: bit-stable run to run.
// The U loads of a step are issued unconditionally (past the chunk's last tile
// a load re-reads it and its add is skipped) and held as raw words until the
// adds: a conditional load whose bf16 halves are unpacked right after it would
// wait for the load before the next one is issued. grad is read once, with
// streaming hints; dx is written once, evict-first when it is larger than a third
// of L2 (repeat_backward_config).

template <typename T, typename AccT, int V>
__device__ __forceinline__ void add_raw(AccT (&acc)[V], const cuda::RawVec<T, V>& raw) {
  const auto v = cuda::from_raw<T, V>(raw);
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] += static_cast<AccT>(v.v[i]);
}

template <typename T, typename AccT, int V, int L, int D, int U, typename IndexT, bool OneStep>
__global__ void __launch_bounds__(kThreads)
    repeat_tile_sum_kernel(const T* __restrict__ grad, T* __restrict__ dx, AccT* __restrict__ partials,
                           TileWalker<IndexT, D> w, IndexT num_vectors, IndexT tiles, IndexT tiles_per_split,
                           bool evict_first_dx) {
  cuda::start_next_grid();  // repeat_combine_kernel may take free slots now
  constexpr int TX = kThreads / L;
  const int tx = threadIdx.x % TX, lane = threadIdx.x / TX;
  const IndexT vec = IndexT(blockIdx.x) * TX + tx;
  const bool active = vec < num_vectors;
  const IndexT c = vec * V;

  const IndexT split_begin = IndexT(blockIdx.y) * tiles_per_split;
  const IndexT split_end = min_index(tiles, split_begin + tiles_per_split);
  const IndexT per_lane = ceil_div<IndexT>(split_end - split_begin, IndexT(L));
  const IndexT k_begin = min_index(split_end, split_begin + IndexT(lane) * per_lane);
  const IndexT k_end = min_index(split_end, k_begin + per_lane);

  AccT acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = AccT(0);
  if (active && k_begin < k_end) {
    const T* g = grad + w.base(c);
    if constexpr (OneStep) {
      static_assert(L == 1, "one step: no tile lanes");
      cuda::RawVec<T, V> raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) raw[u] = cuda::load_raw_streaming<T, V>(g + w.first_offsets[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u == 0 || u < k_end) add_raw<T, AccT, V>(acc, raw[u]);
      }
    } else {
      TileOdometer<IndexT, D> odo(w, k_begin);
#pragma unroll 1
      for (IndexT k = k_begin; k < k_end; k += U) {
        cuda::RawVec<T, V> raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          raw[u] = cuda::load_raw_streaming<T, V>(g + odo.offset);
          if (k + u + 1 < k_end) odo.advance(w);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (u == 0 || k + u < k_end) add_raw<T, AccT, V>(acc, raw[u]);
        }
      }
    }
  }

  if constexpr (L > 1) {
    __shared__ AccT lane_sums[L][TX][V];
#pragma unroll
    for (int i = 0; i < V; ++i) lane_sums[lane][tx][i] = acc[i];
    __syncthreads();
    if (lane != 0) return;
    for (int l = 1; l < L; ++l) {
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += lane_sums[l][tx][i];
    }
  }
  if (!active) return;
  if (partials == nullptr) {
    cuda::Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(acc[i]);
    if (evict_first_dx) {
      cuda::store_vec_streaming<T, V>(dx + c, out);
    } else {
      cuda::store_vec<T, V>(dx + c, out);
    }
  } else {
    AccT* p = partials + IndexT(blockIdx.y) * (num_vectors * V) + c;
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = acc[i];
  }
}

// dx[c] = sum_{s} partials[s][c] in split order: thread (tx, l) sums the l-th
// contiguous chunk of splits, then the chunk sums are added in order. Launched
// early: it waits here for repeat_tile_sum_kernel to end.
template <typename T, typename AccT, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    repeat_combine_kernel(const AccT* __restrict__ partials, T* __restrict__ dx, IndexT n, IndexT splits) {
  cuda::wait_for_previous_grid();
  constexpr int TX = kThreads / kTileLanes;
  const int tx = threadIdx.x % TX, lane = threadIdx.x / TX;
  const IndexT c = IndexT(blockIdx.x) * TX + tx;
  const IndexT per_lane = ceil_div<IndexT>(splits, IndexT(kTileLanes));
  const IndexT s_begin = min_index(splits, IndexT(lane) * per_lane);
  const IndexT s_end = min_index(splits, s_begin + per_lane);
  AccT acc = 0;
  if (c < n) {
    for (IndexT s = s_begin; s < s_end; ++s) acc += partials[s * n + c];
  }
  __shared__ AccT lane_sums[kTileLanes][TX];
  lane_sums[lane][tx] = acc;
  __syncthreads();
  if (lane != 0 || c >= n) return;
  for (int l = 1; l < kTileLanes; ++l) acc += lane_sums[l][tx];
  dx[c] = static_cast<T>(acc);
}

template <typename T, typename AccT, int V, typename IndexT>
void launch_repeat_tile_sum(const at::Tensor& grad, const at::Tensor& dx, const at::Tensor& workspace,
                            const TiledLayout& t, const RepeatLaunchConfig& c) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const IndexT n = static_cast<IndexT>(t.input_numel());
  const IndexT num_vectors = n / V;
  AccT* partials = c.splits > 1 ? reinterpret_cast<AccT*>(workspace.mutable_data_ptr()) : nullptr;
  const auto tiles = static_cast<IndexT>(t.tiles());
  const auto per_split = static_cast<IndexT>(c.tiles_per_split);
  const dim3 grid(c.blocks, c.splits);
  const T* g = grad.const_data_ptr<T>();
  T* out = dx.mutable_data_ptr<T>();
  with_dims(t, [&](auto dims) {
    constexpr int D = decltype(dims)::value;
    const TileWalker<IndexT, D> w(t);
    // Past one step (more than 4 tiles a thread, or tile lanes) U = 4 (repeat_backward_config).
    const auto run = [&](auto kernel) {
      kernel<<<grid, c.threads, 0, stream>>>(g, out, partials, w, num_vectors, tiles, per_split, c.evict_first_dx);
    };
    if (c.tile_lanes == kTileLanes) {
      run(repeat_tile_sum_kernel<T, AccT, V, kTileLanes, D, 4, IndexT, false>);
    } else if (!c.one_step) {
      run(repeat_tile_sum_kernel<T, AccT, V, 1, D, 4, IndexT, false>);
    } else if (c.unroll == 4) {
      run(repeat_tile_sum_kernel<T, AccT, V, 1, D, 4, IndexT, true>);
    } else if (c.unroll == 2) {
      run(repeat_tile_sum_kernel<T, AccT, V, 1, D, 2, IndexT, true>);
    } else {
      run(repeat_tile_sum_kernel<T, AccT, V, 1, D, 1, IndexT, true>);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (partials != nullptr) {
    cuda::launch(repeat_combine_kernel<T, AccT, IndexT>,
                 {.grid = dim3(c.combine_blocks), .block = dim3(c.threads), .early = true},
                 partials, dx.mutable_data_ptr<T>(), n, static_cast<IndexT>(c.splits));
  }
}

// V = c.vec_bytes / sizeof(T) elements per vector: 16, 8 or 4 bytes, or one element.
template <typename T, typename AccT, typename IndexT>
void launch_repeat_tile_sum_vectors(const at::Tensor& grad, const at::Tensor& dx, const at::Tensor& workspace,
                                    const TiledLayout& t, const RepeatLaunchConfig& c) {
  const auto with_v = [&](auto v) {
    constexpr int V = decltype(v)::value;
    if constexpr (V * sizeof(T) <= 16) launch_repeat_tile_sum<T, AccT, V, IndexT>(grad, dx, workspace, t, c);
  };
  switch (c.vec_bytes / sizeof(T)) {
    case 8: return with_v(std::integral_constant<int, 8>{});
    case 4: return with_v(std::integral_constant<int, 4>{});
    case 2: return with_v(std::integral_constant<int, 2>{});
    default: return with_v(std::integral_constant<int, 1>{});
  }
}

void repeat_backward_out_cuda(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape,
                              const at::Tensor& grad_input, const at::Tensor& workspace) {
  check_repeat_backward(grad, repeats, input_shape);
  check_out(kRepeatBackwardOp, "grad_input", grad_input, input_shape, grad.scalar_type(), grad.device());
  cuda::check_out_aligned(kRepeatBackwardOp, "grad_input", grad_input);
  check_no_overlap(kRepeatBackwardOp, {{"grad_input", grad_input}}, {{"grad", grad}});
  if (grad_input.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(grad.device());
  cuda::check_device_arch(kRepeatBackwardOp);
  if (grad.numel() == 0) {
    grad_input.zero_();
    return;
  }
  const auto t = collapse_tiling(kRepeatBackwardOp, input_shape, repeats);
  const auto c = repeat_backward_config(t, grad.scalar_type(), cuda::device_facts());
  const int64_t need = c.workspace_bytes;
  check_workspace(kRepeatBackwardOp, workspace, need, 16, grad.device(),
                  {{"grad", grad}, {"grad_input", grad_input}});
  const auto g = cuda::aligned_contiguous(grad);
  BARACUDA_DISPATCH_FLOATING(grad.scalar_type(), "repeat_backward_cuda", [&] {
    c.index32 ? launch_repeat_tile_sum_vectors<scalar_t, acc_t, uint32_t>(g, grad_input, workspace, t, c)
              : launch_repeat_tile_sum_vectors<scalar_t, acc_t, uint64_t>(g, grad_input, workspace, t, c);
  });
}

at::Tensor repeat_backward_cuda(const at::Tensor& grad, at::IntArrayRef repeats, at::IntArrayRef input_shape) {
  check_repeat_backward(grad, repeats, input_shape);
  auto grad_input = at::empty(input_shape, grad.options());
  const c10::cuda::CUDAGuard guard(grad.device());
  const auto t = collapse_tiling(kRepeatBackwardOp, input_shape, repeats);
  const int64_t need = repeat_backward_config(t, grad.scalar_type(), cuda::device_facts()).workspace_bytes;
  const auto workspace = at::empty({need}, grad.options().dtype(at::kByte));
  repeat_backward_out_cuda(grad, repeats, input_shape, grad_input, workspace);
  return grad_input;
}

// The Plan's variant: the launch config, described.
KernelChoice repeat_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = repeat_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

KernelChoice repeat_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = repeat_backward_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
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
