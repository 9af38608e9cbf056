import functools
import math

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

import baracuda_ops
from helpers import (FLOAT_DTYPES, TOLERANCES, assert_close, check_compile_matches_eager, poison, random,
                     require_free_gpu_memory)
from launch_configs import device_has_recorded_facts, launch_config, recorded_facts_name

HALF = (torch.float16, torch.bfloat16)

# (input shape, normalized_shape): tiny and odd rows, multi-dim normalized_shape,
# rows for each CUDA kernel (sub-warp rows, a row per CTA, decode rows of one or two
# vectors per thread, a row per cluster, two passes), rows that are not a multiple of
# the 16-byte vector, zero-size batch and zero-size rows.
CASES = [
    ((4, 16), (16,)),
    ((3, 5, 7), (5, 7)),
    ((7,), (7,)),
    ((2, 3, 4, 6), (3, 4, 6)),
    ((33, 40), (40,)),
    ((5, 1024), (1024,)),
    ((3, 4097), (4097,)),
    ((6, 3000), (3000,)),
    ((2, 4096), (4096,)),
    ((2, 6000), (6000,)),
    ((3, 2000), (2000,)),
    ((2, 70000), (70000,)),
    ((1, 300000), (300000,)),
    ((0, 8), (8,)),
    ((2, 0, 16), (16,)),
    ((3, 0), (0,)),
]


def weight_kinds(dtype):
    kinds = [None, dtype]
    return kinds + [torch.float32] if dtype in HALF else kinds


def acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_config(m, n, dtype, backward=False, dw_dtype=None, facts="h200"):
    """The CUDA launch config that the policy picks with recorded facts, an H200's unless
    named (test_launch_policy.py covers the policy itself)."""
    if backward:
        return launch_config("rms_norm_backward", [m, n, (dw_dtype or dtype).itemsize], dtype, facts)
    return launch_config("rms_norm", [m, n], dtype, facts)


def reference(x, normalized_shape, weight, eps=None):
    """float64 rms_norm and rstd from plain ops; eps default = finfo(computation type).eps."""
    if eps is None:
        eps = torch.finfo(acc_dtype(x.dtype)).eps
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + eps)
    y = x64 * rstd
    return (y * weight.double() if weight is not None else y), rstd


@pytest.mark.parametrize("shape,ns", CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_matches_torch_and_float64(device, shape, ns, dtype):
    x = random(shape, dtype, device)
    for wdt in weight_kinds(dtype):
        w = random(ns, wdt, device) if wdt is not None else None
        y, rstd = torch.ops.baracuda.rms_norm(x, list(ns), w, None)
        expected = F.rms_norm(x, ns, w)
        assert y.dtype == expected.dtype == dtype and y.shape == x.shape
        ref_y, ref_rstd = reference(x, ns, w)
        assert rstd.dtype == acc_dtype(dtype) and rstd.shape == ref_rstd.shape
        assert_close(y, ref_y)
        assert_close(y, expected)
        # A float32 sum of N squares drifts up to ~sqrt(N) ulps (the order differs by CPU/vector width).
        n = math.prod(ns)
        rtol = 1e-12 if dtype == torch.float64 else max(1e-5, 2 * math.sqrt(n) * 2.0**-24)
        torch.testing.assert_close(rstd.double(), ref_rstd, rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", HALF)
def test_default_eps_is_the_computation_types(device, dtype):
    # Small inputs, where eps matters: PyTorch uses finfo(float32).eps for half types.
    x = random((4, 256), dtype, device) * 1e-3
    torch.testing.assert_close(baracuda_ops.rms_norm(x, 256), F.rms_norm(x, (256,)), rtol=1e-2, atol=1e-2)
    y = baracuda_ops.rms_norm(x, 256, eps=1e-2)
    torch.testing.assert_close(y, F.rms_norm(x, (256,), eps=1e-2), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_forward_non_contiguous_and_offset(device, dtype):
    base = random((24, 40), dtype, device)
    w = random((24,), dtype, device)
    for x in (base.t(), base.t()[1:], base.view(-1)[3:3 + 37 * 25].view(37, 25)[:, :24]):
        assert not x.is_contiguous()
        assert_close(baracuda_ops.rms_norm(x, 24, w), reference(x, (24,), w)[0])
    offset = base.view(-1)[3:3 + 10 * 24].view(10, 24)  # contiguous, not 16-byte aligned
    assert_close(baracuda_ops.rms_norm(offset, 24, w), reference(offset, (24,), w)[0])
    assert_close(baracuda_ops.rms_norm(offset, 24), reference(offset, (24,), None)[0])


def backward_reference(x, ns, w, g):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if w is not None else None
    y, _ = reference(x64, ns, w64, torch.finfo(acc_dtype(x.dtype)).eps)
    inputs = (x64, w64) if w is not None else (x64,)
    return torch.autograd.grad(y, inputs, g.double())


# Backward: the cases above, plus decode-like rows (on CUDA: a CTA each; a single
# long row spread over a cluster of 8; a few in clusters of 2) and more rows than SMs
# of a CTA each (on CUDA the weight staged in shared memory where its vectors are 16
# bytes; with more than 256 threads a row, float32 at 5120 and 16-bit elements at
# 16384, the dW slots grouped).
BACKWARD_CASES = [c for c in CASES if c[0] != (1, 300000)] + [
    ((1, 40000), (40000,)),
    ((1, 32768), (32768,)),
    ((1, 8192), (8192,)),
    ((8, 8192), (8192,)),
    ((8, 32768), (32768,)),
    ((32, 4096), (4096,)),
    ((200, 4096), (4096,)),
    ((100, 5120), (5120,)),
    ((48, 16384), (16384,)),
]


@pytest.mark.parametrize("shape,ns", BACKWARD_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_float64_autograd(device, shape, ns, dtype):
    for wdt in weight_kinds(dtype):
        x = random(shape, dtype, device, requires_grad=True)
        w = random(ns, wdt, device, requires_grad=True) if wdt is not None else None
        y = baracuda_ops.rms_norm(x, ns, w)
        g = random(y.shape, dtype, device)
        inputs = (x, w) if w is not None else (x,)
        grads = torch.autograd.grad(y, inputs, g)
        refs = backward_reference(x, ns, w, g)
        assert grads[0].dtype == dtype and grads[0].shape == x.shape
        # dx: a few float32 operations per element, rounded once to dtype.
        assert_close(grads[0], refs[0], scale=4 if dtype != torch.float64 else 100)
        if w is not None:
            assert grads[1].dtype == wdt and grads[1].shape == w.shape
            rows = max(1, x.numel() // max(1, w.numel()))
            # dw: a sum over the rows in the accumulation type, rounded once.
            assert_close(grads[1], refs[1], dtype=wdt, scale=4 * max(1.0, rows**0.5))


@pytest.mark.parametrize("n", [1032, 3000, 4096, 8192, 16384])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_single_row(device, n, dtype):
    """One row (a decode step; on CUDA one CTA holds it with 1 or 2 vectors a thread
    and writes dW directly): every weight kind and output mask."""
    for wdt in weight_kinds(dtype):
        x, g = random((1, n), dtype, device), random((1, n), dtype, device)
        w = random((n,), wdt, device) if wdt is not None else None
        _, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
        dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, True])
        refs = backward_reference(x, (n,), w, g)
        assert_close(dx, refs[0], scale=4 if dtype != torch.float64 else 100)
        only_dx, none = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, False])
        assert none is None and torch.equal(only_dx, dx)
        if w is None:
            assert dw is None
            continue
        assert_close(dw, refs[1], dtype=wdt, scale=4)
        none, only_dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [False, True])
        assert none is None and torch.equal(only_dw, dw)


