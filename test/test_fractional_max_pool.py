import math
import random as pyrandom

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

import baracuda_ops
from helpers import FLOAT_DTYPES, TOLERANCES, assert_close, poison, random, require_free_gpu_memory
from launch_configs import launch_config


def _fw(dims):
    return getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d")


def _bw(dims):
    return getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d_backward")


def _torch(dims, x, k, out, s):
    f = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    return f(x, k, output_size=out, _random_samples=s, return_indices=True)


def _config(op, dims, shape, k, out, dtype):
    """The CUDA launch config of fractional_max_pool{dims}d{op} (recorded H200 facts)."""
    return launch_config(f"fractional_max_pool{dims}d{op}", [dims, len(shape), *shape, *k, *out], dtype)


def _backward_plan(dims, shape, k, out, dtype, device):
    desc = getattr(baracuda_ops, f"FractionalMaxPool{dims}dDescriptor")(shape, k, out, dtype, device)
    return getattr(baracuda_ops, f"FractionalMaxPool{dims}dBackwardPlan").select(desc)


def _backward_with_flags(dims, g, x, k, out, i):
    """dx and the CUDA tiles' stray flags (int32, one per tile; poisoned first, so each must be written)."""
    plan = _backward_plan(dims, tuple(x.shape), k, out, x.dtype, x.device)
    flags = torch.full((plan.workspace_size(),), 255, dtype=torch.uint8, device=x.device)
    dx = torch.empty_like(x)
    _bw(dims).out(g, x, list(k), list(out), i, grad_input=dx, workspace=flags)
    return dx, flags.view(torch.int32)


def _samples(x, dims):
    n = 1 if x.dim() == dims + 1 else x.shape[0]
    return torch.rand(n, x.shape[-dims - 1], dims, device=x.device).to(x.dtype)


def _scatter_reference(grad, indices, shape, dims):
    """float64 dx[idx[o]] += dy[o] per plane."""
    ref = torch.zeros(shape, dtype=torch.float64, device=grad.device).flatten(-dims)
    ref.scatter_add_(-1, indices.flatten(-dims), grad.double().flatten(-dims))
    return ref.view(shape)


