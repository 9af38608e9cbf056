import math

import pytest
import torch
from expecttest import TestCase

import baracuda_ops
from baracuda_ops.bench.alibi import reference, reference_slope_grad
from helpers import FLOAT_DTYPES, TOLERANCES, assert_close, poison, random, require_free_gpu_memory
from launch_configs import launch_config
from samples.alibi import slopes as _slopes

# [B, H, Q, K]: tiny, K a multiple of every vector width (8, 16, 4096), odd K (scalar
# path), Q > K and Q < K, decode (Q = 1), shapes whose slope gradient spreads each
# head over several chunks on a GPU, and every zero-size dim.
SHAPES = [
    (2, 3, 4, 5),
    (1, 1, 1, 1),
    (2, 4, 3, 8),
    (1, 2, 7, 16),
    (3, 2, 1, 33),
    (2, 2, 9, 3),
    (4, 3, 1, 4096),
    (2, 4, 128, 256),
    (2, 20, 64, 256),
    (0, 2, 3, 4),
    (2, 0, 3, 4),
    (2, 2, 0, 4),
    (2, 2, 3, 0),
]


def _slope_grad_tolerance(grad, dtype):
    """Slope gradients: an acc-type sum of B*Q*K terms rounded once to `dtype`."""
    rel = (torch.arange(grad.shape[3], device=grad.device) - torch.arange(grad.shape[2], device=grad.device)[:, None])
    magnitude = (grad.double().abs() * rel.double().abs()).sum(dim=(0, 2, 3))
    eps = 2.0**-52 if grad.dtype == torch.float64 else 2.0**-23
    rtol = TOLERANCES[dtype][0]
    return rtol, (4 * eps * magnitude + 1e-12)


