// embedding_bag family, CUDA: the forward (a team per bag gathers its rows).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "baracuda/variant.h"
#include "common.cuh"

namespace baracuda {
namespace {

constexpr int kUnroll = 8;  // bag entries whose loads are in flight together

// ---------------------------------------------------------------------------
// Forward. One team of `team` threads per bag; each thread owns `V` adjacent
// columns (one 16-byte vector when D allows) and walks the bag's entries in
// position order, kUnroll entries' loads in flight at a time (kMax: max mode,
// a separate instantiation, so that sum/mean carry no max state; both held to
// three blocks per SM, 85 registers: max mode at one block per SM ran at 0.59 of
// copy, at three 0.66):
//   sum:  acc = sum_i w_i * weight[idx_i, cols]      (w_i = per_sample_weights[i] or 1)
//   mean: acc = sum_i weight[idx_i, cols] / count     (0 when count == 0)
//   max:  acc = weight[idx_first, cols], then replaced where weight[idx_i, cols] > acc
// over the bag's entries with idx_i != padding_idx, accumulated in AccT. An
// out-of-range idx_i contributes nothing and flags the bag: NaN row, bag_size -1.
// The team also writes offset2bag for its positions (bag 0 and the last bag
// write -1 for the positions before / after every bag).

template <typename T, typename AccT, typename IndexT, int V, bool kMax>
__global__ void __launch_bounds__(kThreads, 3)
    bag_forward_kernel(const T* __restrict__ weight, const IndexT* __restrict__ indices,
                       const IndexT* __restrict__ offsets, const T* __restrict__ psw, T* __restrict__ out,
                       int64_t* __restrict__ offset2bag, int64_t* __restrict__ bag_size,
                       int64_t* __restrict__ max_pos, BagGeometry g, int team) {
  const int lane = threadIdx.x & (team - 1);
  const int64_t b = int64_t(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  if (b >= g.num_bags) return;
  int64_t begin, end;
  bool bad;
  bag_range(offsets, b, g.num_offsets, g.fixed_len, g.num_indices, begin, end, bad);
  for (int64_t i = begin + lane; i < end; i += team) offset2bag[i] = b;
  if (b == 0) {
    for (int64_t i = lane; i < begin; i += team) offset2bag[i] = -1;
  }
  if (b == g.num_bags - 1) {
    for (int64_t i = end + lane; i < g.num_indices; i += team) offset2bag[i] = -1;
  }

  const int64_t D = g.dim;
  const int64_t num_vecs = D / V;
  for (int64_t cv = lane; cv < (num_vecs > 0 ? num_vecs : 1); cv += team) {
    const bool has_col = cv < num_vecs;
    const int64_t col = cv * V;
    AccT acc[V];
    int64_t pos[V];  // max mode only
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[k] = AccT(0);
      pos[k] = -1;
    }
    int64_t count = 0;
    bool bag_bad = bad;
    for (int64_t i = begin; i < end; i += kUnroll) {
      cuda::RawVec<T, V> raw[kUnroll];
      bool use[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const bool present = i + u < end;
        const int64_t idx = present ? static_cast<int64_t>(indices[i + u]) : 0;
        const bool pad = g.padding_idx >= 0 && idx == g.padding_idx;
        const bool in_range = idx >= 0 && idx < g.num_weights;
        bag_bad |= present && !pad && !in_range;
        use[u] = present && !pad && in_range;
        if (use[u] && has_col) raw[u] = cuda::load_raw<T, V>(weight + idx * D + col);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (!use[u]) continue;
        if (has_col) {
          const auto w = cuda::from_raw<T, V>(raw[u]);
          if constexpr (kMax) {
#pragma unroll
            for (int k = 0; k < V; ++k) {
              const AccT v = static_cast<AccT>(w.v[k]);
              if (count == 0 || v > acc[k]) {
                acc[k] = v;
                pos[k] = i + u;
              }
            }
          } else {
            const AccT coef = psw != nullptr ? static_cast<AccT>(psw[i + u]) : AccT(1);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += coef * static_cast<AccT>(w.v[k]);
          }
        }
        ++count;
      }
    }
    if (has_col) {
      cuda::Vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        AccT r = acc[k];
        if (g.mode == kModeMean) r = count > 0 ? r / static_cast<AccT>(count) : AccT(0);
        if (bag_bad) r = static_cast<AccT>(NAN);
        o.v[k] = static_cast<T>(r);
      }
      cuda::store_vec<T, V>(out + b * D + col, o);
      if constexpr (kMax) {
#pragma unroll
        for (int k = 0; k < V; ++k) max_pos[b * D + col + k] = bag_bad ? -1 : pos[k];
      }
    }
    if (cv == 0) bag_size[b] = bag_bad ? -1 : count;
  }
}

EmbeddingBagProblem problem_of(const BagGeometry& g, bool per_sample_weights) {
  return {g.num_weights, g.dim, g.num_indices, g.num_bags, g.mode, per_sample_weights};
}

template <typename T, typename AccT, typename IndexT, int V>
void launch_bag_forward(const at::Tensor& weight, const at::Tensor& indices, const c10::optional<at::Tensor>& offsets,
                        const at::Tensor& psw, const BagGeometry& g, const EmbeddingBagLaunchConfig& c, const at::Tensor& output,
                        const at::Tensor& offset2bag, const at::Tensor& bag_size, const at::Tensor& max_positions) {
  const bool is_max = g.mode == kModeMax;
  auto* kernel = is_max ? bag_forward_kernel<T, AccT, IndexT, V, true> : bag_forward_kernel<T, AccT, IndexT, V, false>;
  kernel<<<c.blocks, c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      weight.const_data_ptr<T>(), indices.const_data_ptr<IndexT>(),
      offsets.has_value() ? offsets->const_data_ptr<IndexT>() : nullptr,
      psw.defined() ? psw.const_data_ptr<T>() : nullptr, output.mutable_data_ptr<T>(),
      offset2bag.mutable_data_ptr<int64_t>(), bag_size.mutable_data_ptr<int64_t>(),
      is_max ? max_positions.mutable_data_ptr<int64_t>() : nullptr, g, c.team);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void embedding_bag_out_cuda(const at::Tensor& weight, const at::Tensor& indices_in,
                            const c10::optional<at::Tensor>& offsets_in, int64_t mode,
                            const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                            int64_t padding_idx, const at::Tensor& output, const at::Tensor& offset2bag,
                            const at::Tensor& bag_size, const at::Tensor& max_positions) {
  const auto g = check_embedding_bag_out(
      weight, indices_in, offsets_in, mode, per_sample_weights, include_last_offset, padding_idx, output, offset2bag,
      bag_size, max_positions, [](const at::Tensor& out) { cuda::check_out_aligned(kEmbeddingBagOp, "output", out); });
  const c10::cuda::CUDAGuard guard(weight.device());
  cuda::check_device_arch(kEmbeddingBagOp);
  if (g.num_bags == 0) {
    if (offset2bag.numel() > 0) offset2bag.fill_(-1);
    return;
  }
  at::Tensor indices = indices_in.contiguous();
  c10::optional<at::Tensor> offsets = offsets_in;
  promote_indices_and_offsets(indices, offsets);
  if (offsets.has_value()) offsets = offsets->contiguous();
  const auto w = cuda::aligned_contiguous(weight);
  const auto psw = per_sample_weights.has_value() ? per_sample_weights->contiguous() : at::Tensor();
  const auto c = embedding_bag_forward_config(problem_of(g, psw.defined()), weight.scalar_type(), cuda::device_facts());
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embedding_bag_cuda", [&] {
    BARACUDA_DISPATCH_FLOATING(weight.scalar_type(), "embedding_bag_cuda", [&] {
      constexpr int kV = 16 / sizeof(scalar_t);
      if (c.vec == kV) {
        launch_bag_forward<scalar_t, acc_t, index_t, kV>(w, indices, offsets, psw, g, c, output, offset2bag,
                                                         bag_size, max_positions);
      } else {
        launch_bag_forward<scalar_t, acc_t, index_t, 1>(w, indices, offsets, psw, g, c, output, offset2bag,
                                                        bag_size, max_positions);
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_cuda(
    const at::Tensor& weight, const at::Tensor& indices, const c10::optional<at::Tensor>& offsets, int64_t mode,
    const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset, int64_t padding_idx) {
  const auto g = check_embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                     padding_idx);
  auto output = at::empty({g.num_bags, g.dim}, weight.options());
  auto offset2bag = at::empty({g.num_indices}, weight.options().dtype(at::kLong));
  auto bag_size = at::empty({g.num_bags}, weight.options().dtype(at::kLong));
  auto max_positions = at::empty(max_positions_shape(g), weight.options().dtype(at::kLong));
  embedding_bag_out_cuda(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, output,
                         offset2bag, bag_size, max_positions);
  return {output, offset2bag, bag_size, max_positions};
}

// The Plan's variant: the launch config, described.
KernelChoice embedding_bag_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = embedding_bag_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("embedding_bag", c10::DeviceType::CUDA, embedding_bag_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("embedding_bag", &baracuda::embedding_bag_cuda);
  m.impl("embedding_bag.out", &baracuda::embedding_bag_out_cuda);
}