def _sweep(dims, n, seed):
    """Random (input shape, kernel, output) problems PyTorch accepts, and the edge cases:
    output size 1, kernel == input, out + k - 1 == in (2d; PyTorch's 3d refuses it), unbatched."""
    rng = pyrandom.Random(seed)
    cases = []
    if dims == 2:
        cases += [((2, 3, 7, 9), (7, 9), (1, 1)), ((3, 6, 5), (2, 3), (5, 3)), ((1, 2, 12, 12), (3, 3), (10, 1)),
                  ((2, 1, 31, 17), (1, 2), (31, 16))]
    else:
        cases += [((2, 2, 5, 6, 7), (5, 6, 7), (0, 0, 0)), ((2, 3, 6, 5, 9), (2, 2, 3), (4, 3, 6)),
                  ((3, 4, 4, 5), (1, 2, 1), (1, 2, 3))]
    while len(cases) < n:
        spatial = [rng.randint(2, 40 if dims == 2 else 11) for _ in range(dims)]
        k = [rng.randint(1, max(1, s // 2)) for s in spatial]
        strict = 1 if dims == 3 else 0
        out = [rng.randint(1, s - kk + 1 - strict) if s - kk + 1 - strict >= 1 else -1 for s, kk in zip(spatial, k)]
        if min(out) < 1:
            continue
        lead = [rng.randint(1, 4)] if rng.random() < 0.3 else [rng.randint(1, 3), rng.randint(1, 4)]
        cases.append((tuple(lead + spatial), tuple(k), tuple(out)))
    return [c for c in cases if min(c[2]) > 0]


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_bit_exact_sweep(device, dims, dtype):
    for shape, k, out in _sweep(dims, 24, seed=dims * 10 + FLOAT_DTYPES.index(dtype)):
        x = random(shape, dtype, device)
        s = _samples(x, dims)
        y, i = baracuda_ops.__dict__[f"fractional_max_pool{dims}d"](x, k, out, return_indices=True, _random_samples=s)
        ry, ri = _torch(dims, x, k, out, s)
        assert torch.equal(i, ri), (shape, k, out)
        assert torch.equal(y, ry), (shape, k, out)


@pytest.mark.parametrize("dims, shape, k, out, kind, params", [
    (2, (32, 64, 96, 96), (2, 2), (48, 48), "band_window_max",
     dict(k=2, band_rows=24, cells_per_thread=4, threads=160)),
    (2, (8, 64, 64, 64), (3, 3), (40, 40), "band_window_max",
     dict(k=3, band_rows=40, cells_per_thread=2, threads=160)),
    (2, (4, 8, 250, 250), (3, 3), (100, 100), "band_window_max",
     dict(k=3, band_rows=12, cells_per_thread=2, threads=160)),
    (2, (16, 64, 96, 96), (3, 2), (47, 60), "window_max_resident",
     dict(index32=1, k=0, table=1, cells_per_thread=1, threads=192)),
    (2, (2, 3, 4, 9000), (2, 2), (2, 4400), "window_max_segments",
     dict(index32=1, k=2, table=0, cells_per_thread=4, threads=224)),
    (3, (2, 16, 16, 32, 32), (2, 2, 2), (8, 16, 16), "window_max_segments",
     dict(index32=1, k=2, table=1, cells_per_thread=4, threads=256)),
    (3, (2, 8, 12, 20, 20), (3, 3, 3), (6, 10, 10), "window_max_resident",
     dict(index32=1, k=3, table=1, cells_per_thread=2, threads=160)),
    (3, (4, 32, 20, 40, 40), (2, 3, 2), (10, 20, 20), "window_max_resident",
     dict(index32=1, k=0, table=1, cells_per_thread=1, threads=224)),
    (3, (1, 2, 3, 4, 5000), (1, 2, 2), (2, 2, 4500), "window_max_resident",
     dict(index32=1, k=0, table=0, cells_per_thread=1, threads=256)),
])
def test_forward_bit_exact_large_grid(device, dims, shape, k, out, kind, params):
    # Every CUDA kernel (the config given is the bfloat16 one; float32 runs too, with
    # other bands); several segments per plane, planes per block, segments that end
    # past the plane, planes split into segments of fewer than 256 threads with no idle
    # slot, and bands of 2d planes staged in shared memory: a whole plane, or several
    # bands whose rows (250 elements) start off 16-byte alignment.
    config = _config("", dims, shape, k, out, torch.bfloat16)
    assert config.kind == kind and {name: config[name] for name in params} == params
    if device.type != "cuda":
        pytest.skip("coverage of the CUDA kernels; the CPU path is covered by the sweep")
    for dtype in (torch.bfloat16, torch.float32):
        x = random(shape, dtype, device)
        s = _samples(x, dims)
        y, i = _fw(dims)(x, list(k), list(out), s)
        ry, ri = _torch(dims, x, k, out, s)
        assert torch.equal(i, ri) and torch.equal(y, ry)


def test_forward_band_rows_past_their_size(device):
    # A band's input rows are staged in shared memory when they fit the rows the band
    # was sized for, which holds for samples in [0, 1). A saturated H sample puts every
    # start but the last at 0 and the last at in - k, so the plane's last band needs
    # every input row and reads its windows from global memory instead; the result
    # equals the CPU kernel's (the same clamped, saturating start formula in float32).
    if device.type != "cuda":
        pytest.skip("the CUDA band kernel's fallback")
    shape, k, out = (2, 3, 250, 250), (3, 3), (100, 100)
    assert _config("", 2, shape, k, out, torch.float32)["band_rows"] == 5
    x = random(shape, torch.float32, device)
    s = _samples(x, 2)
    s[0, :, 1] = 3e9
    y, i = _fw(2)(x, list(k), list(out), s)
    ry, ri = _fw(2)(x.cpu(), list(k), list(out), s.cpu())
    assert torch.equal(i.cpu(), ri) and torch.equal(y.cpu(), ry)
    assert (ri[0, :, :-1] < 3 * 250).all() and (ri[0, :, -1] >= 247 * 250).all()  # the starts described above


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_3d_tight_fit_equals_2d(device, dtype):
    # out + k - 1 == in on every axis, which PyTorch's 3d refuses: a T=1 input pools
    # like the 2d op on [H, W] with the (H, W) samples (2d order: W, H).
    x = random((2, 3, 9, 8), dtype, device)
    s3 = _samples(x[:, :, None], 3)
    y, i = _fw(3)(x[:, :, None], [1, 3, 2], [1, 7, 7], s3)
    ry, ri = _torch(2, x, (3, 2), (7, 7), s3[..., [2, 1]].contiguous())
    assert torch.equal(y[:, :, 0], ry) and torch.equal(i[:, :, 0], ri)


# (shape, kernel, output) per forward variant: kernel sizes that differ by axis (loops),
# uniform 2 and 3 (unrolled windows: 2d planes in bands of rows, 3d segments).
# The CUDA kernel each takes, and its unrolled window.
_TIE_PROBLEMS = {
    2: [((2, 3, 13, 11), (3, 2), (6, 7), "window_max_resident", 0),
        ((2, 3, 13, 11), (2, 2), (6, 5), "band_window_max", 2),
        ((2, 3, 13, 11), (3, 3), (7, 6), "band_window_max", 3)],
    3: [((2, 2, 7, 8, 6), (2, 3, 2), (4, 4, 4), "window_max_resident", 0),
        ((2, 2, 7, 8, 6), (2, 2, 2), (4, 4, 3), "window_max_resident", 2),
        ((2, 2, 7, 8, 6), (3, 3, 3), (4, 5, 3), "window_max_resident", 3)],
}


@pytest.mark.parametrize("dims, problem", [(d, p) for d in (2, 3) for p in range(3)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_ties_nan_inf(device, dims, problem, dtype):
    # First max wins among ties (-0 == +0 included); a NaN wins over any number, the
    # last NaN of a window over earlier ones; windows of -inf point at their first
    # element. Windows with and without NaN or infinity side by side in each plane.
    shape, k, out, kind, unrolled = _TIE_PROBLEMS[dims][problem]
    config = _config("", dims, shape, k, out, dtype)
    assert config.kind == kind and config["k"] == unrolled
    x = torch.randint(0, 3, shape, device=device).to(dtype)  # many ties: first max wins
    x.view(-1)[1::5] = -0.0
    x.view(-1)[::7] = 0.0
    x.view(-1)[::29] = float("nan")
    x.view(-1)[3::31] = float("-inf")
    x.view(-1)[11::37] = float("inf")
    x[..., :3] = float("-inf")  # whole windows of -inf
    x[0, 0] = -0.0  # a plane of signed zeros: the first of each window wins
    x[0, 0].view(-1)[::3] = 0.0
    s = _samples(x, dims)
    y, i = _fw(dims)(x, list(k), list(out), s)
    ry, ri = _torch(dims, x, k, out, s)
    assert torch.equal(i, ri)
    torch.testing.assert_close(y, ry, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(y), torch.signbit(ry))


@pytest.mark.parametrize("dims", [2, 3])
def test_forward_non_contiguous_and_zero_size(device, dims):
    shape = (3, 4, 17, 15) if dims == 2 else (3, 4, 9, 10, 8)
    base = random(shape, torch.float32, device)
    k, out = ((2, 3), (9, 7)) if dims == 2 else ((2, 2, 3), (4, 5, 3))
    s_base = torch.rand(4, 3, dims, device=device)
    for x in (base.transpose(-1, -2).contiguous().transpose(-1, -2), base[::2], base[:, 1:]):
        s = s_base.transpose(0, 1)[: x.shape[0], : x.shape[1]]  # non-contiguous samples
        y, i = _fw(dims)(x, list(k), list(out), s)
        ry, ri = _torch(dims, x, k, out, s.contiguous())
        assert torch.equal(y, ry) and torch.equal(i, ri)
    empty = random((0,) + shape[1:], torch.float32, device)
    y, i = _fw(dims)(empty, list(k), list(out), torch.rand(0, shape[1], dims, device=device))
    assert y.shape == (0, shape[1]) + out and i.dtype == torch.int64
    y, i = _fw(dims)(base, list(k), [0] * dims, torch.rand(3, 4, dims, device=device))
    assert y.shape == shape[:2] + (0,) * dims
    dx = _bw(dims)(y, base, list(k), [0] * dims, i)
    assert torch.equal(dx, torch.zeros_like(base))


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_scatter_reference(device, dims, dtype):
    # Overlapping windows (k > stride): several outputs can pick the same input.
    shape, k, out = ((2, 3, 17, 14), (3, 4), (10, 8)) if dims == 2 else ((2, 2, 9, 8, 7), (3, 2, 3), (5, 6, 4))
    x = random(shape, dtype, device, requires_grad=True)
    y, i = baracuda_ops.__dict__[f"fractional_max_pool{dims}d"](x, k, out, return_indices=True,
                                                             _random_samples=_samples(x, dims))
    g = random(y.shape, dtype, device)
    (dx,) = torch.autograd.grad(y, x, g)
    assert_close(dx, _scatter_reference(g, i, shape, dims), scale=2.0)


@pytest.mark.parametrize("dims", [2, 3])
def test_backward_float64_bit_equal_to_pytorch(device, dims):
    # k <= stride: no two windows share an input, so no sums collide.
    shape, k, out = ((2, 3, 20, 18), (2, 2), (10, 9)) if dims == 2 else ((2, 2, 8, 10, 6), (2, 2, 2), (4, 5, 3))
    x = random(shape, torch.float64, device, requires_grad=True)
    s = _samples(x, dims)
    y, _ = _fw(dims)(x, list(k), list(out), s)
    ry, _ = _torch(dims, x, k, out, s)
    g = random(y.shape, torch.float64, device)
    (dx,) = torch.autograd.grad(y, x, g)
    (rdx,) = torch.autograd.grad(ry, x, g)
    assert torch.equal(dx, rdx)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_of_arbitrary_indices(device, dims, k):
    # Indices not made by the forward (anywhere in the plane, with repeats): on CUDA
    # they fall outside their windows (strays) and take the full-scan path. Windows
    # disjoint (k = 2) and overlapping (k = 3).
    shape, out = ((2, 3, 12, 10), (5, 4)) if dims == 2 else ((2, 2, 5, 6, 4), (2, 3, 2))
    plane = 1
    for s in shape[-dims:]:
        plane *= s
    x = random(shape, torch.float64, device)
    indices = torch.randint(0, plane, shape[:2] + out, device=device)
    indices[0, 0].view(-1)[:3] = 5
    g = random(indices.shape, torch.float64, device)
    dx = _bw(dims)(g, x, [k] * dims, list(out), indices)
    assert_close(dx, _scatter_reference(g, indices, shape, dims))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_bit_identical_twice_and_deterministic_mode(device, dtype):
    x = random((4, 8, 56, 56), dtype, device, requires_grad=True)
    s = _samples(x, 2)
    g = None
    results = []
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # PyTorch's own CUDA backward refuses to run here
    try:
        for _ in range(2):
            y = baracuda_ops.fractional_max_pool2d(x, 3, output_size=(40, 40), _random_samples=s)
            g = random(y.shape, dtype, device) if g is None else g
            (dx,) = torch.autograd.grad(y, x, g)
            results.append(dx)
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(results[0].view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       results[1].view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    _, i = _fw(2)(x.detach(), [3, 3], [40, 40], s)
    assert_close(results[0], _scatter_reference(g, i, x.shape, 2), scale=2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_tiled_planes_and_overlaps(device, dims, dtype):
    # Planes larger than one 64 KiB shared-memory tile (split along T, along H, along W),
    # windows overlapping (k > stride) so several cells pick one input; bit-identical twice.
    problems = ([((2, 3, 150, 130), (4, 3), (60, 90)), ((1, 2, 9, 20000), (3, 5), (5, 6000))] if dims == 2
                else [((1, 3, 20, 40, 33), (3, 2, 4), (9, 25, 20)), ((2, 1, 3, 96, 100), (2, 3, 3), (2, 50, 70))])
    for shape, k, out in problems:
        x = random(shape, dtype, device)
        y, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
        g = random(y.shape, dtype, device)
        dx = _bw(dims)(g, x, list(k), list(out), i)
        assert torch.equal(dx, _bw(dims)(g, x, list(k), list(out), i))
        assert_close(dx, _scatter_reference(g, i, shape, dims), scale=2.0)
        if dtype == torch.float64:  # a plane split by the plan: more than one tile, one flag each
            ws = _backward_plan(dims, shape, k, out, dtype, device).workspace_size()
            if device.type == "cuda":
                assert ws > shape[0] * shape[1] * 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_sweep_and_many_candidates(device, dims, dtype):
    # The forward sweep's kind of problems (windows from disjoint to kernel = half the
    # input: from 1 to hundreds of cells that can reach one element) and one explicit
    # problem of up to 64 (2d) and 125 (3d) such cells, over which the CUDA kernel sums
    # an element with three or more contributions again in order; against the float64
    # scatter reference, and bit-identical to the CPU kernel (both add in increasing
    # output-cell order) and run to run.
    many = [((2, 3, 20, 20), (6, 6), (15, 15))] if dims == 2 else [((1, 2, 13, 13, 13), (3, 3, 3), (10, 10, 10))]
    for shape, k, out in _sweep(dims, 24, seed=dims * 100 + 7) + many:
        x = random(shape, dtype, device)
        _, i = baracuda_ops.__dict__[f"fractional_max_pool{dims}d"](x, k, out, return_indices=True,
                                                                 _random_samples=_samples(x, dims))
        g = random(i.shape, dtype, device)
        dx = _bw(dims)(g, x, list(k), list(out), i)
        assert_close(dx, _scatter_reference(g, i, shape, dims), scale=2.0)
        assert torch.equal(dx, _bw(dims)(g, x, list(k), list(out), i)), (shape, k, out)
        assert torch.equal(dx.cpu(), _bw(dims)(g.cpu(), x.cpu(), list(k), list(out), i.cpu())), (shape, k, out)
    if device.type == "cuda":  # up to 64 (2d: 8 x 8) and 125 (3d: 5 x 5 x 5) candidates per element
        shape, k, out = many[0]
        config = _config("_backward", dims, shape, k, out, dtype)
        assert (config.kind, config["index32"]) == ("tile_counts", 1)


def test_backward_tiles_load_fewest_cells_then_smallest(device):
    # The tile chooser (CUDA): past the first tile that fits, a smaller one that loads
    # no more cells per element wins (more blocks per SM). 32 T-slices of 64 x 64 with
    # 2 x 2 x 2 windows to 15 (stride 30 / 14 along T, not an integer: tile_stores, not
    # owned boxes): float32 tiles of 3 slices (11 a plane) load 3 cells along T, as 4
    # slices load 4; bfloat16 keeps 8 slices (5 cells; 6 slices load 5 too).
    if device.type != "cuda":
        pytest.skip("the tiles are the CUDA kernel's")
    shape, k, out = (1, 4, 32, 64, 64), (2, 2, 2), (15, 32, 32)
    for dtype, tiles in ((torch.float32, 11), (torch.bfloat16, 4)):
        assert _backward_plan(3, shape, k, out, dtype, device).workspace_size() == 4 * tiles * 4, dtype


@pytest.mark.big_memory
@pytest.mark.parametrize("dims, shape, k, out, dtype", [
    (2, (1, 2, 32768, 32768), 3, 16384, torch.float32),   # 2^31 elements, overlapping windows (tile_counts)
    (3, (1, 1, 1291, 1291, 1291), 2, 645, torch.bfloat16),  # 2.15e9 elements, disjoint windows (tile_stores)
    (3, (1, 1, 1292, 1292, 1292), 2, 646, torch.bfloat16),  # 2.16e9 elements, stride 2 (owned boxes)
])
def test_64bit_indexing_matches_pytorch(device, dims, shape, k, out, dtype):
    # Planes past 2^31 elements take the CUDA kernels' 64-bit index math (i64 variants);
    # compared with PyTorch's own CUDA kernels (its backward adds with atomics, so
    # within float tolerance rather than bit-equal).
    if device.type != "cuda":
        pytest.skip("64-bit index math is a CUDA kernel variant (the CPU kernels index with int64 throughout)")
    require_free_gpu_memory(40)
    k, out = (k,) * dims, (out,) * dims
    assert _config("_backward", dims, shape, k, out, dtype)["index32"] == 0
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, device=device)
    s = _samples(x, dims)
    y, i = _fw(dims)(x, list(k), list(out), s)
    ry, ri = _torch(dims, x, k, out, s)
    assert torch.equal(y, ry) and torch.equal(i, ri)
    del ry, ri
    g = torch.randn_like(y)
    dx = _bw(dims)(g, x, list(k), list(out), i)
    rdx = getattr(torch.ops.aten, f"fractional_max_pool{dims}d_backward")(g, x, list(k), list(out), i)
    del x, y, i, g
    rtol, atol = TOLERANCES[dtype]
    a, b = dx.view(-1), rdx.view(-1)
    for start in range(0, a.numel(), 2**28):  # on the GPU, a slice at a time
        torch.testing.assert_close(a[start:start + 2**28].double(), b[start:start + 2**28].double(),
                                   rtol=2 * rtol, atol=2 * atol)


@pytest.mark.parametrize("dims", [2, 3])
def test_backward_forward_indices_take_no_full_scan(device, dims):
    # Indices made by the forward are never strays on CUDA: no tile flags its plane for
    # the ordered full scan (correct, but hundreds of times slower). Disjoint and
    # overlapping windows, planes of one tile and of several; every flag is written.
    if device.type != "cuda":
        pytest.skip("the stray flags are the CUDA kernel's")
    problems = ([((2, 4, 112, 112), (2, 2), (56, 56)), ((2, 4, 112, 112), (3, 3), (56, 56)),
                 ((2, 2, 150, 130), (4, 3), (60, 90)), ((1, 2, 9, 20000), (3, 5), (5, 6000))] if dims == 2
                else [((1, 4, 32, 64, 64), (2, 2, 2), (16, 32, 32)), ((1, 3, 20, 40, 33), (3, 2, 4), (9, 25, 20)),
                      ((2, 1, 3, 96, 100), (2, 3, 3), (2, 50, 70))])
    for shape, k, out in problems:
        for dtype in (torch.float32, torch.bfloat16):
            x = random(shape, dtype, device)
            _, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
            g = random(i.shape, dtype, device)
            dx, flags = _backward_with_flags(dims, g, x, k, out, i)
            assert int(flags.count_nonzero()) == 0, (shape, k, out, dtype)
            assert torch.equal(dx.cpu(), _bw(dims)(g.cpu(), x.cpu(), list(k), list(out), i.cpu()))


def _crowded_indices(x, dims, k, out):
    """The forward's indices, with the cells around the element at (1, ..., 1) sent to
    it: 2, 3 and all 2^dims of them in planes (0, 0), (0, 1) and (1, 1)."""
    _, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
    i = i.clone()
    spatial = x.shape[-dims:]
    target = sum(math.prod(spatial[a + 1:]) for a in range(dims))  # the element at (1, ..., 1)
    corner = [tuple((c >> a) & 1 for a in range(dims)) for c in range(2 ** dims)]  # cells 0 / 1 per axis
    for plane, crowd in (((0, 0), 2), ((0, 1), 3), ((1, 1), 2 ** dims)):
        for cell in corner[:crowd]:
            i[plane][cell] = target
    return i


def _check_backward_flags(dims, x, k, out, i, kind, flags_per_plane):
    """The backward of random grads at indices i equals the CPU kernel's, run to run; on
    CUDA it takes the kernel `kind` and leaves these stray flags (per plane, one per block)."""
    g = random(i.shape, x.dtype, x.device)
    dx = _bw(dims)(g, x, list(k), list(out), i)
    assert torch.equal(dx.cpu(), _bw(dims)(g.cpu(), x.cpu(), list(k), list(out), i.cpu()))
    assert torch.equal(dx, _bw(dims)(g, x, list(k), list(out), i))
    config = _config("_backward", dims, tuple(x.shape), k, out, x.dtype)
    assert (config.kind, config["index32"]) == (kind, 1)
    if x.device.type == "cuda":
        dx2, flags = _backward_with_flags(dims, g, x, k, out, i)
        assert torch.equal(dx2, dx)
        assert torch.equal(flags.cpu(), flags_per_plane.flatten())


@pytest.mark.parametrize("dims", [2, 3])
def test_backward_overlapping_counts_and_strays(device, dims):
    # Overlapping windows (one tile per plane here) count each element's contributions
    # on CUDA. Indices at f(c) = floor(c * (in - k) / (out - 1)) per axis (in each cell's
    # reach, one per element), then: plane (0, 0) sends all 2^dims cells of coordinates
    # 0 and 1 to the element at (1, ..., 1), inside every one's reach: an ordered sum of
    # 2^dims, no flag; (0, 1) the last cell to element 0, outside its reach: two
    # contributions (either order sums the same), no flag; (1, 0) the last two cells
    # too: three, two of them outside their reach, a flag (the plane's ordered scan);
    # (1, 1) every cell to element 0 (hundreds of contributions): a flag.
    spatial, out = ((40, 40), (17, 17)) if dims == 2 else ((20, 20, 20), (7, 7, 7))
    k = (3,) * dims
    x = random((2, 2) + spatial, torch.float32, device)
    strides = [math.prod(spatial[a + 1:]) for a in range(dims)]
    axes = [torch.arange(o, device=device) * (s - 3) // (o - 1) for s, o in zip(spatial, out)]
    base = sum(g * st for g, st in zip(torch.meshgrid(*axes, indexing="ij"), strides))
    i = base.expand((2, 2) + out).clone()
    for c in range(2 ** dims):
        i[0, 0][tuple((c >> a) & 1 for a in range(dims))] = sum(strides)
    i[0, 1].view(-1)[-1] = 0
    i[1, 0].view(-1)[-2:] = 0
    i[1, 1] = 0
    flags = torch.tensor([[0, 0], [1, 1]], dtype=torch.int32)
    _check_backward_flags(dims, x, k, out, i, "tile_counts", flags)
    g = random(i.shape, x.dtype, device)
    assert_close(_bw(dims)(g, x, list(k), list(out), i), _scatter_reference(g, i, x.shape, dims), scale=2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_disjoint_windows_crowded_indices(device, dims, dtype):
    # Disjoint windows (k <= stride, here not an integer stride: 15 / 7 and 7 / 3) take
    # the one-store-per-element tile kernel on CUDA (its tile holds float64 sums, or
    # bfloat16 values added in float32 and rounded once). Indices
    # that stay within reach of their cells but send 2, 3 or all 2^dims cells around the
    # element at coordinates (1, ..., 1) to it: a second contribution is added after the
    # stores, a third sends the plane to the ordered full scan (its flag is set). Every
    # plane equals the CPU kernel's result.
    shape, k, out = ((2, 3, 17, 17), (2, 2), (8, 8)) if dims == 2 else ((2, 2, 9, 9, 9), (2, 2, 2), (4, 4, 4))
    x = random(shape, dtype, device)
    scanned = torch.zeros(shape[:2], dtype=torch.int32)  # one tile per plane
    scanned[0, 1] = scanned[1, 1] = 1
    _check_backward_flags(dims, x, k, out, _crowded_indices(x, dims, k, out), "tile_stores", scanned)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_owned_boxes_movers_and_strays(device, dims, dtype):
    # An integer stride (14 / 7 = 2 = k) takes the owned-boxes kernel on CUDA: each cell
    # writes its 2^dims box. Indices sent from the cells around the element at (1, ...,
    # 1) to it (2, 3 or 2^dims of them) are MOVERS (outside their box, within reach):
    # only that element is recomputed, in cell order (flag 2, no full scan). An index
    # outside every reach (plane (1, 0)) is a stray: flag 1, the plane's full scan.
    # Every plane equals the CPU kernel's result.
    shape, k, out = ((2, 3, 16, 16), (2, 2), (8, 8)) if dims == 2 else ((2, 2, 8, 8, 8), (2, 2, 2), (4, 4, 4))
    x = random(shape, dtype, device)
    i = _crowded_indices(x, dims, k, out)
    i[1][0][(0,) * dims] = math.prod(shape[-dims:]) - 1  # the last element: a stray
    expected = torch.zeros(shape[:2], dtype=torch.int32)  # one block per plane
    expected[0, 0] = expected[0, 1] = expected[1, 1] = 2
    expected[1, 0] = 1
    _check_backward_flags(dims, x, k, out, i, "owned_boxes", expected)


@pytest.mark.parametrize("dims, shape, k, out, kind", [
    (2, (2, 1, 112, 112), (2, 2), (56, 56), "owned_boxes"),        # 4 blocks a plane
    (3, (2, 1, 32, 64, 64), (2, 2, 2), (16, 32, 32), "owned_boxes"),  # 16 blocks a plane
    (2, (2, 1, 140, 120), (3, 3), (50, 40), "tile_counts"),         # 2 tiles a plane
])
def test_backward_planes_of_many_blocks_fixed(device, dims, shape, k, out, kind):
    # Planes of several blocks. Forward indices at samples of 1/2 (no window moved), then
    # in plane 0 the last cell's index sent to the element before its window along W (a
    # mover for owned boxes, within reach for the tiles), in plane 1 to element 0 (a
    # stray: the plane's full scan). Both equal the CPU kernel's result; on CUDA only each
    # plane's last block is flagged.
    x = random(shape, torch.float32, device)
    s = torch.full((shape[0], shape[1], dims), 0.5, dtype=torch.float32, device=device)
    _, i = _fw(dims)(x, list(k), list(out), s)
    i = i.clone()
    w = shape[-1]
    last = i[0, 0].view(-1)[-1]
    i[0, 0].view(-1)[-1] = last - last % w + (w - k[-1] - 1)
    i[1, 0].view(-1)[-1] = 0
    blocks = max(1, _backward_plan(dims, shape, k, out, x.dtype, device).workspace_size() // 4 // 2)
    assert blocks > 1 or device.type == "cpu"
    expected = torch.zeros((2, blocks), dtype=torch.int32)
    expected[0, -1] = 2 if kind == "owned_boxes" else 0
    expected[1, -1] = 1
    _check_backward_flags(dims, x, k, out, i, kind, expected)


@pytest.mark.parametrize("dims", [2, 3])
def test_backward_owned_boxes_moved_starts(device, dims):
    # float32 samples of 1 - 2^-24 make c + u round up to c + 1, so the forward moves
    # every window but the first and last by one element (PyTorch's formula): a cell
    # whose max is its window's last element names the next box's first element. Those
    # movers are recomputed without the full scan (no flag 1), equal to the CPU kernel.
    shape, k, out = ((2, 3, 112, 112), (2, 2), (56, 56)) if dims == 2 else ((1, 3, 16, 32, 32), (2, 2, 2), (8, 16, 16))
    x = random(shape, torch.float32, device)
    s = torch.full((shape[0], shape[1], dims), 1 - 2.0 ** -24, dtype=torch.float32, device=device)
    _, i = _fw(dims)(x, list(k), list(out), s)
    assert torch.equal(i, _torch(dims, x, k, out, s)[1])
    g = random(i.shape, torch.float32, device)
    dx = _bw(dims)(g, x, list(k), list(out), i)
    assert torch.equal(dx.cpu(), _bw(dims)(g.cpu(), x.cpu(), list(k), list(out), i.cpu()))
    if device.type == "cuda":
        _, flags = _backward_with_flags(dims, g, x, k, out, i)
        assert int((flags & 1).count_nonzero()) == 0 and int((flags == 2).count_nonzero()) > 0


@pytest.mark.parametrize("dims, shape, k, out, kind", [
    (2, (1, 3, 23, 22), (2, 2), (8, 11), "owned_boxes"),           # stride 3 > k along H: boxes with a gap row
    (2, (2, 2, 24, 24), (3, 2), (8, 12), "owned_boxes"),           # stride 3 = k along H
    (2, (1, 2, 30, 16), (2, 2), (8, 8), "owned_boxes"),            # stride 4 along H
    (2, (1, 2, 16, 12), (2, 2), (8, 6), "owned_boxes"),            # out along W of 6: units of 2 cells
    (2, (1, 1, 514, 8), (2, 2), (257, 4), "owned_boxes"),          # 1028 cells, two blocks of 516
    (3, (1, 2, 11, 14, 8), (2, 2, 2), (4, 5, 4), "owned_boxes"),   # strides 3, 3, 2
    (3, (1, 2, 3, 10, 10), (3, 2, 2), (1, 5, 5), "owned_boxes"),   # one cell along T: its box is the whole axis
    (2, (1, 3, 23, 23), (2, 2), (8, 8), "tile_stores"),            # stride 3 along W: rows of 3, the tiles
])
def test_backward_owned_boxes_strides(device, dims, shape, k, out, kind):
    # Integer strides from k to 4 (owned boxes on CUDA when the boxes are 2 wide along
    # W), forward indices, and dx written at the buffer's start and one, two or four
    # elements past it (box rows stored as 8-, 4-, 2- or 1-element pieces): equal to the
    # CPU kernel.
    for dtype in (torch.float32, torch.bfloat16):
        x = random(shape, dtype, device)
        _, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
        g = random(i.shape, dtype, device)
        cpu = _bw(dims)(g.cpu(), x.cpu(), list(k), list(out), i.cpu())
        assert torch.equal(_bw(dims)(g, x, list(k), list(out), i).cpu(), cpu)
        plan = _backward_plan(dims, shape, k, out, dtype, device)
        ws = torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)
        for offset in (1, 2, 4):
            buffer = poison(torch.empty(x.numel() + offset, dtype=dtype, device=device))
            dx = buffer[offset:].view(shape)
            _bw(dims).out(g, x, list(k), list(out), i, grad_input=dx, workspace=ws)
            assert torch.equal(dx.cpu(), cpu), offset
        config = _config("_backward", dims, shape, k, out, dtype)
        assert (config.kind, config["index32"]) == (kind, 1)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_negative_zero_grad_adds_to_positive_zero(device, dims, dtype):
    # PyTorch adds each gradient into a zeroed dx, and 0 + (-0) = +0: a kernel that stores
    # a lone contribution instead of adding it must still give +0. Disjoint and
    # overlapping windows.
    for k in ((2,) * dims, (3,) * dims):
        shape, out = ((2, 3, 16, 16), (8,) * dims) if dims == 2 else ((2, 2, 8, 8, 8), (4,) * dims)
        x = random(shape, dtype, device)
        _, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
        g = torch.full(i.shape, -0.0, dtype=dtype, device=device)
        dx = _bw(dims)(g, x, list(k), list(out), i)
        assert torch.equal(dx, torch.zeros_like(dx))
        assert not torch.signbit(dx).any()


@pytest.mark.parametrize("dims", [2, 3])
def test_backward_stray_indices_in_one_tiled_plane(device, dims):
    # Forward indices everywhere but a few cells of one plane that point far from their
    # windows (one into another tile, one duplicated): only that plane takes the
    # full-scan path, the others the tile counts; both must match the reference.
    shape, k, out = ((3, 2, 140, 120), (3, 3), (50, 40)) if dims == 2 else ((2, 2, 12, 40, 36), (2, 3, 2), (6, 13, 17))
    x = random(shape, torch.float64, device)
    _, i = _fw(dims)(x, list(k), list(out), _samples(x, dims))
    plane = 1
    for s in shape[-dims:]:
        plane *= s
    i = i.clone()
    flat = i[1, 0].view(-1)
    flat[0] = plane - 1
    flat[-1] = 0
    flat[7] = flat[3]
    g = random(i.shape, torch.float64, device)
    dx = _bw(dims)(g, x, list(k), list(out), i)
    assert_close(dx, _scatter_reference(g, i, shape, dims))
    assert torch.equal(dx, _bw(dims)(g, x, list(k), list(out), i))


@pytest.mark.parametrize("dims", [2, 3])
def test_vmap_errors(device, dims):
    op, backward_op = _fw(dims), _bw(dims)
    x = random((4, 3) + (9,) * dims, torch.float32, device)
    samples = torch.rand(1, 3, dims, device=device)
    with pytest.raises(ValueError, match=r"random_samples shape \[1, 3, %d\] != expected \[N >= 2, 3, %d\]"
                       % (dims, dims)):
        torch.func.vmap(lambda x: op(x, [2] * dims, [5] * dims, samples[:1]))(
            random((4, 2, 3) + (9,) * dims, torch.float32, device))
    _, indices = op(x[0], [2] * dims, [5] * dims, samples)
    grad = random((4, *indices.shape), torch.float32, device)
    with pytest.raises(ValueError, match=r"grad_output shape"):
        torch.func.vmap(lambda g: backward_op(g, x[0], [2] * dims, [5] * dims, indices))(grad[..., :4])


# ---------------------------------------------------------------------------- modules and functional


@pytest.mark.parametrize("dims", [2, 3])
def test_modules_match_torch_under_same_seed(device, dims):
    ours_cls = getattr(baracuda_ops.nn, f"FractionalMaxPool{dims}d")
    torch_cls = getattr(torch.nn, f"FractionalMaxPool{dims}d")
    shape = (2, 3, 21, 18) if dims == 2 else (2, 3, 9, 10, 11)
    for x, kwargs in ((random(shape, torch.float32, device), {"output_ratio": 0.5}),
                      (random(shape[1:], torch.float32, device), {"output_size": 4, "return_indices": True})):
        torch.manual_seed(7)
        a = ours_cls(2, **kwargs)(x)
        torch.manual_seed(7)
        b = torch_cls(2, **kwargs)(x)
        for p, q in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(p, q)


def test_functional_errors_like_torch():
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(ValueError, match="requires specifying either an output_size or an output_ratio"):
        baracuda_ops.fractional_max_pool2d(x, 2)
    with pytest.raises(ValueError, match="output_ratio must have 2 entries"):
        baracuda_ops.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5, 0.5))


# ---------------------------------------------------------------------------- Plan API


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_run_writes_every_element(device, dims, dtype):
    shape, k, out = ((2, 3, 11, 13), (3, 2), (7, 8)) if dims == 2 else ((2, 2, 7, 6, 9), (2, 2, 3), (4, 3, 5))
    desc = getattr(baracuda_ops, f"FractionalMaxPool{dims}dDescriptor")(shape, k, out, dtype, device)
    plan = getattr(baracuda_ops, f"FractionalMaxPool{dims}dPlan").select(desc)
    x = random(shape, dtype, device)
    s = random(desc.samples_shape, dtype, device).abs().fmod(1)
    y = poison(torch.empty(desc.output_shape, dtype=dtype, device=device))
    i = poison(torch.empty(desc.output_shape, dtype=torch.int64, device=device))
    plan.run(baracuda_ops.FractionalMaxPoolArgs(x, s, y, i))
    ry, ri = _torch(dims, x, k, out, s)
    assert torch.equal(y, ry) and torch.equal(i, ri)
    sku = plan.sku()
    assert sku.op == f"fractional_max_pool{dims}d" and sku.index_dtype == torch.int64
    # kernel sizes differ between axes: windows scanned in loops, one cell per thread;
    # 56 (2d) or 60 (3d) cells, one segment of two warps
    config = _config("", dims, shape, k, out, dtype)
    assert config.kind == "window_max_resident"
    assert {name: config[name] for name in ("index32", "k", "table", "cells_per_thread", "threads")} == dict(
        index32=1, k=0, table=1, cells_per_thread=1, threads=64)
    if device.type == "cpu":
        assert sku.variant == "cpu_plane_window_max"
    assert plan.workspace_size() == 0 and plan.precision_guarantee().accumulator_dtype == dtype

    bplan = getattr(baracuda_ops, f"FractionalMaxPool{dims}dBackwardPlan").select(desc)
    g = random(desc.output_shape, dtype, device)
    gi = poison(torch.empty(shape, dtype=dtype, device=device))
    ws = baracuda_ops.Workspace.allocate(bplan.workspace_size(), device)
    bplan.run(baracuda_ops.FractionalMaxPoolBackwardArgs(g, x, i, gi), ws)
    assert torch.equal(gi, _bw(dims)(g, x, list(k), list(out), i))
    assert bplan.precision_guarantee().accumulator_dtype == torch.float32
    if device.type == "cpu":
        assert bplan.sku().variant == "cpu_plane_ordered_scatter" and bplan.workspace_size() == 0
    else:
        # overlapping windows: a contribution count per element
        assert _config("_backward", dims, shape, k, out, dtype).kind == "tile_counts"
        # one int32 stray flag per tile; these planes fit one 64 KiB tile
        assert bplan.workspace_size() == shape[0] * shape[1] * 4
        with pytest.raises(baracuda_ops.WorkspaceTooSmallError):
            bplan.run(baracuda_ops.FractionalMaxPoolBackwardArgs(g, x, i, gi), baracuda_ops.Workspace.allocate(1, device))
        with pytest.raises(baracuda_ops.UnsupportedError):
            type(bplan).select(desc, baracuda_ops.PlanPreference(max_workspace_bytes=0))


def test_plan_errors(device):
    desc = baracuda_ops.FractionalMaxPool2dDescriptor((2, 3, 10, 10), (2, 2), (5, 5), torch.float32, device)
    plan = baracuda_ops.FractionalMaxPool2dPlan.select(desc)
    x = random((2, 3, 10, 10), torch.float32, device)
    s = torch.rand(2, 3, 2, device=device)
    i = torch.empty(2, 3, 5, 5, dtype=torch.int64, device=device)
    with pytest.raises(baracuda_ops.BufferTooSmallError):
        plan.run(baracuda_ops.FractionalMaxPoolArgs(x, s, torch.empty(2, 3, 5, 4, device=device), i))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.FractionalMaxPoolArgs(x, s, torch.empty(2, 3, 5, 5, device=device), i.int()))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.FractionalMaxPoolArgs(x, s.double(), torch.empty(2, 3, 5, 5, device=device), i))
    with pytest.raises(baracuda_ops.InvalidProblemError, match=r"output_size 9 \+ kernel_size 3 - 1 > input"):
        baracuda_ops.FractionalMaxPool2dPlan.select(
            baracuda_ops.FractionalMaxPool2dDescriptor((2, 3, 10, 10), (3, 3), (9, 5), torch.float32, device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="float16, bfloat16"):
        baracuda_ops.FractionalMaxPool3dBackwardPlan.select(
            baracuda_ops.FractionalMaxPool3dDescriptor((3, 4, 4, 4), (2, 2, 2), (2, 2, 2), torch.int32, device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="expected a FractionalMaxPool3dDescriptor"):
        baracuda_ops.FractionalMaxPool3dPlan.select(desc)


# ---------------------------------------------------------------------------- schemas and errors


class TestFractionalMaxPoolMessages(TestCase):
    def test_schemas(self):
        ops = [getattr(getattr(torch.ops.baracuda, f"fractional_max_pool{d}d{b}"), o)
               for d in (2, 3) for b in ("", "_backward") for o in ("default", "out")]
        self.assertExpectedInline(
            "\n".join(str(op._schema) for op in ops),
            """\
baracuda::fractional_max_pool2d(Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor random_samples) -> (Tensor output, Tensor indices)
baracuda::fractional_max_pool2d.out(Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor random_samples, *, Tensor(a!) output, Tensor(b!) indices) -> ()
baracuda::fractional_max_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor indices) -> Tensor
baracuda::fractional_max_pool2d_backward.out(Tensor grad_output, Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor indices, *, Tensor(a!) grad_input, Tensor(b!) workspace) -> ()
baracuda::fractional_max_pool3d(Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor random_samples) -> (Tensor output, Tensor indices)
baracuda::fractional_max_pool3d.out(Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor random_samples, *, Tensor(a!) output, Tensor(b!) indices) -> ()
baracuda::fractional_max_pool3d_backward(Tensor grad_output, Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor indices) -> Tensor
baracuda::fractional_max_pool3d_backward.out(Tensor grad_output, Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor indices, *, Tensor(a!) grad_input, Tensor(b!) workspace) -> ()""",
        )

    def test_pool_too_large(self):
        x = torch.randn(2, 3, 10, 8)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [3, 3], [5, 7], torch.rand(2, 3, 2)),
            """baracuda::fractional_max_pool2d: output_size 7 + kernel_size 3 - 1 > input width 8 (need output_size + kernel_size - 1 <= input size)""",
        )

    def test_pool3d_too_large(self):
        x = torch.randn(3, 4, 5, 6)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool3d(x, [2, 2, 2], [4, 2, 2], torch.rand(1, 3, 3)),
            """baracuda::fractional_max_pool3d: output_size 4 + kernel_size 2 - 1 > input time 4 (need output_size + kernel_size - 1 <= input size)""",
        )

    def test_wrong_dims(self):
        x = torch.randn(10, 8)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [2, 2], [4, 4], torch.rand(1, 1, 2)),
            """baracuda::fractional_max_pool2d: expected a 3-D or 4-D input, got shape [10, 8]""",
        )

    def test_zero_kernel(self):
        x = torch.randn(1, 2, 6, 6)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [0, 2], [4, 4], torch.rand(1, 2, 2)),
            """baracuda::fractional_max_pool2d: kernel_size must be > 0, got [0, 2]""",
        )

    def test_samples_wrong_shape(self):
        x = torch.randn(2, 3, 10, 8)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [2, 2], [4, 4], torch.rand(2, 3, 3)),
            """baracuda::fractional_max_pool2d: random_samples shape [2, 3, 3] != expected [N >= 2, 3, 2]""",
        )
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [2, 2], [4, 4], torch.rand(1, 3, 2)),
            """baracuda::fractional_max_pool2d: random_samples shape [1, 3, 2] != expected [N >= 2, 3, 2]""",
        )

    def test_samples_wrong_dtype(self):
        x = torch.randn(2, 3, 6, 5, 4)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.fractional_max_pool3d(x, [2, 2, 2], [2, 2, 2], torch.rand(2, 3, 3).double()),
            """baracuda::fractional_max_pool3d: random_samples dtype Double != self dtype Float""",
        )

    def test_integer_input(self):
        x = torch.ones(2, 3, 6, 6, dtype=torch.int32)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.fractional_max_pool2d(x, [2, 2], [3, 3], torch.rand(2, 3, 2)),
            """baracuda::fractional_max_pool2d: self must be float16, bfloat16, float32 or float64, got Int""",
        )

    def test_indices_wrong_shape(self):
        x = torch.randn(2, 3, 10, 8)
        g = torch.randn(2, 3, 4, 4)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool2d_backward(
                g, x, [2, 2], [4, 4], torch.zeros(2, 3, 4, 5, dtype=torch.int64)),
            """baracuda::fractional_max_pool2d_backward: indices shape [2, 3, 4, 5] != expected [2, 3, 4, 4]""",
        )

    def test_indices_wrong_dtype(self):
        x = torch.randn(3, 10, 8)
        g = torch.randn(3, 4, 4)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.fractional_max_pool2d_backward(
                g, x, [2, 2], [4, 4], torch.zeros(3, 4, 4, dtype=torch.int32)),
            """baracuda::fractional_max_pool2d_backward: indices dtype Int != expected Long""",
        )

    def test_grad_output_wrong_shape(self):
        x = torch.randn(2, 3, 6, 6, 6)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.fractional_max_pool3d_backward(
                torch.randn(2, 3, 3, 3, 2), x, [2, 2, 2], [3, 3, 3], torch.zeros(2, 3, 3, 3, 3, dtype=torch.int64)),
            """baracuda::fractional_max_pool3d_backward: grad_output shape [2, 3, 3, 3, 2] != expected [2, 3, 3, 3, 3]""",
        )

    def test_index_out_of_range_cpu(self):
        x = torch.randn(1, 1, 4, 4)
        self.assertExpectedRaisesInline(
            IndexError,
            lambda: torch.ops.baracuda.fractional_max_pool2d_backward(
                torch.ones(1, 1, 2, 2), x, [2, 2], [2, 2], torch.tensor([[[[0, 1], [16, 3]]]])),
            """baracuda::fractional_max_pool2d_backward: indices value 16 is out of range for an input plane of 16 elements""",
        )

    def test_output_dtype_mismatch(self):
        x = torch.randn(2, 3, 6, 6)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.fractional_max_pool2d.out(
                x, [2, 2], [3, 3], torch.rand(2, 3, 2), output=torch.empty(2, 3, 3, 3),
                indices=torch.empty(2, 3, 3, 3, dtype=torch.int32)),
            """baracuda::fractional_max_pool2d: indices dtype Int != expected Long""",
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_cuda():
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with pytest.raises(ValueError, match=r"random_samples is on cpu but self is on cuda:0"):
        torch.ops.baracuda.fractional_max_pool2d(x, [2, 2], [4, 4], torch.rand(2, 3, 2))
