"""The eager host path: gradients come from the C++ autograd kernels (no Python autograd node, no
Python code of ours run by backward), the gradient-options op of embedding_bag, the per-call
timing module and the training benchmark's smoke mode."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import baracuda_ops
from helpers import assert_close, opcheck

PACKAGE_DIR = os.path.dirname(baracuda_ops.__file__)
TOOLS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def _module_cases(device):
    """(name, module, inputs, C++ Function name of the output's grad_fn) for every module."""
    bags = torch.randint(0, 20, (12,), device=device), torch.tensor([0, 3, 3, 7], device=device)
    hidden = torch.randn(3, 16, device=device, requires_grad=True)
    return [
        ("RMSNorm", baracuda_ops.nn.RMSNorm(16, device=device), (hidden,), "RMSNormFunction"),
        ("RMSNorm gemma", baracuda_ops.nn.RMSNorm(16, device=device, weight_offset=1.0, casting="gemma"), (hidden,),
         "RMSNormFusedFunction"),
        ("LlamaRMSNorm", baracuda_ops.nn.LlamaRMSNorm(16).to(device), (hidden,), "RMSNormFusedFunction"),
        ("GemmaRMSNorm residual", baracuda_ops.nn.GemmaRMSNorm(16).to(device),
         (hidden, torch.randn(3, 16, device=device, requires_grad=True)), "RMSNormFusedFunction"),
        ("EmbeddingBag", baracuda_ops.nn.EmbeddingBag(20, 8, mode="mean", padding_idx=2, device=device), bags,
         "EmbeddingBagFunction"),
        ("EmbeddingBag sparse", baracuda_ops.nn.EmbeddingBag(20, 8, mode="sum", sparse=True, device=device), bags,
         "EmbeddingBagFunction"),
        ("EmbeddingBag scale_grad_by_freq", baracuda_ops.nn.EmbeddingBag(20, 8, mode="mean", scale_grad_by_freq=True,
                                                                         device=device), bags, "EmbeddingBagFunction"),
        ("FractionalMaxPool2d", baracuda_ops.nn.FractionalMaxPool2d(2, output_size=3),
         (torch.randn(2, 3, 7, 7, device=device, requires_grad=True),), "PoolFunction"),
        ("FractionalMaxPool3d", baracuda_ops.nn.FractionalMaxPool3d(2, output_ratio=0.5),
         (torch.randn(1, 2, 6, 6, 6, device=device, requires_grad=True),), "PoolFunction"),
        ("ALiBi", baracuda_ops.nn.ALiBi(4, learnable=True, device=device),
         (torch.randn(2, 4, 5, 6, device=device, requires_grad=True),), "AlibiFunction"),
    ]


_MODULE_CASES = 10


class _PythonCalls:
    """Records the Python functions of baracuda_ops that run while it is active."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        def hook(frame, event, arg):
            # (the import hook of _dtensor.py runs when PyTorch imports a module lazily, not per op call)
            if (event == "call" and frame.f_code.co_filename.startswith(PACKAGE_DIR)
                    and frame.f_code.co_name != "find_spec"):
                self.calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        sys.setprofile(hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def _first(out):
    return out[0] if isinstance(out, tuple) else out  # (y, h) with a residual


@pytest.mark.parametrize("case", range(_MODULE_CASES))
def test_module_backward_runs_no_python(device, case):
    # The output's grad_fn is the op's C++ autograd Function, not a Python autograd.Function,
    # and backward runs no Python code of ours.
    cases = _module_cases(device)
    assert len(cases) == _MODULE_CASES
    name, module, inputs, node = cases[case]
    _first(module(*inputs)).sum().backward()  # a first backward may import lazily (PyTorch's modules, our import hook)
    out = _first(module(*inputs))
    assert not isinstance(out.grad_fn, torch.autograd.function.BackwardCFunction), name
    assert node in out.grad_fn.name(), (name, out.grad_fn.name())
    with _PythonCalls() as recorded:
        out.backward(torch.randn_like(out))
    assert recorded.calls == [], (name, recorded.calls)
    grads = [p.grad for p in module.parameters()] + [t.grad for t in inputs if t.requires_grad]
    assert grads and all(g is not None for g in grads), name


def test_functional_backward_runs_no_python(device):
    x = torch.randn(4, 6, device=device, requires_grad=True)
    w = torch.randn(6, device=device, requires_grad=True)
    idx, off = torch.tensor([0, 2, 2, 1, 3], device=device), torch.tensor([0, 2], device=device)
    outs = [baracuda_ops.rms_norm(x, 6), baracuda_ops.repeat(x, (2, 1, 3)),
            baracuda_ops.alibi(x.view(1, 2, 2, 6), torch.rand(2, device=device, requires_grad=True)),
            baracuda_ops.rms_norm_fused(x, 6, w, casting="llama"),
            baracuda_ops.rms_norm(x, 6, w, residual=torch.randn_like(x))[0],
            baracuda_ops.embedding_bag(idx, x, off, mode="sum", sparse=True),
            baracuda_ops.embedding_bag(idx, x, off, mode="mean", scale_grad_by_freq=True)]
    for out in outs:
        assert not isinstance(out.grad_fn, torch.autograd.function.BackwardCFunction)
        with _PythonCalls() as recorded:
            out.backward(torch.randn_like(out))
        assert recorded.calls == [], recorded.calls


class _AtenOps(TorchDispatchMode):
    """Records the ops that reach the kernels (below autograd) while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket).split(".")[-1] if func.namespace == "aten" else func.name())
        return func(*args, **(kwargs or {}))


