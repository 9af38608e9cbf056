"""Hostile input never crashes or corrupts: overflow-checked sizes, out= aliasing, mixed devices,
PyTorch-compatible exception types, wrong Python argument types, and the Plan API's typed errors.

Cases that used to crash the process run in a fresh interpreter (run_isolated), so a regression
fails its test instead of killing the test run."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import baracuda_ops
from baracuda_ops import (
    BaracudaIndexError,
    BaracudaNotImplementedError,
    BaracudaTypeError,
    BaracudaValueError,
    InvalidProblemError,
    UnsupportedError,
)
from conftest import CUDA_OK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ops = torch.ops.baracuda


def run_isolated(code: str, device: torch.device) -> None:
    """Runs `code` in a fresh interpreter with `torch`, `baracuda_ops`, `ops`, `device` and an
    `expect_error(cls, match, fn, *args, **kwargs)` helper; fails on a non-zero exit (a signal
    included) with the child's output."""
    prelude = textwrap.dedent(f"""
        import re
        import torch
        import baracuda_ops
        from baracuda_ops import *
        ops = torch.ops.baracuda
        device = torch.device({str(device)!r})

        def expect_error(cls, match, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except cls as e:
                assert re.search(match, str(e)), f"{{type(e).__name__}}: {{e}} does not match {{match!r}}"
                return
            raise AssertionError(f"no {{cls.__name__}} raised")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, f"exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# --------------------------------------------------------------------------- size overflow (crashes)


def test_repeat_backward_size_overflow_raises(device):
    run_isolated("""
        grad = torch.ones(4, device=device)
        # 4 * (2^62 + 1) wraps to 4 in int64: the grad shape would match and the kernel read past it
        expect_error(BaracudaValueError, r"^baracuda::repeat_backward: .*overflows int64",
                     ops.repeat_backward, grad, [2**62 + 1], [4])
        expect_error(BaracudaValueError, r"^baracuda::repeat_backward: .*overflows int64", ops.repeat_backward.out,
                     grad, [2**62 + 1], [4], grad_input=torch.empty(4, device=device),
                     workspace=torch.empty(1 << 20, dtype=torch.uint8, device=device))
        expect_error(BaracudaValueError, r"^baracuda::repeat_backward: ", ops.repeat_backward,
                     grad, [2, 2], [2**62, 4])
    """, device)


def test_repeat_size_overflow_raises(device):
    run_isolated("""
        x = torch.randn(4, device=device)
        expect_error(BaracudaValueError, r"^baracuda::repeat: .*overflows int64", ops.repeat, x, [2**62])
        expect_error(BaracudaValueError, r"^baracuda::repeat: .*overflows int64", ops.repeat.out, x, [2**62],
                     out=torch.empty(0, device=device))
        expect_error(BaracudaValueError, r"^baracuda::repeat: .*overflows int64", ops.repeat, x, [2**32, 2**32])
        expect_error(RuntimeError, r"^baracuda::repeat: ", baracuda_ops.repeat, x, [2**62])
        # the fake (meta) path checks the same
        expect_error(BaracudaValueError, r"^baracuda::repeat: ", ops.repeat, x.to("meta"), [2**62])
    """, device)


def test_embedding_bag_backward_workspace_overflow_raises(device):
    run_isolated("""
        indices = torch.tensor([0, 1, 1], device=device)
        offset2bag = torch.tensor([0, 0, 1], device=device)
        bag_size = torch.tensor([2, 1], device=device)
        none = torch.empty(0, dtype=torch.long, device=device)
        # embedding_dim = 0: nothing to write, whatever num_weights says (no workspace)
        grad = torch.zeros(2, 0, device=device)
        for V in (2**61, 2**62, 2**63 - 1):
            out = ops.embedding_bag_backward(grad, indices, offset2bag, bag_size, none, V, 0)
            assert out.shape == (V, 0)
            gw = torch.empty(V, 0, device=device)
            ops.embedding_bag_backward.out(grad, indices, offset2bag, bag_size, none, V, 0, grad_weight=gw,
                                           workspace=torch.empty(0, dtype=torch.uint8, device=device))
        # embedding_dim = 1: the workspace size overflows (CPU) or passes the CUDA kernel's limits:
        # a typed error before anything is allocated
        grad = torch.zeros(2, 1, device=device)
        expect_error((BaracudaValueError, BaracudaNotImplementedError), r"^baracuda::embedding_bag_backward: ",
                     ops.embedding_bag_backward, grad, indices, offset2bag, bag_size, none, 2**62, 0)
        # grad_weight [V, D] itself overflows
        expect_error(BaracudaValueError, r"^baracuda::embedding_bag_backward: .*overflows int64",
                     ops.embedding_bag_backward, torch.zeros(2, 4, device=device), indices, offset2bag, bag_size,
                     none, 2**62, 0)
        # the Plan API: the workspace size is checked at select()
        desc = EmbeddingBagBackwardDescriptor(2**62, 1, (3,), 2, mode="sum", device=device)
        expect_error((InvalidProblemError, UnsupportedError), r"^baracuda::embedding_bag_backward: ",
                     EmbeddingBagBackwardPlan.select, desc)
        plan = EmbeddingBagBackwardPlan.select(EmbeddingBagBackwardDescriptor(2**40, 0, (3,), 2, mode="sum",
                                                                               device=device))
        assert plan.workspace_size() >= 0
    """, device)


def test_fractional_max_pool_window_overflow_raises(device):
    run_isolated("""
        big = 2**63 - 1
        x = torch.randn(1, 1, 8, 8, device=device)
        samples = torch.rand(1, 1, 2, device=device)
        for k in ([big, 2], [2, big], [big, big]):
            expect_error(BaracudaValueError, r"^baracuda::fractional_max_pool2d: ", ops.fractional_max_pool2d, x,
                         k, [2, 2], samples)
            expect_error(BaracudaValueError, r"^baracuda::fractional_max_pool2d_backward: ",
                         ops.fractional_max_pool2d_backward, torch.zeros(1, 1, 2, 2, device=device), x, k, [2, 2],
                         torch.zeros(1, 1, 2, 2, dtype=torch.long, device=device))
        expect_error(BaracudaValueError, r"^baracuda::fractional_max_pool2d: ", ops.fractional_max_pool2d, x,
                     [2, 2], [big, 2], samples)
        expect_error(RuntimeError, r"^baracuda::fractional_max_pool2d: ", baracuda_ops.fractional_max_pool2d, x,
                     kernel_size=big, output_size=2)
        x3 = torch.randn(1, 1, 4, 4, 4, device=device)
        expect_error(BaracudaValueError, r"^baracuda::fractional_max_pool3d: ", ops.fractional_max_pool3d, x3,
                     [big, 2, 2], [2, 2, 2], torch.rand(1, 1, 3, device=device))
        expect_error(RuntimeError, r"^baracuda::fractional_max_pool3d: ", baracuda_ops.fractional_max_pool3d, x3,
                     kernel_size=big, output_size=2)
        expect_error(InvalidProblemError, r"^baracuda::fractional_max_pool2d: ", FractionalMaxPool2dPlan.select,
                     FractionalMaxPool2dDescriptor((1, 1, 8, 8), (big, 2), (2, 2), torch.float32, device))
    """, device)


def test_alibi_plan_problem_overflow_raises():
    with pytest.raises(InvalidProblemError, match=r"^baracuda::alibi: .*overflows int64"):
        baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor((2**32, 2**32, 4, 4), torch.float32))


# --------------------------------------------------------------------------- out= / workspace aliasing

_OVERLAP = r"(overlap|single memory location)"


def test_repeat_out_overlapping_input_raises(device):
    buf = torch.arange(8.0, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::repeat: out overlaps the input self"):
        ops.repeat.out(buf[2:6], [2], out=buf)
    with pytest.raises(RuntimeError, match=r"^baracuda::repeat: .*" + _OVERLAP):
        ops.repeat.out(buf[:4], [1], out=buf[:4])  # exact aliasing is rejected too (a copy, not elementwise)
    with pytest.raises(RuntimeError, match=r"^baracuda::repeat: "):
        ops.repeat.out(buf[:1], [8], out=torch.zeros(1, device=device).expand(8))
    assert torch.equal(buf, torch.arange(8.0, device=device))  # nothing written
    grad = torch.arange(8.0, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::repeat_backward: grad_input overlaps the input grad"):
        ops.repeat_backward.out(grad, [2], [4], grad_input=grad[4:], workspace=torch.empty(0, dtype=torch.uint8))


def test_rms_norm_out_overlapping_input_raises(device):
    x = torch.randn(3, 4, device=device)
    w = torch.randn(4, device=device)
    _, rstd = ops.rms_norm(x, [4], w)
    grad_out = torch.randn(3, 4, device=device)
    # grad_input written over grad_out (a common in-place reuse) would change grad_weight
    with pytest.raises(BaracudaValueError, match=r"^baracuda::rms_norm_backward: grad_input overlaps the input grad_out"):
        ops.rms_norm_backward.out(grad_out, x, [4], rstd, w, [True, True], grad_input=grad_out,
                                  grad_weight=torch.empty(4, device=device),
                                  workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))
    with pytest.raises(BaracudaValueError, match=r"^baracuda::rms_norm_backward: grad_weight overlaps the input weight"):
        ops.rms_norm_backward.out(grad_out, x, [4], rstd, w, [True, True], grad_input=torch.empty_like(x),
                                  grad_weight=w, workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))
    # an output the mask leaves unwritten may be anything
    gw = torch.empty(4, device=device)
    ops.rms_norm_backward.out(grad_out, x, [4], rstd, w, [False, True], grad_input=grad_out, grad_weight=gw,
                              workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))
    torch.testing.assert_close(gw, ops.rms_norm_backward(grad_out, x, [4], rstd, w, [True, True])[1])
    with pytest.raises(BaracudaValueError, match=r"^baracuda::rms_norm: output overlaps the input input"):
        ops.rms_norm.out(x, [4], w, None, output=x, rstd=torch.empty(3, 1, device=device))
    with pytest.raises(BaracudaValueError, match=r"^baracuda::rms_norm: output and rstd overlap"):
        buf = torch.empty(16, device=device)
        ops.rms_norm.out(x, [4], w, None, output=buf[:12].view(3, 4), rstd=buf[10:13].view(3, 1))


def test_embedding_bag_out_overlapping_input_raises(device):
    weight = torch.randn(10, 4, device=device)
    indices = torch.tensor([1, 2, 3], device=device)
    offsets = torch.tensor([0, 2], device=device)
    o2b = torch.empty(3, dtype=torch.long, device=device)
    bag_size = torch.empty(2, dtype=torch.long, device=device)
    mp = torch.empty(0, dtype=torch.long, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::embedding_bag: output overlaps the input weight"):
        ops.embedding_bag.out(weight, indices, offsets, 0, output=weight[2:4], offset2bag=o2b, bag_size=bag_size,
                              max_positions=mp)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::embedding_bag: offset2bag overlaps the input indices"):
        ops.embedding_bag.out(weight, indices, offsets, 0, output=torch.empty(2, 4, device=device),
                              offset2bag=indices.long(), bag_size=offsets, max_positions=mp)
    # backward: workspace over grad_weight, grad_weight over grad
    out, o2b, bag_size, mp = ops.embedding_bag(weight, indices, offsets, 0)
    grad = torch.randn(2, 4, device=device)
    buf = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::embedding_bag_backward: workspace overlaps"):
        ops.embedding_bag_backward.out(grad, indices, o2b, bag_size, mp, 10, 0,
                                       grad_weight=buf[:160].view(torch.float32).view(10, 4), workspace=buf)
    big = torch.randn(10, 4, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::embedding_bag_backward: grad_weight overlaps the input grad"):
        ops.embedding_bag_backward.out(big[:2], indices, o2b, bag_size, mp, 10, 0, grad_weight=big,
                                       workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))
    with pytest.raises(BaracudaValueError, match=r"^baracuda::embedding_bag_per_sample_weights_backward: "
                                                 r"grad_per_sample_weights overlaps the input grad"):
        ops.embedding_bag_per_sample_weights_backward.out(grad, weight, indices, o2b, 0,
                                                          grad_per_sample_weights=grad.view(-1)[:3])


def test_fractional_max_pool_out_overlapping_input_raises(device):
    x = torch.randn(1, 1, 4, 4, device=device)
    samples = torch.rand(1, 1, 2, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::fractional_max_pool2d: output overlaps the input self"):
        ops.fractional_max_pool2d.out(x, [2, 2], [2, 2], samples, output=x.view(-1)[:4].view(1, 1, 2, 2),
                                      indices=torch.empty(1, 1, 2, 2, dtype=torch.long, device=device))
    out, idx = ops.fractional_max_pool2d(x, [2, 2], [2, 2], samples)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::fractional_max_pool2d_backward: grad_input overlaps"):
        ops.fractional_max_pool2d_backward.out(torch.ones_like(out), x, [2, 2], [2, 2], idx, grad_input=x,
                                               workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))


def test_alibi_out_exact_alias_allowed_partial_raises(device):
    scores = torch.randn(2, 3, 4, 5, device=device)
    slopes = baracuda_ops.alibi_slopes(3, device=device)
    expected = ops.alibi(scores, slopes)
    ops.alibi.out(scores, slopes, out=scores)  # documented: out may be scores itself
    assert torch.equal(scores, expected)
    buf = torch.randn(2 * 3 * 4 * 5 + 4, device=device)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::alibi: out overlaps the input scores.*only scores itself"):
        ops.alibi.out(buf[:120].view(2, 3, 4, 5), slopes, out=buf[4:].view(2, 3, 4, 5))
    with pytest.raises(BaracudaValueError, match=r"^baracuda::alibi_inplace: scores has internal overlap"):
        ops.alibi_inplace(torch.zeros(1, 3, 1, 5, device=device).expand(2, 3, 4, 5), slopes)
    grad = torch.randn(2, 3, 4, 5, device=device)
    expected_scores, expected_slopes = ops.alibi_backward(grad, slopes, [True, True])
    grad_slopes = torch.empty_like(slopes)
    ops.alibi_backward.out(grad, slopes, [True, True], grad_scores=grad, grad_slopes=grad_slopes,
                           workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))
    assert torch.equal(grad, expected_scores) and torch.equal(grad_slopes, expected_slopes)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::alibi_backward: grad_slopes overlaps the input slopes"):
        ops.alibi_backward.out(grad, slopes, [False, True], grad_scores=grad, grad_slopes=slopes,
                               workspace=torch.empty(1 << 16, dtype=torch.uint8, device=device))


# --------------------------------------------------------------------------- mixed devices


def _mixed_device_calls(a: torch.device, b: torch.device):
    """(name, call) pairs with every argument on `a` but one on `b`."""
    x = torch.randn(2, 3, 4, 4, device=a)
    w = torch.randn(4, device=a)
    _, rstd = ops.rms_norm(x.to("cpu"), [4], w.to("cpu"))
    rstd = rstd.to(a)
    weight = torch.randn(10, 4, device=a)
    indices = torch.tensor([1, 2, 3], device=a)
    offsets = torch.tensor([0, 2], device=a)
    samples = torch.rand(2, 3, 2, device=a)
    return [
        ("alibi", lambda: ops.alibi(x, torch.ones(3, device=b))),
        ("rms_norm", lambda: ops.rms_norm(x, [4], w.to(b))),
        ("rms_norm_backward", lambda: ops.rms_norm_backward(torch.ones_like(x), x, [4], rstd.to(b), w, [True, True])),
        ("embedding_bag", lambda: ops.embedding_bag(weight, indices.to(b), offsets, 0)),
        ("embedding_bag", lambda: ops.embedding_bag(weight, indices, offsets.to(b), 0)),
        ("fractional_max_pool2d", lambda: ops.fractional_max_pool2d(x, [2, 2], [2, 2], samples.to(b))),
        ("repeat", lambda: ops.repeat.out(x, [1, 1, 1, 1], out=torch.empty_like(x, device=b))),
    ]


@pytest.mark.parametrize("case", range(7))
def test_meta_argument_on_a_cpu_call_raises(case):
    # a meta argument sends the call to the fake, which must not return uninitialised CPU memory
    op, call = _mixed_device_calls(torch.device("cpu"), torch.device("meta"))[case]
    with pytest.raises(BaracudaValueError, match=rf"^baracuda::{op}: .*(meta|cpu).*(meta|cpu)"):
        call()


@pytest.mark.skipif(not CUDA_OK, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("devices", [("cuda", "cpu"), ("cpu", "cuda")])
def test_cpu_and_cuda_arguments_raise(case, devices):
    op, call = _mixed_device_calls(torch.device(devices[0]), torch.device(devices[1]))[case]
    with pytest.raises(RuntimeError, match=rf"^baracuda::{op}: "):
        call()


# --------------------------------------------------------------------------- vmap of embedding_bag with no bags


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_vmap_embedding_bag_zero_bags(device, mode, include_last_offset):
    weight = torch.randn(10, 4, device=device)
    indices = torch.randint(0, 10, (3, 6), device=device)
    offsets = torch.zeros(3, 1 if include_last_offset else 0, dtype=torch.long, device=device)

    def f(i, o):
        return ops.embedding_bag(weight, i, o, mode, None, include_last_offset)

    batched = torch.vmap(f)(indices, offsets)
    for k in range(3):
        one = f(indices[k], offsets[k])
        for got, want in zip(batched, one):
            assert got[k].shape == want.shape
            assert torch.equal(got[k], want)
    assert batched[0].shape == (3, 0, 4)


# --------------------------------------------------------------------------- exception types


def test_exception_classes_are_also_pytorchs():
    assert issubclass(BaracudaValueError, ValueError) and issubclass(BaracudaValueError, RuntimeError)
    assert issubclass(BaracudaIndexError, IndexError) and issubclass(BaracudaIndexError, RuntimeError)
    assert issubclass(BaracudaTypeError, TypeError) and issubclass(BaracudaTypeError, NotImplementedError)
    assert issubclass(BaracudaTypeError, RuntimeError)
    assert issubclass(BaracudaNotImplementedError, NotImplementedError)
    assert issubclass(InvalidProblemError, BaracudaValueError) and issubclass(UnsupportedError, RuntimeError)


def test_cpp_errors_raise_the_python_classes(device):
    weight = torch.randn(10, 4, device=device)
    if device.type == "cpu":  # CUDA flags out-of-range indices in the output instead (no sync)
        with pytest.raises(BaracudaIndexError, match=r"^baracuda::embedding_bag: indices\[1\] = 10 is out of range"):
            ops.embedding_bag(weight, torch.tensor([1, 10]), torch.tensor([0]), 0)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::repeat: repeats must be >= 0"):
        ops.repeat(torch.randn(3, device=device), [-1])
    with pytest.raises(BaracudaTypeError, match=r"^baracuda::alibi: scores must be float16"):
        ops.alibi(torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device), torch.ones(1, device=device))
    with pytest.raises(BaracudaNotImplementedError, match=r"^baracuda::embedding_bag: per_sample_weights is only"):
        ops.embedding_bag(weight, torch.tensor([1, 2], device=device), torch.tensor([0], device=device), 1,
                          torch.ones(2, device=device))


def test_per_sample_weights_with_mean_is_not_implemented_as_in_pytorch(device):
    weight = torch.randn(10, 4, device=device)
    args = (torch.tensor([1, 2], device=device), weight, torch.tensor([0], device=device))
    kwargs = dict(mode="mean", per_sample_weights=torch.ones(2, device=device))
    with pytest.raises(NotImplementedError):
        torch.nn.functional.embedding_bag(*args, **kwargs)
    with pytest.raises(BaracudaNotImplementedError, match=r"^baracuda::embedding_bag: "):
        baracuda_ops.embedding_bag(*args, **kwargs)
    with pytest.raises(BaracudaNotImplementedError, match=r"^baracuda::embedding_bag: "):
        ops.embedding_bag(weight.to("meta"), args[0].to("meta"), args[2].to("meta"), 1, torch.ones(2, device="meta"))


def test_error_raised_inside_autograd_backward_keeps_its_class():
    class BadBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return ops.repeat_backward(grad, [2], [3])  # grad [4] != the [6] that [3] x [2] gives

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(BaracudaValueError, match=r"^baracuda::repeat_backward: grad shape \[4\] != expected \[6\]"):
        BadBackward.apply(x).sum().backward()


def test_error_raised_by_a_compiled_graph_keeps_its_class():
    weight = torch.randn(10, 4)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(indices, offsets):
        return ops.embedding_bag(weight, indices, offsets, 0)[0] * 2

    f(torch.tensor([1, 2]), torch.tensor([0]))
    with pytest.raises(BaracudaIndexError, match=r"^baracuda::embedding_bag: indices\[1\] = 10 is out of range"):
        f(torch.tensor([1, 10]), torch.tensor([0]))


def test_max_norm_checks_indices_before_the_renorm():
    weight = torch.randn(10, 4)
    before = weight.clone()
    with pytest.raises(BaracudaIndexError, match=r"^baracuda::embedding_bag: index 10 is out of range"):
        baracuda_ops.embedding_bag(torch.tensor([1, 10]), weight, torch.tensor([0]), max_norm=0.5)
    assert torch.equal(weight, before)  # nothing renormalised


# --------------------------------------------------------------------------- wrong Python argument types


@pytest.mark.parametrize("call,match", [
    (lambda x: baracuda_ops.repeat(x, (1.5, 2)), r"^baracuda::repeat: repeats must be an int or a sequence of ints"),
    (lambda x: baracuda_ops.repeat(x, "ab"), r"^baracuda::repeat: repeats "),
    (lambda x: baracuda_ops.rms_norm(x, [4], None, "x"), r"^baracuda::rms_norm: argument eps has the wrong type"),
    (lambda x: baracuda_ops.rms_norm(x, 4.0), r"^baracuda::rms_norm: normalized_shape must be an int or a sequence"),
    (lambda x: baracuda_ops.rms_norm(x, [4], [1.0] * 4), r"^baracuda::rms_norm: weight must be a Tensor"),
    (lambda x: baracuda_ops.fractional_max_pool2d(x, kernel_size=1.5, output_size=2),
     r"^baracuda::fractional_max_pool2d: kernel_size must be an int"),
    (lambda x: baracuda_ops.fractional_max_pool2d(x, kernel_size=2, output_size=(2, 2.5)),
     r"^baracuda::fractional_max_pool2d: output_size must be an int"),
    (lambda x: baracuda_ops.alibi(x.tolist(), torch.ones(3)), r"^baracuda::alibi: scores must be a Tensor"),
    (lambda x: baracuda_ops.alibi(x, [1.0, 1.0, 1.0]), r"^baracuda::alibi: slopes must be a Tensor"),
    (lambda x: baracuda_ops.embedding_bag(torch.tensor([[1, 2]]), torch.randn(4, 4), per_sample_weights=[1.0, 2.0],
                                          mode="sum"),
     r"^baracuda::embedding_bag: per_sample_weights must be a Tensor"),
])
def test_wrong_python_argument_type_raises_type_error(call, match):
    with pytest.raises(BaracudaTypeError, match=match):
        call(torch.randn(2, 3, 4, 4))


# --------------------------------------------------------------------------- Plan API


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_plan_select_on_cuda_without_cuda_is_unsupported():
    with pytest.raises(UnsupportedError, match=r"^baracuda::repeat: .*CUDA is not available"):
        baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((4,), (2,), torch.float32, "cuda"))
    with pytest.raises(UnsupportedError, match=r"^baracuda::rms_norm: "):
        baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((2, 4), (4,), torch.float32, device="cuda"))


@pytest.mark.parametrize("select,match", [
    (lambda: baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((4,), (1.5,), torch.float32)),
     r"^baracuda::repeat: "),
    (lambda: baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((-4,), (2,), torch.float32)),
     r"^baracuda::repeat: "),
    (lambda: baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((2**40,), (2**40,), torch.float32)),
     r"^baracuda::repeat: .*overflows int64"),
    (lambda: baracuda_ops.RepeatBackwardPlan.select(baracuda_ops.RepeatBackwardDescriptor((4,), (2.5,), torch.float32)),
     r"^baracuda::repeat_backward: "),
    (lambda: baracuda_ops.EmbeddingBagPlan.select(baracuda_ops.EmbeddingBagDescriptor(10, 4, (6,), -2, "sum")),
     r"^baracuda::embedding_bag: "),
    (lambda: baracuda_ops.EmbeddingBagPlan.select(baracuda_ops.EmbeddingBagDescriptor(10, -4, (6,), 2, "sum")),
     r"^baracuda::embedding_bag: "),
    (lambda: baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((2, 4), (4,), torch.float32, eps=-1.0)),
     r"^baracuda::rms_norm: eps"),
    (lambda: baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((2, 4), (4,), torch.float32,
                                                                            eps=float("nan"))),
     r"^baracuda::rms_norm: eps"),
    (lambda: baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((2, 4), (4,), torch.float32, eps="x")),
     r"^baracuda::rms_norm: eps"),
    (lambda: baracuda_ops.RMSNormPlan.select(baracuda_ops.RMSNormDescriptor((2, -4), (-4,), torch.float32)),
     r"^baracuda::rms_norm: "),
    (lambda: baracuda_ops.FractionalMaxPool2dPlan.select(
        baracuda_ops.FractionalMaxPool2dDescriptor((1, 1, 8, 8), (2, 2), (8, 8), torch.float32)),
     r"^baracuda::fractional_max_pool2d: "),
    (lambda: baracuda_ops.FractionalMaxPool3dBackwardPlan.select(
        baracuda_ops.FractionalMaxPool3dDescriptor((1, 1, 8, 8, 8), (2, 2, 2), (2.5, 2, 2), torch.float32)),
     r"^baracuda::fractional_max_pool3d"),
    (lambda: baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((4,), (2,), torch.float32, "nodevice")),
     r"^baracuda::repeat: device"),
])
def test_plan_select_rejects_bad_descriptors(select, match):
    with pytest.raises(InvalidProblemError, match=match):
        select()