@pytest.mark.parametrize("dtype,wdt,n", [(torch.bfloat16, torch.bfloat16, 65536), (torch.bfloat16, torch.float32, 65536),
                                         (torch.bfloat16, torch.float32, 32768), (torch.float32, torch.float32, 32768),
                                         (torch.float16, torch.float32, 40000), (torch.float16, torch.float16, 40000)])
def test_long_rows_many_per_cluster(device, dtype, wdt, n):
    # Rows that need a thread-block cluster, several per cluster (the slot parity
    # across cluster barriers, dW accumulated over a cluster's rows, added while
    # waiting at the barrier). The backward of a half input on an H200: the streamed
    # kernel (x and dy staged by bulk copies, three rows in turn through its stages;
    # at N = 40000 its CTAs' last chunks are partly past the row).
    if device.type != "cuda":
        pytest.skip("cluster kernels: CUDA only (the CPU path is covered by the row sweep)")
    x = random((300, n), dtype, device)
    w = random((n,), wdt, device)
    g = random((300, n), dtype, device)
    y, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
    y_ref, rstd_ref = reference(x, (n,), w)
    assert_close(y, y_ref)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=2 * math.sqrt(n) * 2.0**-24, atol=0)
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, True])
    refs = backward_reference(x, (n,), w, g)
    assert_close(dx, refs[0], scale=4)
    assert_close(dw, refs[1], dtype=wdt, scale=4 * 300**0.5)
    again = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, True])
    assert torch.equal(dx, again[0]) and torch.equal(dw, again[1])
    kind = rms_config(300, n, dtype, backward=True, dw_dtype=wdt).kind
    assert kind == ("cluster_row" if dtype == torch.float32 else "streamed_cluster_row")


@pytest.mark.parametrize("dtype,wdt,n", [(torch.bfloat16, torch.bfloat16, 16384), (torch.bfloat16, torch.float32, 16384),
                                         (torch.float16, None, 16384), (torch.float32, torch.float32, 8192)])
def test_backward_rows_with_next_row_prefetched(device, dtype, wdt, n):
    # Rows of one 512-thread CTA, more rows than SMs: on an H200 each CTA fetches its next
    # row into L2 (prefetch_next) while it works on this one; dx and dW as without it.
    if device.type != "cuda":
        pytest.skip("the L2 prefetch is a CUDA launch choice (the CPU path is covered by the row sweep)")
    m = 2 * torch.cuda.get_device_properties(device).multi_processor_count + 37
    x, g = random((m, n), dtype, device), random((m, n), dtype, device)
    w = random((n,), wdt, device) if wdt is not None else None
    _, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, w is not None])
    refs = backward_reference(x, (n,), w, g)
    assert_close(dx, refs[0], scale=4)
    if w is not None:
        assert_close(dw, refs[1], dtype=wdt, scale=4 * m**0.5)
    again = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, w is not None])
    assert torch.equal(dx, again[0]) and (w is None or torch.equal(dw, again[1]))


