import itertools
import math

import pytest
import torch
from expecttest import TestCase

import baracuda_ops
from conftest import CUDA_OK
from helpers import FLOAT_DTYPES, assert_close, poison, random
from launch_configs import device_has_recorded_facts, launch_config, recorded_facts_name

HALF = (torch.float16, torch.bfloat16)


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _reference(x, residual, ns, weight, eps, offset=0.0, casting="torch"):
    """(y, h) from plain ops: h = input + residual rounded to the residual's dtype (the kernel's
    own rounding, so compared exactly), y in float64 from h as stored (llama: x-hat rounded to
    the input dtype first)."""
    if eps is None:
        eps = torch.finfo(_acc(x.dtype)).eps
    h = x if residual is None else (x.to(_acc(x.dtype)) + residual.to(_acc(x.dtype))).to(residual.dtype)
    dims = tuple(range(h.dim() - len(ns), h.dim()))
    hd = h.double()
    xhat = hd * torch.rsqrt(hd.pow(2).mean(dims, keepdim=True) + eps)
    if casting == "llama":
        xhat = xhat.to(x.dtype).double()
    y = xhat if weight is None else xhat * (weight.double() + offset)
    return y, h


def _out_dtype(dtype, weight, casting):
    return torch.promote_types(dtype, weight.dtype) if casting == "llama" and weight is not None else dtype


CASES = [  # (input shape, normalized_shape, weight shape or None)
    ((6, 32), (32,), (32,)),
    ((3, 5, 7), (7,), (7,)),
    ((2, 3, 4, 16), (4, 16), (4, 16)),
    ((2, 5, 4, 8), (8,), (4, 8)),  # per head
    ((3, 2, 4, 8), (8,), (2, 4, 8)),  # per head over two dims
    ((4, 40), (40,), None),
    ((0, 16), (16,), (16,)),
]


def _weight_dtypes(dtype):
    return (dtype, torch.float32) if dtype in HALF else (dtype,)


def _residual_dtypes(dtype):
    return (None, dtype, torch.float32) if dtype in HALF else (None, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("casting", ["torch", "llama", "gemma"])
def test_forward_matches_float64(device, dtype, casting):
    for (shape, ns, wshape), wdt, rdt, offset in itertools.product(CASES, _weight_dtypes(dtype),
                                                                   _residual_dtypes(dtype), (0.0, 1.0)):
        if wshape is None and offset:
            continue
        x = random(shape, dtype, device)
        r = None if rdt is None else random(shape, rdt, device)
        w = None if wshape is None else random(wshape, wdt, device)
        y, h, rstd = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, offset, casting)
        want_y, want_h = _reference(x, r, ns, w, None, offset, casting)
        assert y.dtype == _out_dtype(dtype, w, casting) and y.shape == x.shape
        assert rstd.dtype == _acc(dtype) and rstd.shape == x.shape[: x.dim() - len(ns)] + (1,) * len(ns)
        if r is None:
            assert h.shape == (0,)
        else:
            assert h.dtype == r.dtype
            torch.testing.assert_close(h, want_h, rtol=0, atol=0)
        assert_close(y, want_y, dtype=dtype, scale=2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_public_function(device, dtype):
    x, r = random((4, 24), dtype, device), random((4, 24), dtype, device)
    w = random((24,), dtype, device)
    y = baracuda_ops.rms_norm_fused(x, 24, w)
    torch.testing.assert_close(y, torch.ops.baracuda.rms_norm_fused(x, None, [24], w)[0], rtol=0, atol=0)
    y, h = baracuda_ops.rms_norm_fused(x, (24,), w, 1e-5, residual=r, weight_offset=0.5, casting="gemma")
    want_y, want_h = _reference(x, r, (24,), w, 1e-5, 0.5)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)
    assert_close(y, want_y, dtype=dtype, scale=2)
    if dtype in HALF:  # the residual stream kept in float32
        y, h = baracuda_ops.rms_norm_fused(x, (24,), w, residual=r, residual_dtype=torch.float32)
        assert h.dtype == torch.float32 and y.dtype == dtype
        torch.testing.assert_close(h, x.float() + r.float(), rtol=0, atol=0)
    # torch casting equals F.rms_norm of h
    y, h = baracuda_ops.rms_norm_fused(x, (24,), w, residual=r)
    assert_close(y, torch.nn.functional.rms_norm(h.double(), (24,), w.double(), torch.finfo(_acc(dtype)).eps),
                 dtype=dtype, scale=2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_and_module_take_the_variants(device, dtype):
    # baracuda_ops.rms_norm's keyword-only options and a per-head weight run rms_norm_fused, bit for bit;
    # without them it is the plain op
    x, r = random((4, 3, 24), dtype, device), random((4, 3, 24), dtype, device)
    w, w_heads = random((24,), dtype, device), random((3, 24), dtype, device)
    for kwargs in ({"residual": r}, {"weight_offset": 1.0, "casting": "gemma"}, {"casting": "llama"}):
        got = baracuda_ops.rms_norm(x, 24, w, 1e-6, **kwargs)
        want = baracuda_ops.rms_norm_fused(x, 24, w, 1e-6, **kwargs)
        for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(baracuda_ops.rms_norm(x, [24], w_heads), baracuda_ops.rms_norm_fused(x, [24], w_heads),
                               rtol=0, atol=0)
    torch.testing.assert_close(baracuda_ops.rms_norm(x, [24], w), torch.ops.baracuda.rms_norm(x, [24], w, None)[0],
                               rtol=0, atol=0)
    norm = baracuda_ops.nn.RMSNorm(24, eps=1e-6, device=device, dtype=dtype, weight_offset=1.0, casting="gemma")
    assert isinstance(norm, torch.nn.RMSNorm) and "casting='gemma'" in repr(norm)
    torch.nn.init.zeros_(norm.weight)
    torch.testing.assert_close(norm(x), baracuda_ops.rms_norm_fused(x, 24, norm.weight.detach(), 1e-6,
                                                                     weight_offset=1.0, casting="gemma"),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match='baracuda::rms_norm: casting must be "torch", "llama" or "gemma"'):
        baracuda_ops.nn.RMSNorm(24, casting="fp8")


def _check_backward(shape, ns, wshape, dtype, wdt, rdt, casting, device):
    """Gradients of rms_norm_fused (of y, and of h with a residual) against float64 autograd."""
    offset = 0.0 if wshape is None else 0.75
    x = random(shape, dtype, device, requires_grad=True)
    r = None if rdt is None else random(shape, rdt, device, requires_grad=True)
    w = None if wshape is None else random(wshape, wdt, device, requires_grad=True)
    leaves = [t for t in (x, r, w) if t is not None]
    y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, offset, casting)
    gy = random(y.shape, y.dtype, device)
    outs, cots = [y], [gy]
    if r is not None:
        gh = random(h.shape, h.dtype, device)
        outs.append(h)
        cots.append(gh)
    got = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    x64, r64, w64 = (leaves64.pop(0), leaves64.pop(0) if r is not None else None,
                     leaves64.pop(0) if w is not None else None)
    hd = x64 if r64 is None else x64 + r64
    dims = tuple(range(hd.dim() - len(ns), hd.dim()))
    yd = hd * torch.rsqrt(hd.pow(2).mean(dims, keepdim=True) + torch.finfo(_acc(dtype)).eps)
    if w64 is not None:
        yd = yd * (w64 + offset)
    want_outs, want_cots = [yd], [gy.double()]
    if r is not None:
        want_outs.append(hd)
        want_cots.append(gh.double())
    wrt = [t for t in (x64, r64, w64) if t is not None]
    want = torch.autograd.grad(want_outs, wrt, want_cots)
    # dW sums a product per row: its rounding error grows with the square root of the rows summed
    rows = x.numel() // max(1, math.prod(ns))
    for a, b, leaf in zip(got, want, [t for t in (x, r, w) if t is not None], strict=True):
        assert a.dtype == leaf.dtype and a.shape == leaf.shape
        # llama: dW sees x-hat rounded to the input dtype; the float64 reference does not
        scale = 8 if casting == "torch" else 16
        assert_close(a, b, dtype=dtype, scale=scale * max(1.0, math.sqrt(rows / 64)) if leaf is w else scale)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_backward_matches_float64_autograd(device, dtype, casting):
    for (shape, ns, wshape), wdt, rdt in itertools.product(CASES, _weight_dtypes(dtype), _residual_dtypes(dtype)):
        _check_backward(shape, ns, wshape, dtype, wdt, rdt, casting, device)


