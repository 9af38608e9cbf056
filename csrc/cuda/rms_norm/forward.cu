// rms_norm forward, CUDA: the register-row (and row-cluster) and decode kernels and the
// launcher (kinds and their choice: baracuda/rms_norm_policy.h; the two-pass kernel:
// two_pass.cuh).
// Bytes: M*N*e read + M*N*e written + M*a written (+ w, cached).
#include "common.cuh"
#include "decode.cuh"
#include "two_pass.cuh"

namespace baracuda {
namespace {

// ---------------------------------------------------------------------------
// Forward, row in registers:
//   ss = sum_i x_i^2 (acc_t, this thread's vectors in order, then row_sum)
//   rstd = 1 / sqrt(ss / N + eps);  y_i = T(x_i * rstd * w_i)
// x is read once (kept in registers between the two steps); rstd written by u == 0.
// kStreamRow: where the weight's vectors are 32 bytes (a float32 weight with a half
// input; not staged, read from L2 for every row), x is loaded and y stored with
// streaming hints (evict first), which keeps the weight in L2. With a staged weight
// the hints only slow the stores, so they are off there.
// stage_w: the thread's w vectors in shared memory (staged_weight).

// kRowClusters: a row a cluster and a cluster a row (not persistent: clusters that finish
// make room for new ones, whose loads overlap the others' sums and stores), the cluster's
// sums pushed (ClusterPushFold): no cluster barrier a row, nor before a CTA exits, but the
// one that publishes the fold barrier, passed after the loads are issued.
template <typename T, typename W, typename AccT, int V, int Vpt, bool kRowClusters = false>
__global__ void __launch_bounds__(kRowClusters ? rms::kRowClusterThreads : kMaxThreads, kRowClusters ? 4 : 1)
    rms_norm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                        AccT* __restrict__ rstd, int64_t M, int N, int group, int cluster, AccT eps, bool stage_w) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  __shared__ AccT slots[kRowClusters ? rms::kMaxRowCluster : 2];  // by row parity; row clusters: by rank
  __shared__ uint64_t fold_bar;
  const ClusterPushFold<AccT> fold{slots, &fold_bar, cluster};
  extern __shared__ __align__(16) unsigned char rms_smem[];
  const RowLayout L(group, cluster);
  const int nv = N / V;
  const auto weight_at = staged_weight<false, false, false, AccT, W, V, Vpt>(w, stage_w ? Vpt : 0, rms_smem, L, nv);
  constexpr bool kStreamRow = sizeof(W) * V == 32;
  int parity = 0;
  for (int64_t base = L.first; base < M; base += L.step, parity ^= 1) {
    const int64_t row = base + L.g;
    const bool live = row < M;
    cuda::RawVec<T, V> xv[Vpt] = {};
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (live && q < nv) {
        const T* from = x + row * N + int64_t(q) * V;
        xv[j] = kStreamRow ? cuda::load_raw_streaming<T, V>(from) : cuda::load_raw<T, V>(from);
      }
    }
    const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
    AccT ss;
    if constexpr (kRowClusters) {
      if (threadIdx.x == 0) fold.init();
      ClusterPushFold<AccT>::announce();
      ss = cuda::block_sum_once(sum_of_squares<AccT, T, V>(xv), scratch);
      cuda::cluster_wait();  // the cluster's fold barriers are initialized
      ss = fold.fold(ss, AccT(0), [](AccT a, AccT b) { return a + b; });
    } else {
      ss = row_sum(sum_of_squares<AccT, T, V>(xv), group, cluster, scratch, slots, parity, [] {});
    }
    const AccT r = rsqrt_acc(ss / static_cast<AccT>(N) + eps);
    if (live && L.u == 0) rstd[row] = r;
#pragma unroll
    for (int j = 0; j < Vpt; ++j) {
      const int q = j * L.row_threads + L.u;
      if (live && q < nv) {
        AccT wv[V];
        weight_at(j, q, wv);
        cuda::Vec<T, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(x_at(j, i) * r * wv[i]);
        if constexpr (kStreamRow) {
          cuda::store_vec_streaming<T, V>(y + row * N + int64_t(q) * V, out);
        } else {
          cuda::store_vec<T, V>(y + row * N + int64_t(q) * V, out);
        }
      }
    }
  }
  if (!kRowClusters && cluster > 1) cluster_sync();  // no CTA leaves while another still reads its slots
}