@pytest.mark.parametrize("dtype,wdt,n,cluster", [(torch.bfloat16, torch.bfloat16, 65536, 4),
                                                 (torch.bfloat16, torch.float32, 65536, 4),
                                                 (torch.float16, None, 65536, 4),
                                                 (torch.float32, torch.float32, 65536, 8),
                                                 (torch.float32, None, 32768, 4),
                                                 (torch.float16, torch.float32, 130000, 8)])
@pytest.mark.parametrize("m", [133, 1000])
def test_forward_row_clusters(device, dtype, wdt, n, cluster, m):
    # Forward rows past 512 x 8 vectors take row clusters on an H200: a row a cluster of CTAs of
    # up to 256 threads x 8 vectors, a cluster a row, few rows (m = 133) or many (m = 1000), the
    # last CTA's part of the row short (n = 130000: 16250 vectors over eight CTAs of 256 x 8).
    if device.type != "cuda":
        pytest.skip("row clusters: CUDA only (the CPU path is covered by the row sweep)")
    config = rms_config(m, n, dtype)
    assert (config.kind, config["cluster"], config["block"]) == ("row_clusters", cluster, 256)
    x = random((m, n), dtype, device)
    w = random((n,), wdt, device) if wdt is not None else None
    y, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
    y_ref, rstd_ref = reference(x, (n,), w)
    assert_close(y, y_ref)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=2 * math.sqrt(n) * 2.0**-24, atol=0)
    again = torch.ops.baracuda.rms_norm(x, [n], w, None)
    assert torch.equal(y, again[0]) and torch.equal(rstd, again[1])


@pytest.mark.parametrize("dtype,wdt,n", [(torch.bfloat16, torch.bfloat16, 2048), (torch.bfloat16, torch.float32, 5120),
                                         (torch.float16, None, 8192), (torch.float16, torch.float16, 1032),
                                         (torch.bfloat16, torch.bfloat16, 1024), (torch.float16, torch.float32, 776)])
@pytest.mark.parametrize("m", [133, 1000, 5000])
def test_backward_rows_of_one_cta_streamed(device, dtype, wdt, n, m):
    # Half-input rows of one CTA take the streamed kernel: rows staged three ahead, CTAs of
    # fewer rows than stages (m = 133: one or two rows a CTA), a last chunk partly past the
    # row (n = 1032: 129 vectors over 64 threads; n = 776: 97 vectors over a warp's 4 x 32),
    # rows of one warp (n = 1024, 776), no weight, and each output alone; at m = 5000 rows of
    # 2048 and 1032 (8 CTAs an SM) the CTAs fold their dW sums in launch clusters (dw_fold),
    # and rows of one warp (16 CTAs an SM, 2112 partial rows) take the dW sum over every SM.
    if device.type != "cuda":
        pytest.skip("the streamed kernel: CUDA only (the CPU path is covered by the row sweep)")
    config = rms_config(m, n, dtype, backward=True, dw_dtype=wdt)
    assert config.kind == "streamed_row"
    per_sm, rest = divmod(config["row_groups"], 132)  # the recorded H200's SMs
    assert config["dw_fold"] == (per_sm if rest == 0 and 4 <= per_sm <= 8 else 1)
    assert config["dw_sum_slices"] == (64 if config["row_groups"] // config["dw_fold"] >= 512 else 8)
    x, g = random((m, n), dtype, device), random((m, n), dtype, device)
    w = random((n,), wdt, device) if wdt is not None else None
    _, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, True])
    refs = backward_reference(x, (n,), w, g)
    assert_close(dx, refs[0], scale=4)
    if w is None:
        assert dw is None
        return
    assert_close(dw, refs[1], dtype=wdt, scale=4 * m**0.5)
    only_dx, none = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, False])
    assert none is None and torch.equal(only_dx, dx)
    none, only_dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [False, True])
    assert none is None and torch.equal(only_dw, dw)


# Past 2^31 elements: (n, weight dtype, (the forward's kernel kind, the backward's)) on an H200,
# a case for each kind of row kernel.
_PAST_2_31_CASES = [(1024, torch.bfloat16, ("warp_rows", "streamed_row")),
                    (1024, torch.float32, ("warp_rows", "streamed_row")),
                    (8192, torch.bfloat16, ("cta_row", "streamed_row")),
                    (16384, torch.bfloat16, ("cta_row", "cta_row")),
                    (65536, torch.bfloat16, ("row_clusters", "streamed_cluster_row")),
                    (262144, torch.bfloat16, ("row_clusters", "two_pass_row")),
                    (4096, torch.float32, ("cta_row", "streamed_row")),
                    (65536, torch.float32, ("row_clusters", "streamed_cluster_row")),
                    (2**20, torch.bfloat16, ("two_pass_row", "two_pass_row"))]