# Rows past the short CASES (on CUDA: a row split over a whole warp, a CTA, the longest rows held in
# registers, cluster rows: in the backward 2 to 8 CTAs a row, 5 at 40000 (a cluster whose last CTA holds
# part of a row), in the float32 forward at 40000 and 65536, on an H200 the forward's row clusters past
# 1024 x 4 vectors, 3 CTAs of 224 threads at 40000 16-bit; and more rows than the grid holds at once
# (at 8192: the 16-bit backward's 512 x 2 rows, registers capped for two CTAs per SM; at 16384 its
# 512 x 4 rows, which on an H200 fetch their next row into L2 in 16-bit; at 32768, cluster rows
# visiting several rows).
LONG_CASES = [((3, 1024), (1024,)), ((5, 4096), (4096,)), ((2, 16384), (16384,)), ((2, 65536), (65536,)),
              ((9000, 1024), (1024,)), ((300, 8192), (8192,)), ((300, 16384), (16384,)), ((300, 32768), (32768,)),
              ((7, 40000), (40000,))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_long_and_many_rows_match_float64(device, dtype, casting):
    for shape, ns in LONG_CASES:
        x, r, w = random(shape, dtype, device), random(shape, dtype, device), random(ns, dtype, device)
        y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, 0.5, casting)
        want_y, want_h = _reference(x, r, ns, w, None, 0.5, casting)
        torch.testing.assert_close(h, want_h, rtol=0, atol=0)
        assert_close(y, want_y, dtype=dtype, scale=2)
        _check_backward(shape, ns, ns, dtype, dtype, dtype, casting, device)


@pytest.mark.parametrize("residual_dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 40000), (130, 65536)])
def test_long_rows_of_each_residual_match_float64(device, residual_dtype, shape):
    # On an H200 bfloat16 rows past 1024 x 4 vectors go a row a cluster without a residual or with
    # one of the input's dtype, and stay in registers (1024 x 8) with a float32 residual.
    ns = shape[1:]
    x, w = random(shape, torch.bfloat16, device), random(ns, torch.bfloat16, device)
    r = None if residual_dtype is None else random(shape, residual_dtype, device)
    y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, 0.0, "torch")
    want_y, want_h = _reference(x, r, ns, w, None)
    if r is not None:
        torch.testing.assert_close(h, want_h, rtol=0, atol=0)
    assert_close(y, want_y, dtype=torch.bfloat16, scale=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False),
                                  (False, False, True)])
def test_cluster_rows_each_output_alone(device, dtype, mask):
    # Cluster rows on CUDA (a row over 4 CTAs in bfloat16, 8 in float32 and float64), with a float32
    # residual stream on the 16-bit input; each output as the whole backward computes it.
    n = 32768 if dtype == torch.bfloat16 else 16384
    shape, ns = (70, n), (n,)
    rdt = torch.float32 if dtype == torch.bfloat16 else dtype
    g, gh = random(shape, dtype, device), random(shape, rdt, device)
    h, w = random(shape, rdt, device), random(ns, dtype, device)
    rstd = torch.rsqrt(h.to(_acc(dtype)).pow(2).mean(-1, keepdim=True) + 1e-5)
    whole = torch.ops.baracuda.rms_norm_fused_backward(g, gh, h, list(ns), rstd, w, 0.25, "torch", dtype,
                                                       [True, True, True])
    alone = torch.ops.baracuda.rms_norm_fused_backward(g, gh, h, list(ns), rstd, w, 0.25, "torch", dtype, list(mask))
    for a, b, wanted in zip(alone, whole, mask, strict=True):
        if wanted:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        else:
            assert a is None