// ---------------------------------------------------------------------------
// Forward of decode rows (no more rows than SMs, a CTA each):
// CTA b holds row b, Vpt vectors of V elements per thread (vector q = j *
// blockDim.x + threadIdx.x), x and w in registers from one round of loads:
//   ss = sum_i x_i^2 (this thread's Vpt * V squares by tree_sum, then block_sum_once)
//   rstd = 1 / sqrt(ss * (1 / N) + eps);  y_i = T(x_i * rstd * w_i)
// The CTA's only block sum takes no barrier after it. Both decode kernels take
// 1 / N from the host (inv_n): a multiply where a division is a dozen
// instructions and a branch after the block sum (at most an ulp from ss / N; none
// for a power of two N).

template <typename T, typename W, typename AccT, int V, int Vpt>
__global__ void __launch_bounds__(kBwdMaxThreads)
    rms_norm_fwd_decode_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                               AccT* __restrict__ rstd, int N, AccT eps, AccT inv_n) {
  __shared__ cuda::BlockSumScratch<AccT> scratch;
  const int nv = N / V;
  const int64_t row = blockIdx.x;
  cuda::RawVec<T, V> xv[Vpt] = {}, unused[Vpt];
  RawWeight<W, V> wv[Vpt] = {};
  load_decode_row<T, W, V, Vpt, false>(x, nullptr, w, row, N, xv, unused, wv);
  const auto x_at = [&](int j, int i) { return cuda::raw_elem<AccT, T, V>(xv[j], i); };
  AccT sq[Vpt * V];
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
#pragma unroll
    for (int i = 0; i < V; ++i) sq[j * V + i] = x_at(j, i) * x_at(j, i);
  }
  // Each thread's sum by cuda::tree_sum: a tree of independent adds, shorter than
  // a chain of Vpt * V dependent ones.
  const AccT ss = cuda::block_sum_once(cuda::tree_sum<Vpt * V>(sq), scratch);
  const AccT r = rsqrt_acc(ss * inv_n + eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < Vpt; ++j) {
    const int q = j * blockDim.x + threadIdx.x;
    if (q >= nv) continue;
    cuda::Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(x_at(j, i) * r * wv[j].template at<AccT>(i));
    cuda::store_vec<T, V>(y + row * N + int64_t(q) * V, out);
  }
}

// ---------------------------------------------------------------------------
// Launcher.

// Calls fn(kernel) with the forward register kernel of the choice's vectors per thread.
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_fwd_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  with_vpt<T, V, false>(c, [&](auto vpt_tag) { fn(rms_norm_fwd_kernel<T, W, AccT, V, decltype(vpt_tag)::value>); });
}

// Calls fn(kernel) with the decode forward kernel of the choice's vectors per thread
// (1, 2, 4 or 8, up to fwd_decode_max_vpt; 16-byte vectors, as the policy picks decode rows).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_fwd_decode_kernel(const RmsLaunchConfig& c, Fn&& fn) {
  if constexpr (V * sizeof(T) == 16) {
    if (c.vpt == 1) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 1>);
    if (c.vpt == 2) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 2>);
    if constexpr (fwd_decode_max_vpt(sizeof(T)) >= 4) {
      if (c.vpt == 4) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 4>);
    }
    if constexpr (fwd_decode_max_vpt(sizeof(T)) >= 8) {
      if (c.vpt == 8) return fn(rms_norm_fwd_decode_kernel<T, W, AccT, V, 8>);
    }
  }
  TORCH_CHECK(false, "rms_norm: no decode kernel for ", c.vpt, " vectors of ", V, " per thread");
}

// Calls fn(kernel) with the row-cluster forward kernel (instantiated for 16-byte vectors of
// 2- or 4-byte elements, as the policy picks it).
template <typename T, typename W, typename AccT, int V, typename Fn>
void with_fwd_row_cluster_kernel(Fn&& fn) {
  if constexpr (V * sizeof(T) == 16 && sizeof(T) <= 4) {
    fn(rms_norm_fwd_kernel<T, W, AccT, V, rms::kRowClusterVpt, true>);
  } else {
    TORCH_CHECK(false, "rms_norm: no row-cluster kernel for vectors of ", V * sizeof(T), " bytes");
  }
}

// Resident row groups of the forward kernel a shape launches.
int64_t forward_resident_row_groups(const RmsLaunchConfig& c, c10::ScalarType dtype) {
  return min_resident_row_groups(c, dtype, [&]<typename T, typename W, typename AccT, int V>(auto&& fn) {
    if (c.two_pass()) return fn(rms_norm_fwd_looped_kernel<T, W, AccT, V>);
    with_fwd_kernel<T, W, AccT, V>(c, fn);
  });
}

RmsLaunchConfig choose_forward(const RmsProblem& p) {
  return choose_rms(p, [&](const RmsLaunchConfig& shape) { return forward_resident_row_groups(shape, p.dtype); });
}