@pytest.mark.parametrize("n,wdt,kinds", _PAST_2_31_CASES)
def test_past_2_31_cases_take_their_kinds(n, wdt, kinds):
    # The big-memory test below runs on a GPU alone; the kinds its cases are meant to cover are
    # checked here on every machine, so that a policy change which moves one shows in CI.
    m = (1 << 31) // n + 3
    assert kinds == (rms_config(m, n, torch.bfloat16).kind,
                     rms_config(m, n, torch.bfloat16, backward=True, dw_dtype=wdt).kind)


@pytest.mark.big_memory
@pytest.mark.parametrize("n,wdt", [(n, wdt) for n, wdt, _ in _PAST_2_31_CASES])
def test_cuda_past_2_31_elements(n, wdt):
    # bfloat16 inputs of 2^31 + 3n elements, the last three rows wholly past element 2^31,
    # through each kind of row kernel (test_past_2_31_cases_take_their_kinds). Rows from the
    # start, middle and end against float64; dW (a sum over every row) against a float64 sum,
    # with the last rows' grad scaled up so that a row lost or read from the wrong place shows
    # in it.
    require_free_gpu_memory(20)
    m, dtype = (1 << 31) // n + 3, torch.bfloat16
    x = torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=wdt, device="cuda")
    rows = torch.tensor([0, 1, m // 2, m - 4, m - 3, m - 2, m - 1], device="cuda")
    y, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
    ref_y, ref_rstd = reference(x[rows], (n,), w)
    assert_close(y[rows], ref_y)
    torch.testing.assert_close(rstd[rows].double(), ref_rstd, rtol=2 * math.sqrt(n) * 2.0**-24, atol=0)
    del y

    g = torch.randn(m, n, dtype=dtype, device="cuda")
    g[-3:] *= 1000
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], rstd, w, [True, True])
    assert_close(dx[rows], backward_reference(x[rows], (n,), w, g[rows])[0], scale=4)
    ref_dw = torch.zeros(n, dtype=torch.float64, device="cuda")
    magnitude = torch.zeros_like(ref_dw)
    step = max(1, (1 << 25) // n)
    for r in range(0, m, step):
        terms = g[r:r + step].double() * reference(x[r:r + step], (n,), None)[0]  # dy * x * rstd
        ref_dw += terms.sum(0)
        magnitude += terms.abs().sum(0)
    # dW: a float32 sum over the rows, rounded once to the weight's dtype.
    bound = TOLERANCES[wdt][0] * ref_dw.abs() + 4 * 2.0**-23 * magnitude
    assert bool(((dw.double() - ref_dw).abs() <= bound).all()), ((dw.double() - ref_dw).abs().max(), bound.min())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_matches_torch_autograd(device, dtype):
    for wdt in weight_kinds(dtype)[1:]:
        x = random((9, 300), dtype, device, requires_grad=True)
        w = random((300,), wdt, device, requires_grad=True)
        g = random((9, 300), dtype, device)
        ours = torch.autograd.grad(baracuda_ops.rms_norm(x, 300, w), (x, w), g)
        theirs = torch.autograd.grad(F.rms_norm(x, (300,), w), (x, w), g)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype
            assert_close(a, b, scale=4)


def test_backward_non_contiguous_grad(device):
    x = random((6, 10), torch.float64, device, requires_grad=True)
    w = random((10,), torch.float64, device, requires_grad=True)
    g = random((10, 6), torch.float64, device).t()
    ours = torch.autograd.grad(baracuda_ops.rms_norm(x, 10, w), (x, w), g)
    for a, b in zip(ours, backward_reference(x, (10,), w, g)):
        assert_close(a, b)


def test_backward_output_mask_follows_aten(device):
    x = random((5, 12), torch.float32, device)
    w = random((12,), torch.float32, device)
    g = random((5, 12), torch.float32, device)
    _, rstd = torch.ops.baracuda.rms_norm(x, [12], w, None)
    full = torch.ops.baracuda.rms_norm_backward(g, x, [12], rstd, w, [True, True])
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [12], rstd, w, [True, False])
    assert dw is None and torch.equal(dx, full[0])
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [12], rstd, w, [False, True])
    assert dx is None and torch.equal(dw, full[1])
    dx, dw = torch.ops.baracuda.rms_norm_backward(g, x, [12], rstd, None, [True, True])
    assert dw is None and dx.shape == x.shape


def test_backward_zero_rows_gives_zero_grad_weight(device):
    x = random((0, 7), torch.float32, device, requires_grad=True)
    w = random((7,), torch.float32, device, requires_grad=True)
    y = baracuda_ops.rms_norm(x, 7, w)
    dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    assert dx.shape == (0, 7) and torch.equal(dw, torch.zeros_like(w))