# Rows streamed through shared memory on CUDA (an H200's bandwidth; register rows elsewhere): 64 to 256
# threads x 4 vectors, 3 rows staged (2 at N = 8192), a row whose last chunk is partial (2560), and more
# rows than the grid's CTAs times their stages, so that every stage is refilled; at 2048 the CTAs (6 an
# SM) fold their dW sums in launch clusters (dw_fold).
STREAMED_CASES = [(2500, 2048), (1300, 2560), (1300, 4096), (600, 8192)]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_streamed_rows_match_float64(device, dtype, casting):
    if device.type != "cuda":
        pytest.skip("the streamed rows are a CUDA kernel (CPU rows: LONG_CASES)")
    folds = [launch_config("rms_norm_fused_backward", [m, n, 1, 2], dtype, "h200")["dw_fold"]
             for m, n in STREAMED_CASES]
    assert folds == [6, 1, 1, 1]
    for (m, n), wdt, residual in itertools.product(STREAMED_CASES, (dtype, torch.float32), (None, dtype)):
        _check_backward((m, n), (n,), (n,), dtype, wdt, residual, casting, device)


# Cluster rows streamed through shared memory on CUDA (an H200's bandwidth; register cluster rows
# elsewhere), 128-thread CTAs: rows over 8 of them (N = 32768 16-bit, 16384 float32), 10 (40000
# 16-bit, the last CTA's part of a row short) and 16 (65536 16-bit, 32768 float32: non-portable
# clusters); more rows than the clusters times their stages (every stage is refilled); at 32760,
# 65528, 16380 and 32760 float32 the last CTA's last chunk is short.
STREAMED_CLUSTER_CASES = {torch.bfloat16: [(300, 32768), (300, 32760), (300, 65536)],
                          torch.float16: [(300, 32760), (300, 40000), (300, 65528)],
                          torch.float32: [(300, 16384), (300, 16380), (300, 32768), (300, 32760)]}


@pytest.mark.parametrize("dtype", list(STREAMED_CLUSTER_CASES))
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_streamed_cluster_rows_match_float64(device, dtype, casting):
    if device.type != "cuda":
        pytest.skip("the streamed cluster rows are a CUDA kernel (CPU rows: LONG_CASES)")
    cases = STREAMED_CLUSTER_CASES[dtype]
    kinds = [launch_config("rms_norm_fused_backward", [m, n, 1, 4], dtype, "h200") for m, n in cases]
    assert {c.kind for c in kinds} == {"streamed_cluster_rows"}
    for (m, n), wdt, residual in itertools.product(cases, (dtype, torch.float32), (None, dtype)):
        _check_backward((m, n), (n,), (n,), dtype, wdt, residual, casting, device)


@pytest.mark.parametrize("dres", [False, True])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False),
                                  (False, False, True), (True, True, False)])
@pytest.mark.parametrize("shape", [(1300, 4096), (300, 32768)])
def test_streamed_rows_each_output_alone(device, dres, mask, shape):
    # Streamed rows of one CTA, and of a cluster.
    if device.type != "cuda":
        pytest.skip("the streamed rows are a CUDA kernel")
    ns = shape[-1:]
    g, h, w = (random(shape, torch.bfloat16, device), random(shape, torch.bfloat16, device),
               random(ns, torch.bfloat16, device))
    gh = random(shape, torch.bfloat16, device) if dres else None
    rstd = torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    args = (g, gh, h, list(ns), rstd, w, 0.25, "torch", torch.bfloat16)
    whole = torch.ops.baracuda.rms_norm_fused_backward(*args, [True, True, True])
    alone = torch.ops.baracuda.rms_norm_fused_backward(*args, list(mask))
    for a, b, wanted in zip(alone, whole, mask, strict=True):
        if wanted:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        else:
            assert a is None


@pytest.mark.parametrize("n", [2048, 4096, 8192, 16384, 32768, 65536])
@pytest.mark.skipif(not CUDA_OK, reason="the row kernels are CUDA's")
def test_backward_variant_is_the_launch_config(n):
    # The Plan's variant is the policy's config on this device (streamed rows on an H200, register
    # rows on an H100 at N = 2048 ... 8192); its row groups follow the compiled kernel's occupancy.
    device = torch.device("cuda")
    if not device_has_recorded_facts(device):
        pytest.skip("the recorded facts are an H100's and an H200's")
    want = launch_config("rms_norm_fused_backward", [4096, n, 1, 2], torch.bfloat16, recorded_facts_name(device))
    desc = baracuda_ops.RMSNormFusedBackwardDescriptor((4096, n), (n,), torch.bfloat16, weight_dtype=torch.bfloat16,
                                                       device=device)
    variant = baracuda_ops.RMSNormFusedBackwardPlan.select(desc).sku().variant
    assert variant.split(",row_groups=")[0] == want.describe().split(",row_groups=")[0]


@pytest.mark.parametrize("n", [16384, 32768, 40000, 65536])
@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.skipif(not CUDA_OK, reason="the row kernels are CUDA's")
def test_forward_variant_is_the_launch_config(n, residual_dtype):
    # The Plan's variant is the policy's config on this device, the residual's dtype included
    # (row clusters on an H200 for rows past 1024 x 4 vectors with a residual of the input's dtype).
    device = torch.device("cuda")
    if not device_has_recorded_facts(device):
        pytest.skip("the recorded facts are an H100's and an H200's")
    in_dtype = int(residual_dtype == torch.bfloat16)
    want = launch_config("rms_norm_fused", [2048, n, 1, in_dtype], torch.bfloat16, recorded_facts_name(device))
    desc = baracuda_ops.RMSNormFusedDescriptor((2048, n), (n,), torch.bfloat16, residual_dtype=residual_dtype,
                                               device=device)
    variant = baracuda_ops.RMSNormFusedPlan.select(desc).sku().variant
    assert variant.split(",row_groups=")[0] == want.describe().split(",row_groups=")[0]