def _check_slope_grad(actual, grad, dtype):
    rtol, atol = _slope_grad_tolerance(grad, dtype)
    ref = reference_slope_grad(grad)
    assert actual.dtype == dtype
    # A float16 slope gradient can overflow (|sum| > 65504): then it must be the same infinity.
    overflow = ref.to(dtype).isinf().cpu()
    assert torch.equal(actual.cpu()[overflow], ref.to(dtype).cpu()[overflow])
    err = (actual.double().cpu() - ref.cpu()).abs()[~overflow]
    bound = (atol.cpu() + rtol * ref.abs().cpu())[~overflow]
    assert bool((err <= bound).all()), (actual, ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("same_slopes_dtype", [False, True])
def test_forward_matches_float64_reference(device, shape, dtype, same_slopes_dtype):
    slopes_dtype = dtype if same_slopes_dtype else torch.float32
    scores = random(shape, dtype, device)
    slopes = _slopes(shape[1], slopes_dtype, device)
    y = baracuda_ops.alibi(scores, slopes)
    assert y.dtype == dtype and y.shape == scores.shape and y.is_contiguous()
    assert_close(y, reference(scores, slopes).to(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_non_contiguous_and_offset(device, dtype):
    base = random((2, 3, 16, 17), dtype, device)
    slopes = _slopes(3, torch.float32, device)
    for scores in (base.transpose(2, 3), base[..., 1:], base[:, :, ::2, :16], base.permute(1, 0, 2, 3)):
        assert not scores.is_contiguous()
        s = _slopes(scores.shape[1], torch.float32, device)
        assert_close(baracuda_ops.alibi(scores, s), reference(scores, s).to(dtype))
    # A strided slopes view.
    wide = _slopes(6, torch.float32, device)
    assert_close(baracuda_ops.alibi(base, wide[::2]), reference(base, wide[::2]).to(dtype))
    assert_close(baracuda_ops.alibi(base, slopes), reference(base, slopes).to(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_inplace_equals_functional(device, dtype):
    slopes = _slopes(3, torch.float32, device)
    for make in (lambda b: b, lambda b: b.transpose(2, 3), lambda b: b[..., 1:]):
        base = random((2, 3, 16, 16), dtype, device)
        scores = make(base)
        expected = baracuda_ops.alibi(scores, slopes)
        version = scores._version
        result = baracuda_ops.alibi_(scores, slopes)
        assert result is scores and scores._version > version
        torch.testing.assert_close(scores, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_forward_and_inplace_match_reference(device, dtype):
    # 10.5M elements, not a whole number of CTAs: on a GPU the forward takes one
    # vector a thread here (more than half the GPU's threads at 4), 4 at the SHAPES.
    shape = (3, 5, 700, 1000)
    scores = random(shape, dtype, device)
    slopes = _slopes(5, torch.float32, device)
    expected = reference(scores, slopes).to(dtype)
    y = baracuda_ops.alibi(scores, slopes)
    assert_close(y, expected)
    baracuda_ops.alibi_(scores, slopes)
    torch.testing.assert_close(scores, y, rtol=0, atol=0)
    config = launch_config("alibi", shape, dtype)
    assert (config.kind, config["vec_bytes"], config["index32"], config["vectors_per_thread"]) == (
        "bias_stream", 16, 1, 1)


@pytest.mark.big_memory
def test_cuda_past_2_31_elements_takes_64bit_index_kernels():
    # Scores of 2^31 + 2^17 elements take the i64 kernels; each head alone has 2^29 and takes
    # the i32 ones with the same per-element math, so the forward must match them bit for bit.
    # The slope gradient: per head against a float64 sum; large values on the last rows of the
    # last head (which lie past element 2^31) make any lost or misplaced element show.
    require_free_gpu_memory(14)
    shape, dtype = (1, 4, 16385, 32768), torch.bfloat16
    for op in ("alibi", "alibi_backward"):
        assert launch_config(op, shape, dtype)["index32"] == 0, op
    scores = torch.randn(shape, dtype=dtype, device="cuda")
    scores[0, 3, -3:, -4096:] = 64.0
    slopes = _slopes(4, torch.float32, "cuda")
    y = baracuda_ops.alibi(scores, slopes)
    for h in range(4):
        assert torch.equal(y[:, h:h + 1], baracuda_ops.alibi(scores[:, h:h + 1], slopes[h:h + 1])), h
    keys = torch.arange(shape[3], device="cuda", dtype=torch.float64)
    last_rows = torch.arange(shape[2] - 3, shape[2], device="cuda", dtype=torch.float64)
    assert_close(y[0, 3, -3:], (scores[0, 3, -3:].double() + slopes[3].double() * (keys - last_rows[:, None])).to(dtype))

    _, grad_slopes = torch.ops.baracuda.alibi_backward(scores, slopes, [False, True])
    ref = torch.zeros(4, dtype=torch.float64, device="cuda")
    magnitude = torch.zeros_like(ref)
    for q0 in range(0, shape[2], 1024):
        rows = torch.arange(q0, min(q0 + 1024, shape[2]), device="cuda", dtype=torch.float64)
        terms = scores[0, :, q0:q0 + 1024].double() * (keys - rows[:, None])
        ref += terms.sum(dim=(1, 2))
        magnitude += terms.abs().sum(dim=(1, 2))
    bound = 1e-5 * ref.abs() + 4 * 2.0**-23 * magnitude  # as _slope_grad_tolerance
    assert bool(((grad_slopes.double() - ref).abs() <= bound).all()), (grad_slopes, ref, bound)

    baracuda_ops.alibi_(scores, slopes)
    assert torch.equal(scores, y)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("same_slopes_dtype", [False, True])
def test_slope_grad_matches_float64_reference(device, shape, dtype, same_slopes_dtype):
    slopes_dtype = dtype if same_slopes_dtype else torch.float32
    grad = random(shape, dtype, device)
    slopes = _slopes(shape[1], slopes_dtype, device)
    grad_scores, grad_slopes = torch.ops.baracuda.alibi_backward(grad, slopes, [True, True])
    torch.testing.assert_close(grad_scores, grad, rtol=0, atol=0)
    _check_slope_grad(grad_slopes, grad, slopes_dtype)
    none, only_slopes = torch.ops.baracuda.alibi_backward(grad, slopes, [False, True])
    assert none is None
    torch.testing.assert_close(only_slopes, grad_slopes, rtol=0, atol=0)
    only_scores, none = torch.ops.baracuda.alibi_backward(grad, slopes, [True, False])
    assert none is None
    torch.testing.assert_close(only_scores, grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_autograd_matches_reference_autograd(device, dtype):
    scores = random((2, 3, 5, 24), dtype, device, requires_grad=True)
    slopes = _slopes(3, torch.float32, device).requires_grad_()
    grad = random((2, 3, 5, 24), dtype, device)
    d_scores, d_slopes = torch.autograd.grad(baracuda_ops.alibi(scores, slopes), (scores, slopes), grad)
    # grad_scores is grad itself: no copy.
    assert d_scores.data_ptr() == grad.data_ptr()
    s64 = scores.detach().double().requires_grad_()
    w64 = slopes.detach().double().requires_grad_()
    ref_scores, ref_slopes = torch.autograd.grad(reference(s64, w64), (s64, w64), grad.double())
    torch.testing.assert_close(d_scores.double(), ref_scores, rtol=0, atol=0)
    _check_slope_grad(d_slopes, grad, torch.float32)
    assert torch.allclose(d_slopes.double(), ref_slopes, rtol=1e-5, atol=1e-4)


def test_non_contiguous_grad(device):
    scores = random((2, 3, 6, 8), torch.float64, device, requires_grad=True)
    slopes = _slopes(3, torch.float64, device).requires_grad_()
    grad = random((2, 3, 8, 6), torch.float64, device).transpose(2, 3)
    (d_slopes,) = torch.autograd.grad(baracuda_ops.alibi(scores, slopes), slopes, grad)
    assert_close(d_slopes, reference_slope_grad(grad))
    expanded = torch.ones(1, 1, 1, 1, dtype=torch.float64, device=device).expand(2, 3, 6, 8)
    (d_slopes,) = torch.autograd.grad(baracuda_ops.alibi(scores, slopes), slopes, expanded)
    assert_close(d_slopes, reference_slope_grad(expanded))


def test_empty_grad_zero_fills_slope_grad(device):
    for shape in [(0, 3, 4, 5), (2, 3, 0, 5), (2, 3, 4, 0)]:
        grad = random(shape, torch.float32, device)
        slopes = _slopes(3, torch.float32, device)
        out = poison(torch.empty(3, device=device))
        ws = torch.empty(0, dtype=torch.uint8, device=device)
        torch.ops.baracuda.alibi_backward.out(grad, slopes, [False, True], grad_scores=grad.new_empty(0),
                                              grad_slopes=out, workspace=ws)
        assert torch.equal(out, torch.zeros(3, device=device))


@pytest.mark.parametrize("shape,dtype", [((2, 4, 128, 256), torch.float32), ((4, 8, 1, 4096), torch.bfloat16),
                                         ((2, 20, 64, 256), torch.float32), ((3, 2, 33, 65), torch.float16),
                                         ((2, 4, 64, 64), torch.float64)])
def test_backward_bit_identical_twice(device, shape, dtype):
    grad = random(shape, dtype, device)
    slopes = _slopes(shape[1], torch.float32, device)
    _, a = torch.ops.baracuda.alibi_backward(grad, slopes, [False, True])
    _, b = torch.ops.baracuda.alibi_backward(grad, slopes, [False, True])
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    _check_slope_grad(a, grad, torch.float32)


def test_vmap_errors(device):
    scores, slopes = random((3, 2, 4, 5, 6), torch.float32, device), random((4,), torch.float32, device)
    forward = lambda x, s: torch.ops.baracuda.alibi(x, s)  # noqa: E731
    with pytest.raises(ValueError, match=r"scores must be 4-D \[B, H, Q, K\], got shape \[4, 5, 6\]"):
        torch.func.vmap(forward, in_dims=(0, None))(scores[0], slopes)
    with pytest.raises(ValueError, match=r"slopes shape \[5\] != expected \[4\]"):
        torch.func.vmap(forward)(scores, random((3, 5), torch.float32, device))


# ---------------------------------------------------------------------------- slopes helper and module


def _paper_slopes(n):
    """The rule of Press et al.'s reference get_slopes, in float64."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _paper_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_follow_the_paper():
    for n in list(range(1, 70)) + [96, 128, 255]:
        ours = baracuda_ops.alibi_slopes(n, dtype=torch.float64)
        ref = torch.tensor(_paper_slopes(n), dtype=torch.float64)
        assert ours.shape == (n,)
        torch.testing.assert_close(ours, ref, rtol=1e-13, atol=0)
    assert baracuda_ops.alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    assert baracuda_ops.alibi_slopes(12, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
        baracuda_ops.alibi_slopes(0)


@pytest.mark.parametrize("learnable", [False, True])
def test_alibi_module(device, learnable):
    m = baracuda_ops.nn.ALiBi(6, learnable=learnable, device=device)
    assert isinstance(m.slopes, torch.nn.Parameter) == learnable
    assert "slopes" in m.state_dict() and f"num_heads=6, learnable={learnable}" in repr(m)
    torch.testing.assert_close(m.slopes, baracuda_ops.alibi_slopes(6, device=device), rtol=0, atol=0)
    scores = random((2, 6, 5, 9), torch.bfloat16, device, requires_grad=True)
    y = m(scores)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, baracuda_ops.alibi(scores, m.slopes), rtol=0, atol=0)
    grad = random(y.shape, torch.bfloat16, device)
    y.backward(grad)
    assert scores.grad is not None
    if learnable:
        assert m.slopes.grad.dtype == torch.float32
        _check_slope_grad(m.slopes.grad, grad, torch.float32)


# ---------------------------------------------------------------------------- Plan API


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_run_writes_every_element(device, dtype):
    shape = (2, 3, 5, 16)
    desc = baracuda_ops.AlibiDescriptor(shape, dtype, torch.float32, device)
    plan = baracuda_ops.AlibiPlan.select(desc)
    scores = random(shape, dtype, device)
    slopes = _slopes(3, torch.float32, device)
    out = poison(torch.empty(shape, dtype=dtype, device=device))
    plan.run(baracuda_ops.AlibiArgs(scores, slopes, out))
    torch.testing.assert_close(out, baracuda_ops.alibi(scores, slopes), rtol=0, atol=0)
    sku = plan.sku()
    assert sku.op == "alibi" and sku.device_type == device.type
    if device.type == "cpu":
        assert sku.variant == "cpu_row_bias"
    config = launch_config("alibi", shape, dtype)
    assert (config.kind, config["vec_bytes"], config["index32"], config["vectors_per_thread"]) == (
        "bias_stream", 16, 1, 4)
    assert plan.workspace_size() == 0
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("shape", [(2, 3, 5, 16), (4, 8, 256, 256)])
def test_backward_plan_with_caller_workspace(device, shape):
    desc = baracuda_ops.AlibiBackwardDescriptor(shape, torch.float32, torch.float32, device)
    plan = baracuda_ops.AlibiBackwardPlan.select(desc)
    grad = random(shape, torch.float32, device)
    slopes = _slopes(shape[1], torch.float32, device)
    grad_slopes = poison(torch.empty(shape[1], device=device))
    grad_scores = poison(torch.empty(shape, device=device))
    ws = baracuda_ops.Workspace.allocate(plan.workspace_size(), device)
    plan.run(baracuda_ops.AlibiBackwardArgs(grad, slopes, grad_slopes, grad_scores), ws)
    _, expected = torch.ops.baracuda.alibi_backward(grad, slopes, [False, True])
    torch.testing.assert_close(grad_slopes, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad_scores, grad, rtol=0, atol=0)
    assert plan.precision_guarantee().accumulator_dtype == torch.float32
    config = launch_config("alibi_backward", shape, torch.float32)
    assert (config.kind, config["vec_bytes"], config["index32"]) == ("slope_grad_rows", 16, 1)
    if shape == (4, 8, 256, 256):
        # 64K float32 vectors per head: several chunks per head, partials in the workspace.
        assert config["chunks"] > 1 and config.workspace_bytes > 0
        if device.type == "cuda":
            assert plan.workspace_size() > 0
    if plan.workspace_size() > 0:
        assert plan.workspace_size() % 4 == 0
        with pytest.raises(baracuda_ops.WorkspaceTooSmallError):
            plan.run(baracuda_ops.AlibiBackwardArgs(grad, slopes, grad_slopes), baracuda_ops.Workspace.allocate(1, device))
        with pytest.raises(baracuda_ops.UnsupportedError):
            baracuda_ops.AlibiBackwardPlan.select(desc, baracuda_ops.PlanPreference(max_workspace_bytes=0))


def test_plan_errors(device):
    shape = (2, 3, 4, 8)
    plan = baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor(shape, torch.float32, device=device))
    scores = random(shape, torch.float32, device)
    slopes = _slopes(3, torch.float32, device)
    with pytest.raises(baracuda_ops.BufferTooSmallError):
        plan.run(baracuda_ops.AlibiArgs(scores, slopes, torch.empty(2, 3, 4, 7, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.AlibiArgs(scores, slopes, torch.empty(shape, dtype=torch.float64, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.AlibiArgs(scores, slopes.double(), torch.empty(shape, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError, match=r"shape must be \[B, H, Q, K\]"):
        baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor((3, 4, 5), torch.float32, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match=r"^baracuda::alibi: sizes must be in \[0, 2\^63\)"):
        baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor((2, -1, 4, 5), torch.float32, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="float16, bfloat16"):
        baracuda_ops.AlibiBackwardPlan.select(baracuda_ops.AlibiBackwardDescriptor(shape, torch.int32, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="slopes dtype torch.float16 must be float32"):
        baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor(shape, torch.bfloat16, torch.float16, device))


# ---------------------------------------------------------------------------- schemas and errors


class TestAlibiMessages(TestCase):
    def test_schemas(self):
        self.assertExpectedInline(
            "\n".join(
                str(op._schema)
                for op in (
                    torch.ops.baracuda.alibi.default,
                    torch.ops.baracuda.alibi.out,
                    torch.ops.baracuda.alibi_inplace.default,
                    torch.ops.baracuda.alibi_backward.default,
                    torch.ops.baracuda.alibi_backward.out,
                )
            ),
            """\
baracuda::alibi(Tensor scores, Tensor slopes) -> Tensor
baracuda::alibi.out(Tensor scores, Tensor slopes, *, Tensor(a!) out) -> ()
baracuda::alibi_inplace(Tensor(a!) scores, Tensor slopes) -> ()
baracuda::alibi_backward(Tensor grad, Tensor slopes, bool[2] output_mask) -> (Tensor grad_scores, Tensor grad_slopes)
baracuda::alibi_backward.out(Tensor grad, Tensor slopes, bool[2] output_mask, *, Tensor(a!) grad_scores, Tensor(b!) grad_slopes, Tensor(c!) workspace) -> ()""",
        )

    def test_scores_not_4d(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.alibi(torch.randn(3, 4), torch.randn(3)),
            """baracuda::alibi: scores must be 4-D [B, H, Q, K], got shape [3, 4]""",
        )

    def test_slopes_length(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.alibi(torch.randn(2, 4, 3, 3), torch.randn(5)),
            """baracuda::alibi: slopes shape [5] != expected [4] (one slope per head of scores [2, 4, 3, 3])""",
        )

    def test_slopes_2d(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.alibi_inplace(torch.randn(2, 4, 3, 3), torch.randn(4, 1)),
            """baracuda::alibi_inplace: slopes shape [4, 1] != expected [4] (one slope per head of scores [2, 4, 3, 3])""",
        )

    def test_integer_scores(self):
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.alibi(torch.ones(2, 4, 3, 3, dtype=torch.int32), torch.randn(4)),
            """baracuda::alibi: scores must be float16, bfloat16, float32 or float64, got Int""",
        )

    def test_slopes_dtype(self):
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.alibi(torch.randn(2, 4, 3, 3, dtype=torch.bfloat16),
                                             torch.randn(4, dtype=torch.float16)),
            """baracuda::alibi: slopes dtype Half must be Float or the scores dtype BFloat16""",
        )

    def test_backward_grad_not_4d(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.alibi_backward(torch.randn(2, 4, 3), torch.randn(4), [False, True]),
            """baracuda::alibi_backward: grad must be 4-D [B, H, Q, K], got shape [2, 4, 3]""",
        )

    def test_out_dtype_mismatch(self):
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.alibi.out(torch.randn(2, 4, 3, 3), torch.randn(4),
                                                 out=torch.empty(2, 4, 3, 3, dtype=torch.float64)),
            """baracuda::alibi: out dtype Double != expected Float""",
        )

    def test_grad_slopes_shape_mismatch(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.alibi_backward.out(
                torch.randn(2, 4, 3, 3), torch.randn(4), [False, True], grad_scores=torch.empty(0),
                grad_slopes=torch.empty(5), workspace=torch.empty(0, dtype=torch.uint8)),
            """baracuda::alibi_backward: grad_slopes shape [5] != expected [4]""",
        )

    def test_fake_raises_the_same_shape_errors(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            scores, slopes = torch.randn(2, 4, 3, 3), torch.randn(5)
            self.assertExpectedRaisesInline(
                ValueError,
                lambda: torch.ops.baracuda.alibi(scores, slopes),
                """baracuda::alibi: slopes shape [5] != expected [4] (one slope per head of scores [2, 4, 3, 3])""",
            )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_cuda():
    scores = torch.randn(2, 4, 3, 3, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::alibi: slopes is on cpu but scores is on cuda:0"):
        torch.ops.baracuda.alibi(scores, torch.randn(4))
    with pytest.raises(ValueError, match=r"baracuda::alibi_backward: slopes is on cpu but grad is on cuda:0"):
        torch.ops.baracuda.alibi_backward(scores, torch.randn(4), [False, True])