def test_double_backward_raises(device):
    x = random((3, 8), torch.float64, device, requires_grad=True)
    w = random((8,), torch.float64, device, requires_grad=True)
    (dx,) = torch.autograd.grad(baracuda_ops.rms_norm(x, 8, w).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dx.sum().backward()


@pytest.mark.parametrize("shape,ns,dtype", [((4, 64), (64,), torch.bfloat16), ((8, 4096), (4096,), torch.float32),
                                            ((3, 70000), (70000,), torch.bfloat16), ((2, 300000), (300000,), torch.float32),
                                            ((300, 40), (40,), torch.float16)])
def test_backward_bit_identical_twice(device, shape, ns, dtype):
    x = random(shape, dtype, device)
    w = random(ns, dtype, device)
    g = random(shape, dtype, device)
    _, rstd = torch.ops.baracuda.rms_norm(x, list(ns), w, None)
    a = torch.ops.baracuda.rms_norm_backward(g, x, list(ns), rstd, w, [True, True])
    b = torch.ops.baracuda.rms_norm_backward(g, x, list(ns), rstd, w, [True, True])
    for u, v in zip(a, b):
        assert torch.equal(u.view(torch.int16) if u.element_size() == 2 else u.view(torch.int32),
                           v.view(torch.int16) if v.element_size() == 2 else v.view(torch.int32))


@pytest.mark.parametrize("shape", [(1, 4096), (1, 8192), (8, 4096)])
@pytest.mark.parametrize("wdt", [torch.bfloat16, torch.float32])
def test_backward_out_grad_weight_at_any_offset(device, shape, wdt):
    """grad_weight of the out-variant may start anywhere in its buffer (on CUDA a
    single row writes dW directly, in 16-byte stores only where it is aligned)."""
    n = shape[1]
    x, g = random(shape, torch.bfloat16, device), random(shape, torch.bfloat16, device)
    w = random((n,), wdt, device)
    _, r = torch.ops.baracuda.rms_norm(x, [n], w, None)
    expected_dx, expected_dw = torch.ops.baracuda.rms_norm_backward(g, x, [n], r, w, [True, True])
    plan = baracuda_ops.RMSNormBackwardPlan.select(baracuda_ops.RMSNormBackwardDescriptor(shape, (n,), torch.bfloat16,
                                                                                          weight_dtype=wdt,
                                                                                          device=device))
    ws = torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)
    for offset in (0, 1, 3):
        gw = poison(torch.empty(n + offset, dtype=wdt, device=device))[offset:]
        gi = torch.empty(shape, dtype=torch.bfloat16, device=device)
        torch.ops.baracuda.rms_norm_backward.out(g, x, [n], r, w, [True, True], grad_input=gi, grad_weight=gw,
                                                 workspace=ws)
        assert torch.equal(gw, expected_dw) and torch.equal(gi, expected_dx)


def test_compile_module_matches_eager(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), baracuda_ops.nn.RMSNorm(32), torch.nn.Linear(32, 8),
                                baracuda_ops.nn.RMSNorm((8,), eps=1e-4)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))

    def fn(x):
        return model(x)

    x = random((6, 16), torch.float32, device, requires_grad=True)
    check_compile_matches_eager(fn, [x])
    # Parameter gradients as well.
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for f in (fn, compiled):
        model.zero_grad()
        f(x.detach()).square().sum().backward()
        if f is fn:
            eager = [p.grad.clone() for p in model.parameters()]
    for a, p in zip(eager, model.parameters()):
        assert_close(p.grad, a)


def test_vmap_errors(device):
    with pytest.raises(ValueError, match=r"normalized_shape \[4, 8\] does not match the trailing dims of input "
                                         r"shape \[8\]"):
        torch.func.vmap(lambda x: baracuda_ops.rms_norm(x, (4, 8)))(random((4, 8), torch.float32, device))


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                                (torch.float64, torch.float64)])
def test_autocast_casts_as_F_does(device, dtype, weight_dtype):
    # Output and gradients in F.rms_norm's dtypes, eager and compiled: CUDA autocast runs
    # aten::rms_norm in float32 (float64 left alone) after PyTorch 2.11; 2.11 and CPU autocast
    # leave it alone.
    x = random((4, 3, 16), dtype, device, requires_grad=True)
    w = random((16,), weight_dtype, device, requires_grad=True)

    def run(norm, x, w):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return norm(x, (16,), w)

    want = run(F.rms_norm, x, w)
    g = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (x, w), g)
    torch._dynamo.reset()
    compiled = torch.compile(functools.partial(run, baracuda_ops.rms_norm), fullgraph=True, dynamic=True)
    for got in (run(baracuda_ops.rms_norm, x, w), compiled(x, w)):
        assert got.dtype == want.dtype
        assert_close(got, want.double(), dtype=want.dtype, scale=4)
        for a, b in zip(torch.autograd.grad(got, (x, w), g), want_grads, strict=True):
            assert a.dtype == b.dtype
            assert_close(a, b.double(), dtype=b.dtype, scale=8)
    autocasts = torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA")
    assert want.dtype == (torch.float32 if device.type == "cuda" and autocasts and dtype != torch.float64 else dtype)


# ---------------------------------------------------------------------------- nn.RMSNorm


@pytest.mark.parametrize("dtype,wdt", [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16),
                                       (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                       (torch.float64, torch.float32), (torch.float64, torch.bfloat16)])