@pytest.mark.parametrize("casting", ["torch", "llama"])
@pytest.mark.parametrize("shape", [(6, 4, 64), (400, 4, 2048)])
def test_per_head_weight_without_its_gradient(device, casting, shape):
    # on CUDA the backward then holds rows in registers (the dW of a per-head weight takes the CTA-per-row
    # kernel), also at 1600 rows of 2048, which with one weight row would be streamed on an H200
    x, r = random(shape, torch.bfloat16, device, requires_grad=True), random(shape, torch.bfloat16, device)
    n = shape[-1]
    w = random(shape[-2:], torch.bfloat16, device)
    y, _, _ = torch.ops.baracuda.rms_norm_fused(x, r, [n], w, None, 0.5, casting)
    gy = random(y.shape, y.dtype, device)
    (dx,) = torch.autograd.grad(y, x, gy)
    x64 = x.detach().double().requires_grad_()
    h64 = x64 + r.double()
    y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps) * (w.double() + 0.5)
    (want,) = torch.autograd.grad(y64, x64, gy.double())
    assert_close(dx, want, dtype=torch.bfloat16, scale=16)


def test_backward_gradients_of_both_outputs_share_one_tensor(device):
    x = random((5, 16), torch.float32, device, requires_grad=True)
    r = random((5, 16), torch.float32, device, requires_grad=True)
    y, h = baracuda_ops.rms_norm_fused(x, 16, None, residual=r)
    dx, dr = torch.autograd.grad((y.sum() + 2 * h.sum()), (x, r))
    torch.testing.assert_close(dx, dr, rtol=0, atol=0)
    g, gh = torch.randn_like(y), torch.randn_like(h)
    _, _, rstd = torch.ops.baracuda.rms_norm_fused(x, r, [16], None)
    gi, gr, gw = torch.ops.baracuda.rms_norm_fused_backward(g, gh, h.detach(), [16], rstd, None, 0.0, "torch",
                                                            torch.float32, [True, True, True])
    assert gw is None
    torch.testing.assert_close(gi, gr, rtol=0, atol=0)
    only_w = torch.ops.baracuda.rms_norm_fused_backward(g, gh, h.detach(), [16], rstd, None, 0.0, "torch",
                                                        torch.float32, [False, False, True])
    assert only_w == (None, None, None)


def test_double_backward_raises(device):
    x = random((3, 8), torch.float64, device, requires_grad=True)
    w = random((8,), torch.float64, device, requires_grad=True)
    (dx,) = torch.autograd.grad(baracuda_ops.rms_norm_fused(x, 8, w).sum(), (x,), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dx.sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bit_identical_twice(device, dtype):
    x, r = random((257, 300), dtype, device), random((257, 300), torch.float32, device)
    w = random((300,), dtype, device)

    def run():
        y, h, rstd = torch.ops.baracuda.rms_norm_fused(x, r, [300], w, None, 1.0, "torch")
        g = torch.ones_like(y).uniform_(-1, 1, generator=torch.Generator(device).manual_seed(3))
        return (y, h, rstd) + torch.ops.baracuda.rms_norm_fused_backward(g, h, h, [300], rstd, w, 1.0, "torch", dtype,
                                                                         [True, True, True])

    for a, b in zip(run(), run(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cpu_same_bits_on_one_and_several_threads():
    # Row sums and the dW chunks are fixed by the shape alone (the per-head dW: chunks of whole
    # weight periods), so every output is the same whatever the thread count.
    x = random((96, 4, 256), torch.bfloat16, "cpu")
    r = random((96, 4, 256), torch.float32, "cpu")
    w = random((4, 256), torch.float32, "cpu")

    def run():
        y, h, rstd = torch.ops.baracuda.rms_norm_fused(x, r, [256], w, None, 1.0, "llama")
        g = torch.linspace(-1, 1, y.numel()).view_as(y).to(y.dtype)
        grads = torch.ops.baracuda.rms_norm_fused_backward(g, h, h, [256], rstd, w, 1.0, "llama", x.dtype,
                                                           [True, True, True])
        q, _, scale = torch.ops.baracuda.rms_norm_quant(x, r, [256], w, None, 1.0, "llama", None)
        return [y, h, rstd, *grads, q, scale]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(4)
        several = run()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, several, strict=True):
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_zero_size(device):
    x = random((0, 4, 8), torch.float32, device, requires_grad=True)
    w = random((4, 8), torch.float32, device, requires_grad=True)
    r = random((0, 4, 8), torch.float32, device, requires_grad=True)
    y, h = baracuda_ops.rms_norm_fused(x, 8, w, residual=r)
    assert y.shape == h.shape == (0, 4, 8)
    dx, dr, dw = torch.autograd.grad(y.sum() + h.sum(), (x, r, w))
    assert dx.shape == dr.shape == (0, 4, 8)
    torch.testing.assert_close(dw, torch.zeros_like(w), rtol=0, atol=0)


def test_non_contiguous_inputs(device):
    x = random((8, 12), torch.float32, device).t()
    r = random((12, 16), torch.float32, device)[:, ::2]
    w = random((16,), torch.float32, device)[::2]
    y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, [8], w, None, 0.0, "torch")
    want_y, want_h = _reference(x, r, (8,), w, None)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)
    assert_close(y, want_y, scale=2)


def test_compile_graph_calls_the_op_once_per_call(device):
    def fn(x, r, w, wh):
        y, h = baracuda_ops.rms_norm_fused(x, 16, w, residual=r, weight_offset=1.0)
        q = baracuda_ops.rms_norm_fused(h.view(*h.shape[:-1], 2, 8), 8, wh, casting="llama")
        return y, h, q

    inputs = [random((3, 5, 16), torch.float32, device, requires_grad=True),
              random((3, 5, 16), torch.float32, device, requires_grad=True),
              random((16,), torch.float32, device, requires_grad=True),
              random((2, 8), torch.float32, device, requires_grad=True)]
    torch._dynamo.reset()
    graph_ops = []

    def backend(gm, example_inputs):
        graph_ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)(*inputs)
    assert graph_ops.count("baracuda.rms_norm_fused.default") == 2, graph_ops