def _ops_per_call(fn, inputs, grad):
    """The ops of a forward under no_grad, and of a forward plus backward."""
    with torch.no_grad(), _AtenOps() as forward:
        fn()
    with _AtenOps() as both:
        torch.autograd.grad(fn(), inputs, grad)
    return forward.ops, both.ops


def _op_count_cases(device):
    """(name, ours, PyTorch's equivalent, the inputs each is differentiated with respect to, upstream gradient,
    our forward's ops, our backward's ops)."""
    x, w = torch.randn(4, 32, device=device, requires_grad=True), torch.randn(32, device=device, requires_grad=True)
    rms, trms = baracuda_ops.nn.RMSNorm(32, device=device), torch.nn.RMSNorm(32, device=device)
    llama = baracuda_ops.nn.LlamaRMSNorm(32).to(device)
    idx, off = torch.randint(0, 50, (12,), device=device), torch.tensor([0, 3, 3, 7], device=device)
    bag, tbag = (baracuda_ops.nn.EmbeddingBag(50, 8, mode="sum", device=device),
                 torch.nn.EmbeddingBag(50, 8, mode="sum", device=device))
    sbag, tsbag = (baracuda_ops.nn.EmbeddingBag(50, 8, mode="sum", sparse=True, device=device),
                   torch.nn.EmbeddingBag(50, 8, mode="sum", sparse=True, device=device))
    img, samples = torch.randn(2, 3, 8, 8, device=device, requires_grad=True), torch.rand(2, 3, 2, device=device)
    scores = torch.randn(1, 4, 5, 5, device=device, requires_grad=True)
    slopes = baracuda_ops.alibi_slopes(4, device=device).requires_grad_()
    distance = (torch.arange(5, device=device) - torch.arange(5, device=device).unsqueeze(1)).float()
    g2, gbag = torch.randn(4, 32, device=device), torch.randn(4, 8, device=device)
    return [
        ("rms_norm", lambda: baracuda_ops.rms_norm(x, 32, w), lambda: F.rms_norm(x, (32,), w), (x, w), (x, w), g2,
         ["baracuda::rms_norm"], ["baracuda::rms_norm_backward"]),
        ("nn.RMSNorm", lambda: rms(x), lambda: trms(x), (x, rms.weight), (x, trms.weight), g2,
         ["baracuda::rms_norm"], ["baracuda::rms_norm_backward"]),
        ("LlamaRMSNorm", lambda: llama(x), lambda: trms(x), (x, llama.weight), (x, trms.weight), g2,
         ["baracuda::rms_norm_fused"], ["baracuda::rms_norm_fused_backward"]),
        ("nn.EmbeddingBag", lambda: bag(idx, off), lambda: tbag(idx, off), (bag.weight,), (tbag.weight,), gbag,
         ["baracuda::embedding_bag"], ["baracuda::embedding_bag_backward"]),
        ("nn.EmbeddingBag sparse", lambda: sbag(idx, off), lambda: tsbag(idx, off), (sbag.weight,), (tsbag.weight,), gbag,
         ["baracuda::embedding_bag"], ["baracuda::embedding_bag_weight_backward"]),
        ("fractional_max_pool2d",
         lambda: baracuda_ops.fractional_max_pool2d(img, 2, output_size=4, _random_samples=samples),
         lambda: F.fractional_max_pool2d(img, 2, output_size=4, _random_samples=samples), (img,), (img,),
         torch.randn(2, 3, 4, 4, device=device),
         ["baracuda::fractional_max_pool2d"], ["baracuda::fractional_max_pool2d_backward"]),
        ("repeat", lambda: baracuda_ops.repeat(x, (2, 3)), lambda: x.repeat(2, 3), (x,), (x,),
         torch.randn(8, 96, device=device), ["baracuda::repeat"], ["baracuda::repeat_backward"]),
        ("alibi", lambda: baracuda_ops.alibi(scores, slopes), lambda: scores + slopes.view(4, 1, 1) * distance,
         (scores, slopes), (scores, slopes), torch.randn(1, 4, 5, 5, device=device), ["baracuda::alibi"], ["baracuda::alibi_backward"]),
    ]