def test_other_weight_dtypes_follow_torch(device, dtype, wdt):
    # Weights of a dtype the op does not take, which F.rms_norm accepts (a float32 input
    # with bfloat16 parameters, ...): rms_norm and nn.RMSNorm convert them to the
    # computation type first, exactly; output in x's dtype, dW in the weight's.
    x = random((9, 300), dtype, device, requires_grad=True)
    w = random((300,), wdt, device, requires_grad=True)
    g = random((9, 300), dtype, device)
    y = baracuda_ops.rms_norm(x, 300, w)
    expected = F.rms_norm(x, (300,), w)
    assert y.dtype == expected.dtype == dtype
    assert_close(y, expected)
    ours = torch.autograd.grad(y, (x, w), g)
    theirs = torch.autograd.grad(expected, (x, w), g)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype
        assert_close(a, b, scale=4)
    module = baracuda_ops.nn.RMSNorm(300, device=device, dtype=wdt)
    with torch.no_grad():
        module.weight.copy_(w)
    assert torch.equal(module(x), y)
    with pytest.raises(TypeError, match="weight dtype Double is not supported"):  # would need float64 products
        baracuda_ops.rms_norm(x.detach().float(), 300, w.detach().double())


def test_module_is_drop_in_for_torch_rmsnorm(device):
    theirs = torch.nn.RMSNorm([3, 16], eps=1e-6, device=device)
    with torch.no_grad():
        theirs.weight.copy_(random((3, 16), torch.float32, device))
    ours = baracuda_ops.nn.RMSNorm([3, 16], eps=1e-6, device=device)
    assert isinstance(ours, torch.nn.RMSNorm)
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours) == repr(theirs) == "RMSNorm((3, 16), eps=1e-06, elementwise_affine=True)"
    assert list(dict(ours.named_parameters())) == ["weight"]
    x = random((5, 3, 16), torch.float32, device)
    assert_close(ours(x), theirs(x))
    ours.reset_parameters()
    assert torch.equal(ours.weight, torch.ones(3, 16, device=device))

    plain = baracuda_ops.nn.RMSNorm(16, elementwise_affine=False, device=device, dtype=torch.float64)
    assert plain.weight is None and list(plain.state_dict()) == []
    assert repr(plain) == repr(torch.nn.RMSNorm(16, elementwise_affine=False))
    x64 = random((4, 16), torch.float64, device)
    assert_close(plain(x64), F.rms_norm(x64, (16,)))
    half = baracuda_ops.nn.RMSNorm(16, device=device, dtype=torch.bfloat16)
    assert half.weight.dtype == torch.bfloat16


# ---------------------------------------------------------------------------- Plan API


@pytest.mark.parametrize("shape,ns,dtype,wdt", [((6, 40), (40,), torch.float32, None),
                                                ((3, 2, 1024), (2, 1024), torch.bfloat16, torch.float32),
                                                ((2, 70000), (70000,), torch.bfloat16, None)])
def test_plan_run_writes_every_element(device, shape, ns, dtype, wdt):
    desc = baracuda_ops.RMSNormDescriptor(shape, ns, dtype, weight_dtype=wdt, device=device)
    plan = baracuda_ops.RMSNormPlan.select(desc)
    x, w = random(shape, dtype, device), random(ns, wdt or dtype, device)
    out = poison(torch.empty(shape, dtype=dtype, device=device))
    rstd = poison(torch.empty(desc.rstd_shape, dtype=acc_dtype(dtype), device=device))
    plan.run(baracuda_ops.RMSNormArgs(x, w, out, rstd))
    y_ref, r_ref = torch.ops.baracuda.rms_norm(x, list(ns), w, None)
    assert torch.equal(out, y_ref) and torch.equal(rstd, r_ref)
    sku = plan.sku()
    assert sku.op == "rms_norm" and sku.device_type == device.type and sku.variant
    assert plan.workspace_size() == 0 and plan.precision_guarantee().accumulator_dtype == torch.float32

    bdesc = baracuda_ops.RMSNormBackwardDescriptor(shape, ns, dtype, weight_dtype=wdt, device=device)
    bplan = baracuda_ops.RMSNormBackwardPlan.select(bdesc)
    g = random(shape, dtype, device)
    gi = poison(torch.empty(shape, dtype=dtype, device=device))
    gw = poison(torch.empty(ns, dtype=wdt or dtype, device=device))
    ws = baracuda_ops.Workspace.allocate(bplan.workspace_size(), device)
    poison(ws.buffer)
    bplan.run(baracuda_ops.RMSNormBackwardArgs(g, x, rstd, w, gi, gw), ws)
    ref = torch.ops.baracuda.rms_norm_backward(g, x, list(ns), rstd, w, [True, True])
    assert torch.equal(gi, ref[0]) and torch.equal(gw, ref[1])
    # The variant names the launch config: its dW sum (dw_sum=3: partial rows in the
    # workspace; 1 or 2: one row group, or decode rows' column CTAs, write dW itself).
    if device.type == "cuda" and "dw_sum=3" not in bplan.sku().variant:
        assert bplan.workspace_size() == 0
    elif device.type == "cuda":
        assert bplan.workspace_size() > 0
        with pytest.raises(baracuda_ops.WorkspaceTooSmallError):
            bplan.run(baracuda_ops.RMSNormBackwardArgs(g, x, rstd, w, gi, gw), baracuda_ops.Workspace.allocate(8, device))
        with pytest.raises(baracuda_ops.UnsupportedError):
            baracuda_ops.RMSNormBackwardPlan.select(bdesc, baracuda_ops.PlanPreference(max_workspace_bytes=0))
        no_dw = baracuda_ops.RMSNormBackwardDescriptor(shape, ns, dtype, output_mask=(True, False), device=device)
        assert baracuda_ops.RMSNormBackwardPlan.select(no_dw).workspace_size() == 0


