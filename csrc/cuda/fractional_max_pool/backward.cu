// fractional_max_pool family, CUDA: the backward's launchers and ops. The kernels:
// backward_tiles.cuh, backward_boxes.cuh and stray_fixup.cuh.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "backward_boxes.cuh"
#include "backward_tiles.cuh"
#include "baracuda/variant.h"
#include "common.cuh"
#include "stray_fixup.cuh"

namespace baracuda {
namespace {

FmpBoxAxes fmp_box_axes(const FmpGeometry& g, const FmpBackwardConfig& c) {
  FmpBoxAxes b;
  for (int a = 0; a < 3; ++a) b.axis[a] = {g.in[a], g.out[a], g.k[a], c.stride[a]};
  return b;
}

template <typename scalar_t, typename IndexT, int Dims>
void launch_fmp_backward_boxes(const FmpGeometry& g, const FmpBackwardConfig& c, const at::Tensor& dy,
                               const at::Tensor& idx, const at::Tensor& dx, int32_t* strays) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpBoxParams<IndexT> p;
  p.g = fmp_box_axes(g, c);
  p.out_w = IntDivider<IndexT>(static_cast<IndexT>(g.out[2]));
  p.out_h = IntDivider<IndexT>(static_cast<IndexT>(g.out[1]));
  p.blocks_per_plane = IntDivider<IndexT>(static_cast<IndexT>(c.tiles));
  p.out_plane = static_cast<IndexT>(g.out_plane());
  p.in_plane = g.in_plane();
  // Box rows stored as vectors: the boxes are 2 wide along W (in = 2 out there, so every
  // row starts at an even element), and a unit of `cells` W-adjacent cells stores its box row,
  // 2 * cells elements, as one vector: the widest that out along W divides into (block ranges
  // hold whole units of up to 4 cells) and dx is aligned to, of 16 bytes at most (4 cells of a
  // 16-bit dx, 2 of float32, 1 of float64); 0: rows stored element by element.
  const void* dxp = dx.const_data_ptr();
  constexpr int kWide = static_cast<int>(8 / sizeof(scalar_t));
  constexpr int kFour = std::min(4, kWide), kTwo = std::min(2, kWide);
  int cells = 0;
  for (const int w : {4, 2, 1}) {
    if (cells == 0 && w <= kWide && g.out[2] % w == 0 && cuda::is_aligned(dxp, 2 * w * sizeof(scalar_t))) cells = w;
  }
  const int64_t unit = std::max(cells, 1);
  p.block_units = static_cast<IndexT>(c.block_cells / unit);
  p.plane_units = static_cast<IndexT>(g.out_plane() / unit);
  auto kernel = cells == 4   ? fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, kFour>
                : cells == 2 ? fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, kTwo>
                : cells == 1 ? fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, 1>
                             : fmp_backward_boxes_kernel<scalar_t, acc_t, IndexT, Dims, 0>;
  kernel<<<static_cast<unsigned>(c.blocks), c.threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), strays, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Tile `tile` of a plane as fmp_tile computes it on the device (fmp_reach_cells is
// first(x0)..last(x1 - 1) per axis); plane and shift unset.
template <typename IndexT>
FmpTile<IndexT> fmp_tile_geometry(const FmpGeometry& g, const FmpBackwardConfig& c, int64_t tile) {
  FmpTile<IndexT> t{};
  int64_t rest = tile, x0[3], x1[3], c0[3], n[3];
  for (int a = 2; a >= 0; --a) {
    x0[a] = rest % c.count[a] * c.tile[a];
    rest /= c.count[a];
    x1[a] = std::min(x0[a] + c.tile[a], g.in[a]);
    fmp_reach_cells(g.in[a], g.out[a], g.k[a], x0[a], x1[a] - 1, c0[a], n[a]);
    t.c0[a] = static_cast<IndexT>(c0[a]);
    t.n[a] = static_cast<IndexT>(n[a]);
  }
  t.g0 = static_cast<IndexT>((x0[0] * g.in[1] + x0[1]) * g.in[2] + x0[2]);
  t.len = static_cast<int>((x1[0] - x0[0]) * (x1[1] - x0[1]) * (x1[2] - x0[2]));
  t.o0 = static_cast<IndexT>((c0[0] * g.out[1] + c0[1]) * g.out[2] + c0[2]);
  t.ncells = static_cast<IndexT>(c.whole_rows ? n[0] * n[1] * n[2] : n[0] * c.box[1] * c.box[2]);
  return t;
}

template <typename scalar_t, typename IndexT, int Dims>
void launch_fmp_backward(const FmpGeometry& g, const FmpBackwardConfig& c, const at::Tensor& dy,
                         const at::Tensor& idx, const at::Tensor& dx, const at::Tensor& workspace) {
  using acc_t = at::opmath_type<scalar_t>;
  FmpBwdParams<IndexT> p;
  for (int a = 0; a < 3; ++a) {
    auto& ax = p.axis[a];
    ax.in = static_cast<IndexT>(g.in[a]);
    ax.out = static_cast<IndexT>(g.out[a]);
    ax.k = static_cast<IndexT>(g.k[a]);
    ax.A = static_cast<IndexT>(g.in[a] - g.k[a]);
    ax.f_base = g.out[a] == 1 ? ax.A : IndexT(0);
    ax.B = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(g.out[a] - 1, 1)));
    ax.A_div = IntDivider<IndexT>(static_cast<IndexT>(std::max<int64_t>(g.in[a] - g.k[a], 1)));
    ax.tile = static_cast<IndexT>(c.tile[a]);
    ax.count = IntDivider<IndexT>(static_cast<IndexT>(c.count[a]));
  }
  p.in_w = IntDivider<IndexT>(static_cast<IndexT>(g.in[2]));
  p.in_h = IntDivider<IndexT>(static_cast<IndexT>(g.in[1]));
  p.in_plane = g.in_plane();
  p.out_plane = g.out_plane();
  p.tiles = IntDivider<IndexT>(static_cast<IndexT>(c.tiles));
  p.box_w = IntDivider<IndexT>(static_cast<IndexT>(c.box[2]));
  p.box_h = IntDivider<IndexT>(static_cast<IndexT>(c.box[1]));
  p.blocks = g.planes() * c.tiles;
  p.acc_bytes = static_cast<int>(c.acc_bytes);
  p.cell_bytes = static_cast<int>(c.cell_bytes);
  p.box_cells = static_cast<int>(c.box_cells);
  p.mask_bytes = static_cast<int>(c.mask_bytes);
  p.dx_shift = static_cast<int>((reinterpret_cast<uintptr_t>(dx.const_data_ptr()) / sizeof(scalar_t)) %
                                (16 / sizeof(scalar_t)));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* strays = reinterpret_cast<int32_t*>(workspace.mutable_data_ptr());
  if (c.kind == FmpBackwardKernel::kOwnedBoxes) {
    launch_fmp_backward_boxes<scalar_t, IndexT, Dims>(g, c, dy, idx, dx, strays);
  } else {
    auto kernel = c.disjoint ? (c.whole_rows ? fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, true, true>
                                             : fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, true, false>)
                             : (c.whole_rows ? fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, false, true>
                                             : fmp_backward_tile_kernel<scalar_t, acc_t, IndexT, Dims, false, false>);
    for (int64_t i = 0; i < std::min<int64_t>(c.tiles, kTileTable); ++i) {
      p.table[i] = fmp_tile_geometry<IndexT>(g, c, i);
    }
    const int smem = static_cast<int>(c.smem_bytes);
    const int64_t optin = cuda::device_facts().smem_per_block_optin;
    BARACUDA_CHECK_NOT_IMPLEMENTED(c.block_smem <= optin, fmp_op_name(g.dims, true), ": needs ", c.block_smem,
                                   " bytes of shared memory per block, the device allows ", optin);
    cuda::allow_dynamic_smem(kernel, smem);
    kernel<<<c.blocks, c.threads, smem, stream>>>(dy.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(),
                                                 dx.mutable_data_ptr<scalar_t>(), strays, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // A tile kernel whose blocks hold whole planes scans its planes itself.
  if (!c.fixup) return;
  cuda::launch(fmp_stray_fixup_kernel<scalar_t, acc_t>,
               {.grid = dim3(c.fixup_blocks), .block = dim3(kThreads), .early = true}, dy.const_data_ptr<scalar_t>(),
               idx.const_data_ptr<int64_t>(), dx.mutable_data_ptr<scalar_t>(), strays, g.planes(), c.tiles,
               g.in_plane(), g.out_plane(), c.fixup_group, fmp_box_axes(g, c));
}

template <int Dims>
void fmp_backward_out_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                           at::IntArrayRef output_size, const at::Tensor& indices, const at::Tensor& grad_input,
                           const at::Tensor& workspace) {
  const char* op = fmp_op_name(Dims, true);
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  check_fmp_grad_input(Dims, self, grad_input);
  check_no_overlap(op, {{"grad_input", grad_input}}, {{"grad_output", grad_output}, {"self", self}, {"indices", indices}});
  if (grad_input.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(self.device());
  cuda::check_device_arch(op);
  if (g.out_plane() == 0) {
    grad_input.zero_();
    return;
  }
  const auto c = fmp_backward_config(g, self.scalar_type(), cuda::device_facts());
  const int64_t need = c.workspace_bytes;
  check_workspace(op, workspace, need, 4, self.device(),
                  {{"grad_output", grad_output}, {"self", self}, {"indices", indices}, {"grad_input", grad_input}});
  const auto dy = grad_output.contiguous();
  const auto idx = indices.contiguous();
  BARACUDA_DISPATCH_FLOATING(self.scalar_type(), "fractional_max_pool_backward_cuda", [&] {
    c.index32 ? launch_fmp_backward<scalar_t, uint32_t, Dims>(g, c, dy, idx, grad_input, workspace)
              : launch_fmp_backward<scalar_t, uint64_t, Dims>(g, c, dy, idx, grad_input, workspace);
  });
}

template <int Dims>
at::Tensor fmp_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                             at::IntArrayRef output_size, const at::Tensor& indices) {
  const auto g = check_fmp_backward(Dims, grad_output, self, kernel_size, output_size, indices);
  auto grad_input = at::empty(self.sizes(), self.options());
  const auto workspace =
      at::empty({fmp_backward_config(g, self.scalar_type(), cuda::device_facts()).workspace_bytes},
                self.options().dtype(at::kByte));
  fmp_backward_out_cuda<Dims>(grad_output, self, kernel_size, output_size, indices, grad_input, workspace);
  return grad_input;
}

// The Plan's variant: the launch config, described.
KernelChoice fmp_backward_choice(c10::IntArrayRef problem, c10::ScalarType dtype) {
  const auto v = fmp_backward_launch_view(problem, dtype, cuda::device_facts());
  return {describe(v), v.workspace_bytes};
}

BARACUDA_REGISTER_VARIANT("fractional_max_pool2d_backward", c10::DeviceType::CUDA, fmp_backward_choice);
BARACUDA_REGISTER_VARIANT("fractional_max_pool3d_backward", c10::DeviceType::CUDA, fmp_backward_choice);

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("fractional_max_pool2d_backward", &baracuda::fmp_backward_cuda<2>);
  m.impl("fractional_max_pool2d_backward.out", &baracuda::fmp_backward_out_cuda<2>);
  m.impl("fractional_max_pool3d_backward", &baracuda::fmp_backward_cuda<3>);
  m.impl("fractional_max_pool3d_backward.out", &baracuda::fmp_backward_out_cuda<3>);
}