def test_torch_func_per_sample_grads(device):
    x = random((4, 3, 8), torch.float64, device)
    r = random((3, 8), torch.float64, device)
    w = random((8,), torch.float64, device)

    def loss(x, r, w):
        y, h = baracuda_ops.rms_norm_fused(x, 8, w, residual=r, weight_offset=1.0)
        return (y * h).sum()

    got = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=(0, None, None))(x, r, w)
    for k in range(4):
        leaves = [x[k].clone().requires_grad_(), r.clone().requires_grad_(), w.clone().requires_grad_()]
        want = torch.autograd.grad(loss(*leaves), leaves)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a[k], b)


@pytest.mark.parametrize("dtype,wdt", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                       (torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
def test_plans_write_every_element(device, dtype, wdt):
    shape, ns, wshape = (5, 2, 8), (8,), (2, 8)
    desc = baracuda_ops.RMSNormFusedDescriptor(shape, ns, dtype, weight_shape=wshape, weight_dtype=wdt,
                                               residual_dtype=torch.float32, weight_offset=1.0, casting="llama",
                                               device=device)
    plan = baracuda_ops.RMSNormFusedPlan.select(desc)
    # on CUDA a row of 8 elements is one or two threads' (vectors of 16 bytes), 5 rows decode rows; the dW of
    # this per-head weight takes the CTA-per-row backward
    group = dtype.itemsize // 2
    assert plan.sku().variant == ("cpu_rows" if device.type == "cpu" else
                                  f"decode_rows<threads=256,group={group},cluster=1,vpt=1,ctas_per_sm=1,stages=0,"
                                  "smem=0,row_groups=1,one_wave=0,prefetch_next=0,dw_fold=1>")
    x, r, w = random(shape, dtype, device), random(shape, torch.float32, device), random(wshape, wdt, device)
    args = baracuda_ops.RMSNormFusedArgs(x, r, w, poison(torch.empty(shape, dtype=desc.output_dtype, device=device)),
                                         poison(torch.empty(shape, device=device)),
                                         poison(torch.empty(desc.rstd_shape, device=device)))
    plan.run(args)
    want = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, 1.0, "llama")
    for a, b in zip((args.output, args.residual_out, args.rstd), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    bdesc = baracuda_ops.RMSNormFusedBackwardDescriptor(
        shape, ns, dtype, weight_shape=wshape, weight_dtype=wdt, residual_dtype=torch.float32, weight_offset=1.0,
        casting="llama", device=device, output_mask=(True, True, True), has_grad_residual_out=True)
    bplan = baracuda_ops.RMSNormFusedBackwardPlan.select(bdesc)
    g, gh = random(shape, desc.output_dtype, device), random(shape, torch.float32, device)
    bargs = baracuda_ops.RMSNormFusedBackwardArgs(
        g, gh, args.residual_out, args.rstd, w, poison(torch.empty(shape, dtype=dtype, device=device)),
        poison(torch.empty(shape, device=device)), poison(torch.empty(wshape, dtype=wdt, device=device)))
    bplan.run(bargs, baracuda_ops.Workspace.allocate(bplan.workspace_size(), device))
    want = torch.ops.baracuda.rms_norm_fused_backward(g, gh, args.residual_out, list(ns), args.rstd, w, 1.0, "llama",
                                                      dtype, [True, True, True])
    for a, b in zip((bargs.grad_input, bargs.grad_residual, bargs.grad_weight), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32])
def test_backward_plan_workspace_fits_its_kernel(device, residual_dtype):
    # The Plan's problem says whether h and grad_out are of the input's dtype: on an H200 a bfloat16 stream is
    # streamed, a float32 one takes register rows, whose dW partial rows are more; the Plan's workspace must be
    # the one of the kernel that runs.
    shape, ns = (1600, 2048), (2048,)
    bdesc = baracuda_ops.RMSNormFusedBackwardDescriptor(
        shape, ns, torch.bfloat16, residual_dtype=residual_dtype, device=device, output_mask=(True, True, True),
        has_grad_residual_out=True)
    bplan = baracuda_ops.RMSNormFusedBackwardPlan.select(bdesc)
    if device.type == "cuda" and device_has_recorded_facts(device):
        want = launch_config("rms_norm_fused_backward", [1600, 2048, 1, 2, int(residual_dtype == torch.bfloat16)],
                             torch.bfloat16, recorded_facts_name(device))
        assert bplan.sku().variant.split(",row_groups=")[0] == want.describe().split(",row_groups=")[0]
    g, gh = random(shape, torch.bfloat16, device), random(shape, residual_dtype, device)
    h, w = random(shape, residual_dtype, device), random(ns, torch.bfloat16, device)
    rstd = torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    bargs = baracuda_ops.RMSNormFusedBackwardArgs(
        g, gh, h, rstd, w, poison(torch.empty(shape, dtype=torch.bfloat16, device=device)),
        poison(torch.empty(shape, dtype=residual_dtype, device=device)),
        poison(torch.empty(ns, dtype=torch.bfloat16, device=device)))
    bplan.run(bargs, baracuda_ops.Workspace.allocate(bplan.workspace_size(), device))
    want = torch.ops.baracuda.rms_norm_fused_backward(g, gh, h, list(ns), rstd, w, 0.0, "torch", torch.bfloat16,
                                                      [True, True, True])
    for a, b in zip((bargs.grad_input, bargs.grad_residual, bargs.grad_weight), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_plan_errors(device):
    desc = baracuda_ops.RMSNormFusedDescriptor((4, 8), (8,), torch.float32, casting="fp4", device=device)
    with pytest.raises(baracuda_ops.InvalidProblemError, match='casting must be "torch", "llama" or "gemma"'):
        baracuda_ops.RMSNormFusedPlan.select(desc)
    desc = baracuda_ops.RMSNormFusedDescriptor((4, 8), (8,), torch.float32, weight_shape=(3, 8), device=device)
    with pytest.raises(baracuda_ops.InvalidProblemError, match=r"weight shape \[3, 8\] must be normalized_shape"):
        baracuda_ops.RMSNormFusedPlan.select(desc)


@pytest.mark.parametrize("static_scale", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_plan_writes_the_ops_outputs(device, static_scale, dtype):
    shape, ns = (5, 2, 16), (16,)
    desc = baracuda_ops.RMSNormQuantDescriptor(shape, ns, dtype, residual_dtype=torch.float32, weight_offset=1.0,
                                               casting="gemma", static_scale=static_scale, device=device)
    plan = baracuda_ops.RMSNormQuantPlan.select(desc)
    assert plan.workspace_size() == 0
    x, r, w = random(shape, dtype, device), random(shape, torch.float32, device), random((16,), dtype, device)
    scale = torch.tensor([0.02], device=device) if static_scale else None
    args = baracuda_ops.RMSNormQuantArgs(
        x, r, w, scale, torch.full(shape, 7.0, device=device).to(torch.float8_e4m3fn),
        poison(torch.empty(shape, device=device)),
        None if static_scale else poison(torch.empty(desc.rstd_shape, device=device)))
    plan.run(args)
    q, h, row_scale = torch.ops.baracuda.rms_norm_quant(x, r, list(ns), w, None, 1.0, "gemma", scale)
    assert torch.equal(args.output.view(torch.uint8), q.view(torch.uint8))
    torch.testing.assert_close(args.residual_out, h, rtol=0, atol=0)
    if not static_scale:
        torch.testing.assert_close(args.scale_out, row_scale, rtol=0, atol=0)


def test_quant_plan_errors(device):
    shape = (4, 8)
    desc = baracuda_ops.RMSNormQuantDescriptor(shape, (8,), torch.float32, static_scale=True, device=device)
    plan = baracuda_ops.RMSNormQuantPlan.select(desc)
    x, w = random(shape, torch.float32, device), random((8,), torch.float32, device)
    q = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    with pytest.raises(baracuda_ops.InvalidProblemError, match="the descriptor has a scale but args.scale is None"):
        plan.run(baracuda_ops.RMSNormQuantArgs(x, None, w, None, q, None, None))
    with pytest.raises(baracuda_ops.InvalidProblemError, match=r"output dtype torch.float32 != expected "
                                                               r"torch.float8_e4m3fn"):
        plan.run(baracuda_ops.RMSNormQuantArgs(x, None, w, torch.ones(1, device=device), x.clone(), None, None))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="the descriptor has no scale_out but args.scale_out"):
        plan.run(baracuda_ops.RMSNormQuantArgs(x, None, w, torch.ones(1, device=device), q, None,
                                               torch.empty(4, 1, device=device)))


# ---------------------------------------------------------------------------- Hugging Face modules

transformers = pytest.importorskip("transformers")


def _hf_pairs():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    nn = baracuda_ops.nn
    return [(LlamaRMSNorm, nn.LlamaRMSNorm), (Qwen2RMSNorm, nn.Qwen2RMSNorm), (Qwen3RMSNorm, nn.Qwen3RMSNorm),
            (MistralRMSNorm, nn.MistralRMSNorm), (GemmaRMSNorm, nn.GemmaRMSNorm), (Gemma3RMSNorm, nn.Gemma3RMSNorm)]


@pytest.mark.parametrize("dtype,wdt", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                       (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                                       (torch.float64, torch.float64)])
def test_hf_modules_forward_and_backward(device, dtype, wdt):
    # Differences from the Hugging Face modules come from 1/sqrt against rsqrt and from the
    # order of the mean: within a few units in the last place of the output dtype. A float64
    # input is normalized in float64 here, in float32 by Hugging Face: float32's tolerance.
    tol = torch.float32 if dtype == torch.float64 else dtype
    for hf_cls, ours_cls in _hf_pairs():
        hf = hf_cls(64, eps=1e-5).to(device=device, dtype=wdt)
        with torch.no_grad():
            hf.weight.copy_(torch.randn_like(hf.weight))
        ours = ours_cls(64, eps=1e-5).to(device=device, dtype=wdt)
        assert list(ours.state_dict()) == list(hf.state_dict()) == ["weight"]
        assert repr(ours).split("(", 1)[1] == repr(hf).split("(", 1)[1]
        ours.load_state_dict(hf.state_dict())
        for attr in ("variance_epsilon", "eps"):
            assert hasattr(ours, attr) == hasattr(hf, attr) and getattr(ours, attr, None) == getattr(hf, attr, None)
        x = random((3, 5, 64), dtype, device, requires_grad=True)
        want, got = hf(x), ours(x)
        assert got.dtype == want.dtype, hf_cls
        # (llama with a float32 weight on a half input: x-hat rounded to the input dtype, which a
        # last-place difference in rstd can move by one unit of that dtype)
        assert_close(got, want.double(), dtype=tol, scale=2)
        g = random(want.shape, want.dtype, device)
        for a, b in zip(torch.autograd.grad(got, (x, ours.weight), g), torch.autograd.grad(want, (x, hf.weight), g),
                        strict=True):
            assert a.dtype == b.dtype
            # HF rounds dy * w to the input dtype before the norm's backward: larger differences in half types
            assert_close(a, b.double(), dtype=tol, scale=8 if dtype in HALF else 4)


def test_hf_module_fused_residual(device):
    ours = baracuda_ops.nn.Qwen3RMSNorm(32).to(device)
    x, r = random((2, 4, 32), torch.float32, device), random((2, 4, 32), torch.float32, device)
    y, h = ours(x, r)
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, ours(x + r), rtol=0, atol=0)


# ---------------------------------------------------------------------------- schemas and errors


class TestRmsNormFusedMessages(TestCase):
    def test_schemas(self):
        self.assertExpectedInline(
            "\n".join(str(op._schema) for op in (
                torch.ops.baracuda.rms_norm_fused.default, torch.ops.baracuda.rms_norm_fused.out,
                torch.ops.baracuda.rms_norm_fused_backward.default, torch.ops.baracuda.rms_norm_fused_backward.out)),
            """\
baracuda::rms_norm_fused(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, float weight_offset=0., str casting="torch") -> (Tensor output, Tensor residual_out, Tensor rstd)
baracuda::rms_norm_fused.out(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, float weight_offset=0., str casting="torch", *, Tensor(a!) output, Tensor(b!) residual_out, Tensor(c!) rstd) -> ()
baracuda::rms_norm_fused_backward(Tensor grad_out, Tensor? grad_residual_out, Tensor h, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, float weight_offset, str casting, ScalarType input_dtype, bool[3] output_mask) -> (Tensor grad_input, Tensor grad_residual, Tensor grad_weight)
baracuda::rms_norm_fused_backward.out(Tensor grad_out, Tensor? grad_residual_out, Tensor h, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, float weight_offset, str casting, ScalarType input_dtype, bool[3] output_mask, *, Tensor(a!) grad_input, Tensor(b!) grad_residual, Tensor(c!) grad_weight, Tensor(d!) workspace) -> ()""",
        )

    def test_residual_shape(self):
        x, r = torch.randn(3, 8), torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused(x, r, [8], None), """baracuda::rms_norm_fused: residual shape [3, 4] != input shape [3, 8]""")

    def test_residual_dtype(self):
        x, r = torch.randn(3, 8), torch.randn(3, 8, dtype=torch.float64)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm_fused(x, r, [8], None), """baracuda::rms_norm_fused: residual dtype Double is not supported with input dtype Float; expected Float""")

    def test_per_head_weight_shape(self):
        x, w = torch.randn(2, 4, 8), torch.randn(3, 8)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused(x, None, [8], w), """baracuda::rms_norm_fused: weight shape [3, 8] must be normalized_shape [8] or, per head, the input's trailing dims (input shape [2, 4, 8])""")

    def test_unknown_casting(self):
        x = torch.randn(2, 8)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused(x, None, [8], None, None, 0.0, "bf16"), """baracuda::rms_norm_fused: casting must be "torch", "llama" or "gemma", got "bf16\"""")

    def test_weight_offset_without_weight(self):
        x = torch.randn(2, 8)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused(x, None, [8], None, None, 1.0), """baracuda::rms_norm_fused: weight_offset=1 needs a weight (y = x_hat * (weight + weight_offset)); got weight=None""")

    def test_residual_dtype_without_residual(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.rms_norm_fused(torch.randn(2, 8), 8, residual_dtype=torch.float32),
            """baracuda::rms_norm_fused: residual_dtype is given but residual is None""")

    def test_backward_grad_out_dtype(self):
        h, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8)
        rstd = torch.ones(2, 1)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm_fused_backward(
                h, None, h, [8], rstd, w, 0.0, "llama", torch.bfloat16, [True, False, True]), """baracuda::rms_norm_fused_backward: grad_out dtype BFloat16 != output dtype Float""")

    def test_backward_grad_residual_out_shape(self):
        h, rstd = torch.randn(2, 8), torch.ones(2, 1)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused_backward(
                h, torch.randn(2, 4), h, [8], rstd, None, 0.0, "torch", torch.float32, [True, False, False]), """baracuda::rms_norm_fused_backward: grad_residual_out shape [2, 4] != h shape [2, 8]""")

    def test_nothing_written_on_error(self):
        x, r = torch.randn(3, 8), torch.randn(3, 8)
        y, h, rstd = torch.full((3, 8), 7.0), torch.full((3, 8), 7.0), torch.full((3, 2), 7.0)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_fused.out(x, r, [8], None, output=y, residual_out=h,
                                                                      rstd=rstd), """baracuda::rms_norm_fused: rstd shape [3, 2] != expected [3, 1]""")
        assert (y == 7).all() and (h == 7).all() and (rstd == 7).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_residual_and_weight_device_mismatch_cuda():
    x = torch.randn(3, 8, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_fused: residual is on cpu but input is on cuda:0"):
        torch.ops.baracuda.rms_norm_fused(x, torch.randn(3, 8), [8], None)
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_fused: weight is on cpu but input is on cuda:0"):
        torch.ops.baracuda.rms_norm_fused(x, None, [8], torch.randn(8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_out_variant_outputs_aligned_on_cuda():
    # the CUDA kernels store 16-byte vectors: an output starting off a 16-byte boundary is refused, as rms_norm's
    x = torch.randn(3, 8, device="cuda")
    ok, rstd = torch.empty(3, 8, device="cuda"), torch.empty(3, 1, device="cuda")
    shifted = torch.empty(25, device="cuda")[1:].view(3, 8)
    with pytest.raises(ValueError, match="baracuda::rms_norm_fused: output must be contiguous and 16-byte aligned"):
        torch.ops.baracuda.rms_norm_fused.out(x, x, [8], None, output=shifted, residual_out=ok, rstd=rstd)
    with pytest.raises(ValueError, match="baracuda::rms_norm_fused: residual_out must be contiguous and 16-byte"):
        torch.ops.baracuda.rms_norm_fused.out(x, x, [8], None, output=ok, residual_out=shifted, rstd=rstd)


# ---------------------------------------------------------------------------- FP8 output


def _quant_reference(y, scale):
    return (y / scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def _same_bits(a, b):
    torch.testing.assert_close(a.view(torch.uint8), b.view(torch.uint8), rtol=0, atol=0)


# Past the short CASES, on CUDA: rows of one 512- or 1024-thread CTA (8 vectors a thread), and in float32
# at 40000 and 65536 cluster rows (the row's max over 3 or 4 CTAs), several rows a cluster.
QUANT_LONG_CASES = [((300, 32768), (32768,), (32768,)), ((3, 65536), (65536,), (65536,)),
                    ((200, 40000), (40000,), (40000,))]


def _check_quant(cases, dtype, casting, device):
    for (shape, ns, wshape), wdt in itertools.product(cases, _weight_dtypes(dtype)):
        x = random(shape, dtype, device) * 3
        r = random(shape, dtype, device)
        w = None if wshape is None else random(wshape, wdt, device) * 4  # some |y| / scale beyond 448
        offset = 0.0 if w is None else 0.5
        y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, list(ns), w, None, offset, casting)
        static = torch.tensor([0.01], device=device)
        q, h_q, none = torch.ops.baracuda.rms_norm_quant(x, r, list(ns), w, None, offset, casting, static)
        assert q.dtype == torch.float8_e4m3fn and none.shape == (0,)
        torch.testing.assert_close(h_q, h, rtol=0, atol=0)
        _same_bits(q, _quant_reference(y, static))
        q, _, row_scale = torch.ops.baracuda.rms_norm_quant(x, r, list(ns), w, None, offset, casting, None)
        dims = tuple(range(x.dim() - len(ns), x.dim()))
        amax = y.to(_acc(dtype)).abs().amax(dims, keepdim=True) if y.numel() else y.new_zeros(row_scale.shape)
        amax = amax.cpu()  # PyTorch's CUDA division by a scalar multiplies by its reciprocal: 1 ulp off
        want_scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax)).float()
        torch.testing.assert_close(row_scale.cpu(), want_scale, rtol=0, atol=0)
        _same_bits(q, _quant_reference(y, row_scale))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_quant_matches_pytorch_reference(device, dtype, casting):
    _check_quant(CASES, dtype, casting, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_quant_long_rows_match_pytorch_reference(device, dtype, casting):
    _check_quant(QUANT_LONG_CASES, dtype, casting, device)


def test_quant_public_function(device):
    x, r = random((4, 2, 16), torch.bfloat16, device), random((4, 2, 16), torch.bfloat16, device)
    w = random((2, 16), torch.bfloat16, device)
    q, scale = baracuda_ops.rms_norm_quant(x, 16, w, weight_offset=1.0, casting="gemma")
    y = baracuda_ops.rms_norm_fused(x, 16, w, weight_offset=1.0, casting="gemma")
    assert scale.shape == (4, 2, 1)
    _same_bits(q, _quant_reference(y, scale))
    static = torch.tensor([0.02], device=device)
    q, scale, h = baracuda_ops.rms_norm_quant(x, 16, w, scale=static, residual=r, residual_dtype=torch.float32)
    y, h_want = baracuda_ops.rms_norm_fused(x, 16, w, residual=r, residual_dtype=torch.float32)
    assert scale is static and h.dtype == torch.float32
    torch.testing.assert_close(h, h_want, rtol=0, atol=0)
    _same_bits(q, _quant_reference(y, static))


class TestRmsNormQuantMessages(TestCase):
    def test_scale_values(self):
        x = torch.randn(2, 8)
        for value in (0.0, -1.0, float("inf"), float("nan")):
            with self.assertRaisesRegex(ValueError, r"^baracuda::rms_norm_quant: scale must be finite and > 0, got "):
                torch.ops.baracuda.rms_norm_quant(x, None, [8], None, None, 0.0, "torch", torch.tensor([value]))
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_quant(x, None, [8], None, None, 0.0, "torch",
                                                                  torch.tensor([-2.0])),
            """baracuda::rms_norm_quant: scale must be finite and > 0, got -2""")

    def test_scale_shape_and_dtype(self):
        x = torch.randn(2, 8)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_quant(x, None, [8], None, None, 0.0, "torch",
                                                                  torch.ones(2)), """baracuda::rms_norm_quant: scale must have 1 element (a per-tensor scale), got shape [2]""")
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm_quant(x, None, [8], None, None, 0.0, "torch",
                                                                 torch.ones(1, dtype=torch.float64)), """baracuda::rms_norm_quant: scale dtype Double != expected Float""")

    def test_out_dtype(self):
        self.assertExpectedRaisesInline(
            TypeError, lambda: baracuda_ops.rms_norm_quant(torch.randn(2, 8), 8, out_dtype=torch.float8_e5m2), """baracuda::rms_norm_quant: out_dtype must be torch.float8_e4m3fn, got torch.float8_e5m2""")

    def test_nothing_written_on_error(self):
        x = torch.randn(3, 8)
        q = torch.full((3, 8), 1.0).to(torch.float8_e4m3fn)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm_quant.out(
                x, None, [8], None, None, 0.0, "torch", torch.tensor([float("nan")]), output=q,
                residual_out=torch.empty(0), scale_out=torch.empty(0)), """baracuda::rms_norm_quant: scale must be finite and > 0, got nan""")
        assert (q.float() == 1).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quant_scale_value_checked_on_cuda():
    x = torch.randn(3, 8, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_quant: scale must be finite and > 0, got nan"):
        baracuda_ops.rms_norm_quant(x, 8, scale=torch.tensor([float("nan")], device="cuda"))


@pytest.mark.parametrize("casting, weight_offset", [("torch", 0.0), ("gemma", 1.0), ("llama", 0.0)])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("weight_shape", [None, (8,), (3, 8)])
def test_jvp_matches_the_float64_formula(device, casting, weight_offset, residual, weight_shape):
    # forward mode: torch.func.jvp of the op equals jvp of h = x + r, y = h * rsqrt(mean(h^2) + eps)
    # * (w + offset) written in plain float64 ops, for every tangent input
    if weight_shape is None and weight_offset:
        pytest.skip("a weight offset needs a weight")
    x = torch.randn(2, 3, 8, dtype=torch.float64, device=device)
    primals = [x] + ([torch.randn_like(x)] if residual else []) + (
        [torch.randn(weight_shape, dtype=torch.float64, device=device)] if weight_shape else [])
    tangents = [torch.randn_like(p) for p in primals]

    def split(args):
        args = list(args)
        x = args.pop(0)
        r = args.pop(0) if residual else None
        return x, r, (args[0] if weight_shape else None)

    def ours(*args):
        x, r, w = split(args)
        return baracuda_ops.rms_norm_fused(x, [8], w, 1e-6, residual=r, weight_offset=weight_offset, casting=casting)

    def formula(*args):
        x, r, w = split(args)
        h = x if r is None else x + r
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = y if w is None else y * (w + weight_offset)
        return y if r is None else (y, h)

    _, got = torch.func.jvp(ours, tuple(primals), tuple(tangents))
    _, want = torch.func.jvp(formula, tuple(primals), tuple(tangents))
    torch.testing.assert_close(got, want)