_OP_COUNT_CASES = 8


@pytest.mark.parametrize("case", range(_OP_COUNT_CASES))
def test_ops_per_call(device, case):
    # A call runs its op and nothing else (no casts, copies, fills or tensor creation around it),
    # forward and backward, and no more ops than PyTorch's equivalent.
    cases = _op_count_cases(device)
    assert len(cases) == _OP_COUNT_CASES
    name, ours, theirs, ours_inputs, theirs_inputs, grad, forward_ops, backward_ops = cases[case]
    ours_forward, ours_both = _ops_per_call(ours, ours_inputs, grad)
    theirs_forward, theirs_both = _ops_per_call(theirs, theirs_inputs, grad)
    assert ours_forward == forward_ops, (name, ours_forward)
    assert ours_both == forward_ops + backward_ops, (name, ours_both)
    assert len(ours_forward) <= len(theirs_forward), (name, ours_forward, theirs_forward)
    assert len(ours_both) <= len(theirs_both), (name, ours_both, theirs_both)


def test_double_backward_through_cpp_nodes(device):
    # repeat and alibi are differentiable twice through their C++ nodes; rms_norm's gradient
    # refuses a second derivative with its message.
    x = torch.randn(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: baracuda_ops.repeat(t, (2, 2)), (x,))
    slopes = torch.rand(2, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(baracuda_ops.alibi, (x.view(1, 2, 2, 3), slopes))
    (dx,) = torch.autograd.grad(baracuda_ops.rms_norm(x, 4).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="baracuda::rms_norm_backward: double backward"):
        dx.sum().backward()
    (dx,) = torch.autograd.grad(baracuda_ops.rms_norm_fused(x, 4, casting="llama").sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="baracuda::rms_norm_fused_backward: double backward"):
        dx.sum().backward()


def test_no_zero_filled_gradients_for_aux_outputs(device):
    # rstd, offset2bag, bag_size, max_positions and pool indices take no gradient: the C++
    # Functions do not expand them to zeros, so a backward through only the main output works
    # and an output left out of the loss gives no gradient call at all.
    x = torch.randn(3, 8, device=device, requires_grad=True)
    y, rstd = torch.ops.baracuda.rms_norm(x, [8], None, None)
    assert not rstd.requires_grad
    y.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_weight_backward_op_scale_and_sparse(device, dtype):
    # scale_grad_by_freq: the dense gradient, each row divided by its count; sparse: one entry per
    # position, value 0 for padding, equal to F.embedding_bag's sparse gradient once coalesced.
    idx = torch.tensor([1, 4, 1, 2, 4, 4, 0, 3], device=device)
    off = torch.tensor([0, 3, 5], device=device)
    w = torch.randn(6, 5, device=device, dtype=dtype)
    for mode in (0, 1):
        out, o2b, size, maxpos = torch.ops.baracuda.embedding_bag(w, idx, off, mode, None, False, 2)
        g = torch.randn_like(out)
        dense = torch.ops.baracuda.embedding_bag_backward(g, idx, o2b, size, maxpos, 6, mode, None, 2)
        counts = torch.bincount(idx, minlength=6).clamp(min=1).to(torch.float64).unsqueeze(1)
        scaled = torch.ops.baracuda.embedding_bag_weight_backward(g, idx, o2b, size, maxpos, 6, mode, None, 2, True,
                                                                  False)
        assert_close(scaled, dense.double() / counts, dtype=dtype)
        sparse = torch.ops.baracuda.embedding_bag_weight_backward(g, idx, o2b, size, maxpos, 6, mode, None, 2, False,
                                                                  True)
        assert sparse.layout == torch.sparse_coo and sparse._nnz() == idx.numel() and not sparse.is_coalesced()
        assert torch.equal(sparse._indices()[0], idx)
        assert (sparse._values()[idx == 2] == 0).all()
        wr = w.detach().cpu().double().requires_grad_()
        ref = F.embedding_bag(idx.cpu(), wr, off.cpu(), mode=["sum", "mean"][mode], sparse=True, padding_idx=2)
        (ref_g,) = torch.autograd.grad(ref, wr, g.cpu().double())
        assert_close(sparse.to_dense(), ref_g.to_dense(), dtype=dtype, scale=4)


def test_weight_backward_op_opcheck(device):
    idx = torch.randint(0, 10, (9,), device=device)
    off = torch.tensor([0, 2, 6], device=device)
    w = torch.randn(10, 4, device=device)
    out, o2b, size, maxpos = torch.ops.baracuda.embedding_bag(w, idx, off, 0, None, False, -1)
    args = (torch.randn_like(out), idx, o2b, size, maxpos, 10, 0, None, -1, True, False)
    opcheck(torch.ops.baracuda.embedding_bag_weight_backward.default, args)
    sparse_args = args[:-2] + (False, True)
    result = torch.library.opcheck(torch.ops.baracuda.embedding_bag_weight_backward.default, sparse_args,
                                   test_utils=("test_schema", "test_faketensor"), raise_exception=True)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_weight_backward_op_refuses_sparse_with_scale(device):
    idx, off = torch.tensor([0, 1], device=device), torch.tensor([0], device=device)
    out, o2b, size, maxpos = torch.ops.baracuda.embedding_bag(torch.randn(2, 3, device=device), idx, off, 0, None,
                                                              False, -1)
    with pytest.raises(NotImplementedError, match="baracuda::embedding_bag_weight_backward: scale_grad_by_freq is "
                                                  "not supported with sparse gradients"):
        torch.ops.baracuda.embedding_bag_weight_backward(out, idx, o2b, size, maxpos, 2, 0, None, -1, True, True)


def test_host_timing_runs(device):
    from baracuda_ops import host_timing

    rows = host_timing.run(device, iters=2, repeats=1)
    assert {r["op"] for r in rows} == {"rms_norm", "nn.RMSNorm", "nn.LlamaRMSNorm", "repeat", "embedding_bag",
                                       "nn.EmbeddingBag", "nn.EmbeddingBag sparse", "fractional_max_pool2d", "alibi"}
    assert all(r["ours_us"] > 0 and r["torch_us"] > 0 for r in rows)
    assert "extra us" in host_timing.format_table(rows)


def test_train_bench_smoke():
    # tools/train_bench.py --smoke: every model and variant, tiny sizes on CPU; ours trains like
    # PyTorch's modules (the loss curves agree within rounding).
    spec = importlib.util.spec_from_file_location("train_bench", os.path.join(TOOLS_DIR, "train_bench.py"))
    train_bench = importlib.util.module_from_spec(spec)
    sys.modules["train_bench"] = train_bench  # (its dataclass looks its module up there)
    spec.loader.exec_module(train_bench)
    results = train_bench.run(torch.device("cpu"), steps=2, warmup=1, compile_too=False, smoke=True)
    models = {r["model"] for r in results}
    assert models == {"llama-256-fp32", "llama-2048-bf16", "dlrm-dense-sgd", "dlrm-sparse-sgd", "dlrm-adagrad",
                      "alibi-lm", "cnn-fmp"}
    for r in results:
        assert len(r["losses"]) == 3 and r["max_loss_diff"] < 1e-3, r