def test_backward_plan_without_weight_or_dx(device):
    desc = baracuda_ops.RMSNormBackwardDescriptor((4, 32), (32,), torch.float32, output_mask=(False, True),
                                                  device=device)
    plan = baracuda_ops.RMSNormBackwardPlan.select(desc)
    x, w, g = random((4, 32), torch.float32, device), random((32,), torch.float32, device), random((4, 32), torch.float32, device)
    _, rstd = torch.ops.baracuda.rms_norm(x, [32], w, None)
    gw = poison(torch.empty(32, device=device))
    plan.run(baracuda_ops.RMSNormBackwardArgs(g, x, rstd, w, None, gw))
    assert_close(gw, backward_reference(x, (32,), w, g)[1], scale=4)
    nw = baracuda_ops.RMSNormBackwardDescriptor((4, 32), (32,), torch.float32, has_weight=False, device=device)
    gi = poison(torch.empty(4, 32, device=device))
    baracuda_ops.RMSNormBackwardPlan.select(nw).run(baracuda_ops.RMSNormBackwardArgs(g, x, rstd, None, gi, None))
    assert_close(gi, backward_reference(x, (32,), None, g)[0], scale=4)


def test_plan_errors(device):
    desc = baracuda_ops.RMSNormDescriptor((3, 8), (8,), torch.float32, device=device)
    plan = baracuda_ops.RMSNormPlan.select(desc)
    x, w = random((3, 8), torch.float32, device), random((8,), torch.float32, device)
    rstd = torch.empty(3, 1, device=device)
    with pytest.raises(baracuda_ops.BufferTooSmallError):
        plan.run(baracuda_ops.RMSNormArgs(x, w, torch.empty(2, 8, device=device), rstd))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.RMSNormArgs(x, w, torch.empty(3, 8, device=device, dtype=torch.float64), rstd))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="args.weight is None"):
        plan.run(baracuda_ops.RMSNormArgs(x, None, torch.empty(3, 8, device=device), rstd))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="does not match the trailing dims"):
        baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((3, 8), (4,), torch.float32, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="at least 1 dim"):
        baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((3, 8), (), torch.float32, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="float16, bfloat16"):
        baracuda_ops.RMSNormBackwardPlan.select(baracuda_ops.RMSNormBackwardDescriptor((3, 8), (8,), torch.int32,
                                                                                      device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="weight dtype"):
        baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((3, 8), (8,), torch.float32,
                                                                      weight_dtype=torch.float64, device=device))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_plan_variant_is_the_launch_config():
    # The Plan's variant is the policy's config on this device, kind<name=value,...>;
    # on a device the policies see as the recorded H100/H200 the shape matches the
    # recorded facts' config (the row groups and dW sum of grid-stride kinds follow the
    # runtime's occupancy, which the recorded config models).
    same_card = device_has_recorded_facts(torch.device("cuda"))
    for m, n, dtype, backward in [(1024, 1024, torch.bfloat16, False), (1024, 4096, torch.bfloat16, False),
                                  (2048, 65536, torch.bfloat16, False), (8, 8192, torch.float32, False),
                                  (64, 2**20, torch.float32, False), (1024, 4096, torch.bfloat16, True),
                                  (1, 4096, torch.bfloat16, True), (2048, 65536, torch.bfloat16, True)]:
        if backward:
            plan = baracuda_ops.RMSNormBackwardPlan.select(
                baracuda_ops.RMSNormBackwardDescriptor((m, n), (n,), dtype, device="cuda"))
        else:
            plan = baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((m, n), (n,), dtype, device="cuda"))
        variant = plan.sku().variant
        kind, rest = variant.split("<", 1)
        params = dict((k, int(v)) for k, v in (kv.split("=") for kv in rest.rstrip(">").split(",")))
        if params["dw_sum"] == 3:
            assert plan.workspace_size() == params["row_groups"] // params["dw_fold"] * n * 4
        else:
            assert plan.workspace_size() == 0
        if same_card:
            want = rms_config(m, n, dtype, backward, facts=recorded_facts_name(torch.device("cuda")))
            assert kind == want.kind, (variant, want)
            for field in ("vec_bytes", "group", "block", "cluster", "vpt", "ctas_per_sm", "stages", "smem",
                          "dw_columns"):
                assert params[field] == want[field], (field, variant, want)
            if (m, n) == (2048, 65536) and params["cluster"] == 4:
                # Clusters of four 512-thread CTAs, two an SM, fill every SM as the model
                # counts: placed load-balanced (spread placement fits 62 of 66 on an H200).
                assert params["row_groups"] == want["row_groups"], (variant, want)


# ---------------------------------------------------------------------------- schemas and errors