void rms_norm_out_cuda(const at::Tensor& input, at::IntArrayRef normalized_shape,
                       const std::optional<at::Tensor>& weight, std::optional<double> eps, const at::Tensor& output,
                       const at::Tensor& rstd) {
  const auto rows = check_rms_norm(input, normalized_shape, weight);
  check_out(kRmsNormOp, "output", output, input.sizes(), input.scalar_type(), input.device());
  check_out(kRmsNormOp, "rstd", rstd, rms_rstd_shape(input.sizes(), normalized_shape.size()),
            rms_acc_dtype(input.scalar_type()), input.device());
  cuda::check_out_aligned(kRmsNormOp, "output", output);
  BARACUDA_CHECK_VALUE(rstd.is_contiguous(), kRmsNormOp, ": rstd must be contiguous");
  check_rms_norm_out_overlap(input, weight, output, rstd);
  if (rows.M == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  cuda::check_device_arch(kRmsNormOp);
  if (rows.N == 0) {  // the mean of no elements is NaN, as in PyTorch
    rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const auto c = choose_forward({rows.M, rows.N, input.scalar_type(), false, 0});
  const auto x = cuda::aligned_contiguous(input);
  const auto w = has_tensor(weight) ? cuda::aligned_contiguous(*weight) : at::Tensor();
  const double e = eps.value_or(rms_default_eps(input.scalar_type()));
  BARACUDA_DISPATCH_FLOATING(input.scalar_type(), "rms_norm_cuda", [&] {
    with_weight_type<scalar_t>(input, weight, [&](auto w_tag) {
      using W = decltype(w_tag);
      with_vec<scalar_t>(c, [&](auto v_tag) {
        constexpr int V = decltype(v_tag)::value;
        const auto* xp = x.const_data_ptr<scalar_t>();
        const W* wp = w.defined() ? w.const_data_ptr<W>() : nullptr;
        auto* yp = output.mutable_data_ptr<scalar_t>();
        auto* rp = rstd.mutable_data_ptr<acc_t>();
        if (c.two_pass()) {
          cuda::launch(rms_norm_fwd_looped_kernel<scalar_t, W, acc_t, V>,
                       {.grid = dim3(c.clusters), .block = dim3(c.block)}, xp, wp, yp, rp, rows.M, rows.N,
                       static_cast<acc_t>(e));
        } else if (c.decode()) {
          with_fwd_decode_kernel<scalar_t, W, acc_t, V>(c, [&](auto kernel) {
            cuda::launch(kernel, {.grid = dim3(c.clusters), .block = dim3(c.block)}, xp, wp, yp, rp,
                         static_cast<int>(rows.N), static_cast<acc_t>(e), inverse_row_length<acc_t>(rows.N));
          });
        } else if (c.kind == RmsKernel::kRowClusters) {
          TORCH_INTERNAL_ASSERT(c.clusters * c.cluster <= std::numeric_limits<int>::max(),
                                "rms_norm: row clusters past 2^31 CTAs");
          with_fwd_row_cluster_kernel<scalar_t, W, acc_t, V>([&](auto kernel) {
            cuda::launch(kernel, {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster},
                         xp, wp, yp, rp, rows.M, static_cast<int>(rows.N), c.group, c.cluster, static_cast<acc_t>(e),
                         false);
          });
        } else {
          with_fwd_kernel<scalar_t, W, acc_t, V>(c, [&](auto* kernel) {
            const int staged = staged_weight_vectors(kernel, c, false, wp != nullptr, int64_t(sizeof(W)) * V);
            cuda::launch(kernel,
                         {.grid = dim3(c.clusters * c.cluster), .block = dim3(c.block), .cluster = c.cluster,
                          .smem = c.smem + int64_t(c.block) * staged * int64_t(sizeof(W)) * V},
                         xp, wp, yp, rp, rows.M, static_cast<int>(rows.N), c.group, c.cluster, static_cast<acc_t>(e),
                         staged > 0);
          });
        }
      });
    });
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cuda(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                 const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  check_rms_norm(input, normalized_shape, weight);
  auto output = at::empty(input.sizes(), input.options());
  auto rstd = at::empty(rms_rstd_shape(input.sizes(), normalized_shape.size()),
                        input.options().dtype(rms_acc_dtype(input.scalar_type())));
  rms_norm_out_cuda(input, normalized_shape, weight, eps, output, rstd);
  return {output, rstd};
}

// problem = [M, N] (rms_problem).
KernelChoice rms_norm_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const RmsProblem p = rms_problem(problem, dtype, false);
  return rms_choice(p, [&](const RmsLaunchConfig& shape) { return forward_resident_row_groups(shape, p.dtype); });
}

BARACUDA_REGISTER_VARIANT("rms_norm", c10::DeviceType::CUDA, rms_norm_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("rms_norm", &baracuda::rms_norm_cuda);
  m.impl("rms_norm.out", &baracuda::rms_norm_out_cuda);
}