class TestRmsNormMessages(TestCase):
    def test_schemas(self):
        self.assertExpectedInline(
            "\n".join(
                str(op._schema)
                for op in (
                    torch.ops.baracuda.rms_norm.default,
                    torch.ops.baracuda.rms_norm.out,
                    torch.ops.baracuda.rms_norm_backward.default,
                    torch.ops.baracuda.rms_norm_backward.out,
                )
            ),
            """\
baracuda::rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor output, Tensor rstd)
baracuda::rms_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, *, Tensor(a!) output, Tensor(b!) rstd) -> ()
baracuda::rms_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, bool[2] output_mask) -> (Tensor grad_input, Tensor grad_weight)
baracuda::rms_norm_backward.out(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, bool[2] output_mask, *, Tensor(a!) grad_input, Tensor(b!) grad_weight, Tensor(c!) workspace) -> ()""",
        )

    def test_normalized_shape_mismatch(self):
        x = torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm(x, [5], None, None), """baracuda::rms_norm: normalized_shape [5] does not match the trailing dims of input shape [3, 4]"""
        )

    def test_normalized_shape_too_long(self):
        x = torch.randn(4)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm(x, [1, 4], None, None), """baracuda::rms_norm: normalized_shape [1, 4] does not match the trailing dims of input shape [4]"""
        )

    def test_empty_normalized_shape(self):
        x = torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm(x, [], None, None), """baracuda::rms_norm: normalized_shape must have at least 1 dim, got []"""
        )

    def test_weight_shape(self):
        x, w = torch.randn(3, 4), torch.randn(5)
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.rms_norm(x, [4], w, None), """baracuda::rms_norm: weight shape [5] != normalized_shape [4]"""
        )

    def test_weight_dtype(self):
        x, w = torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(4, dtype=torch.float64)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm(x, [4], w, None), """baracuda::rms_norm: weight dtype Double is not supported with input dtype BFloat16; expected BFloat16 or Float"""
        )
        x32, w16 = torch.randn(3, 4), torch.randn(4, dtype=torch.float16)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm(x32, [4], w16, None), """baracuda::rms_norm: weight dtype Half is not supported with input dtype Float; expected Float"""
        )

    def test_integer_input(self):
        x = torch.ones(3, 4, dtype=torch.int32)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm(x, [4], None, None), """baracuda::rms_norm: input must be float16, bfloat16, float32 or float64, got Int"""
        )

    def test_rstd_shape_and_dtype(self):
        x, g = torch.randn(3, 4), torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.rms_norm_backward(g, x, [4], torch.ones(3), None, [True, True]),
            """baracuda::rms_norm_backward: rstd shape [3] != expected [3, 1]""",
        )
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.rms_norm_backward(g, x, [4], torch.ones(3, 1, dtype=torch.float64), None,
                                                         [True, True]),
            """baracuda::rms_norm_backward: rstd dtype Double != expected Float""",
        )

    def test_grad_out_shape(self):
        x, g = torch.randn(3, 4), torch.randn(3, 5)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.rms_norm_backward(g, x, [4], torch.ones(3, 1), None, [True, True]),
            """baracuda::rms_norm_backward: grad_out shape [3, 5] != input shape [3, 4]""",
        )

    def test_backward_weight_shape(self):
        x, g, w = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 1)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.rms_norm_backward(g, x, [4], torch.ones(3, 1), w, [True, True]),
            """baracuda::rms_norm_backward: weight shape [4, 1] != normalized_shape [4]""",
        )

    def test_out_dtype(self):
        x = torch.randn(3, 4)
        out, rstd = torch.empty(3, 4, dtype=torch.float64), torch.empty(3, 1)
        self.assertExpectedRaisesInline(
            TypeError, lambda: torch.ops.baracuda.rms_norm.out(x, [4], None, None, output=out, rstd=rstd), """baracuda::rms_norm: output dtype Double != expected Float"""
        )

    def test_grad_weight_out_shape(self):
        x, g, w = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
        gi, gw, ws = torch.empty(3, 4), torch.empty(5), torch.empty(0, dtype=torch.uint8)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.rms_norm_backward.out(g, x, [4], torch.ones(3, 1), w, [True, True],
                                                             grad_input=gi, grad_weight=gw, workspace=ws),
            """baracuda::rms_norm_backward: grad_weight shape [5] != expected [4]""",
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_and_short_workspace_cuda():
    x = torch.randn(3, 4, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::rms_norm: weight is on cpu but input is on cuda:0"):
        torch.ops.baracuda.rms_norm(x, [4], torch.randn(4), None)
    # Enough rows for several dW partial rows (one row group writes dW directly, no workspace).
    x = torch.randn(4096, 4, device="cuda")
    g, w = torch.randn(4096, 4, device="cuda"), torch.randn(4, device="cuda")
    _, rstd = torch.ops.baracuda.rms_norm(x, [4], w, None)
    gi, gw = torch.empty(4096, 4, device="cuda"), torch.empty(4, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_backward: workspace has 4 bytes, needs \d+"):
        torch.ops.baracuda.rms_norm_backward.out(g, x, [4], rstd, w, [True, True], grad_input=gi, grad_weight=gw,
                                                 workspace=torch.empty(4, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_backward: rstd is on cpu but input is on cuda:0"):
        torch.ops.baracuda.rms_norm_backward(g, x, [4], rstd.cpu(), w, [True, True])
