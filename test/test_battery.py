"""The battery every op passes, fed by each family's samples: test/samples/<family>.py (found by
glob) yields SampleInput records, and each runs here on every device (cpu, and cuda when present)
and every part of the battery it does not skip with a reason. Test ids name
family/op/sample/part-device. A new family adds a samples file, not a copy of the battery."""

import dataclasses
import functools
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch

import baracuda_ops.ops
from conftest import CUDA_OK
from helpers import (BATTERY_PARTS, CUDA_PARTS, SampleInput, assert_close, check_compile_matches_eager,
                     check_cuda_graph_matches_eager, check_export_matches_eager, check_second_gpu_matches_first,
                     check_torch_func_matches_autograd, check_vmap_matches_per_sample, needs_two_gpus, opcheck,
                     outputs_and_grads)

FAMILIES = sorted(p.stem for p in (Path(__file__).parent / "samples").glob("*.py") if not p.stem.startswith("_"))


@functools.lru_cache(maxsize=None)
def family_samples(family: str, device: str) -> dict[str, SampleInput]:
    """The family's samples on `device`, by id (op/sample), drawn from a fixed seed."""
    torch.manual_seed(0)
    found = {}
    for sample in importlib.import_module(f"samples.{family}").samples(torch.device(device)):
        key = f"{sample.family_op}/{sample.name}"
        assert key not in found, f"two samples named {key} in test/samples/{family}.py"
        found[key] = sample
    return found


def not_run(sample: SampleInput, part: str) -> str | None:
    """Why `sample` does not run `part` (None: it runs it)."""
    if part in sample.skips:
        return sample.skips[part]
    if callable(sample.args) and part not in CUDA_PARTS:
        return "a GPU-sized sample: the small samples run the parts that run on every device"
    if sample.op._overloadname != "default" and part != "opcheck":
        return "an out= overload: opcheck runs it, its functional overload's samples the rest"
    if part == "gradcheck" and (not sample.grad or any(sample.args[i].dtype != torch.float64 for i in sample.grad)):
        return "gradcheck runs on float64 differentiable inputs"
    if part == "torch_func" and (not sample.grad or sample.fn is None):
        return "torch.func transforms the public functions of differentiable inputs"
    needs = {"reference": sample.reference, "vmap": sample.vmap, "export": sample.export}
    if part in needs and not needs[part]:
        return f"the sample gives no {part} spec"
    return None


def _params():
    for family in FAMILIES:
        for key, sample in family_samples(family, "cpu").items():
            for part in BATTERY_PARTS:
                if not_run(sample, part) is not None:
                    continue
                for device in ("cuda",) if part in CUDA_PARTS else ("cpu", "cuda"):
                    marks = [pytest.mark.skipif(not CUDA_OK, reason="no CUDA device or CUDA kernels not built")
                             ] if device == "cuda" else []
                    if part == "second_gpu":
                        marks.append(needs_two_gpus)
                    yield pytest.param(family, key, part, torch.device(device), marks=marks,
                                       id=f"{family}/{key}/{part}-{device}")


def variant(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th input of a batch built from x: x itself, then x's values shuffled (so every value
    stays one the op accepts: samples in [0, 1), positive rstd); index tensors are kept."""
    if k == 0 or not x.dtype.is_floating_point:
        return x
    order = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(k)).to(x.device)
    return x.flatten()[order].view_as(x)


def _over_grad_inputs(sample: SampleInput):
    """(f, leaves): the sample's callable over its differentiable inputs alone, the others fixed."""
    inputs = sample.inputs()
    positions = [i for i, t in enumerate(inputs) if t.requires_grad]
    fn = sample.call()

    def f(*leaves):
        args = list(inputs)
        for i, t in zip(positions, leaves, strict=True):
            args[i] = t
        return fn(*args)

    return f, [inputs[i] for i in positions]


def run_part(sample: SampleInput, part: str, device: torch.device) -> None:
    fn = sample.call()
    if part == "opcheck":
        opcheck(sample.op, sample.args, sample.kwargs, sample.opcheck_utils)
        if sample.grad:
            args = list(sample.args)
            for i in sample.grad:
                args[i] = args[i].detach().clone().requires_grad_()
            opcheck(sample.op, args, sample.kwargs, sample.opcheck_utils)
    elif part == "reference":
        inputs = sample.inputs(requires_grad=False)
        got = fn(*inputs)
        want = sample.reference(*[t.double() if t.dtype.is_floating_point else t for t in inputs])
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, b in zip(got, want, strict=True):
            if b.dtype.is_floating_point:
                assert_close(a, b, scale=sample.ref_scale)
            else:
                assert torch.equal(a, b)
    elif part == "gradcheck":
        f, leaves = _over_grad_inputs(sample)
        assert torch.autograd.gradcheck(f, leaves)
        if sample.gradgrad:
            assert torch.autograd.gradgradcheck(f, leaves)
    elif part == "torch_func":
        f, leaves = _over_grad_inputs(sample)
        check_torch_func_matches_autograd(f, leaves)
    elif part == "determinism":
        # Forward and backward give the same bits twice.
        first, again = (outputs_and_grads(fn, sample.inputs()) for _ in range(2))
        for a, b in zip(first, again, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout
            if a.is_sparse:  # the same entries in the same order (a sparse weight gradient)
                assert torch.equal(a._indices(), b._indices())
                a, b = a._values(), b._values()
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif part == "compile":
        check_compile_matches_eager(fn, sample.inputs(), exact=sample.compile_exact)
    elif part == "export":
        spec = sample.export
        check_export_matches_eager(fn, sample.inputs(), spec.dynamic_shapes, spec.others,
                                   spec.ops or [sample.op._schema.name.split("::")[1]])
    elif part == "vmap":
        exact = {"everywhere": True, "cpu": device.type == "cpu", "nowhere": False}[sample.vmap_exact]
        inputs = sample.inputs(requires_grad=False)
        stacks = sample.batch or [torch.stack([variant(x, k) for k in range(3)]) for x in inputs]
        for in_dims in sample.vmap:
            batched = [x if d is None else s.movedim(0, d) for x, s, d in zip(inputs, stacks, in_dims, strict=True)]
            check_vmap_matches_per_sample(fn, batched, in_dims, exact)
    elif part == "cuda_graph":
        first = sample.inputs()
        check_cuda_graph_matches_eager(fn, first, [variant(x.detach(), 1) for x in first])
    elif part == "second_gpu":
        check_second_gpu_matches_first(fn, sample.inputs())
    else:
        raise AssertionError(f"unknown battery part {part}")


@pytest.mark.parametrize("family,key,part,device", list(_params()))
def test_battery(family, key, part, device):
    sample = family_samples(family, device.type)[key]
    if callable(sample.args):
        torch.manual_seed(0)
        sample = dataclasses.replace(sample, args=sample.args())
    run_part(sample, part, device)


# ---------------------------------------------------------------------------- the samples themselves


def _library_ops() -> set[str]:
    """Every public baracuda op overload (the private _-prefixed helpers aside), as op[.overload]."""
    names = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("baracuda::") and not name.split("::")[1].startswith("_"):
            op, _, overload = name.split("::")[1].partition(".")
            names.add(op + ("." + overload if overload else ""))
    return names


def test_every_family_has_samples():
    assert FAMILIES == sorted(m.name for m in pkgutil.iter_modules(baracuda_ops.ops.__path__))


def test_every_op_overload_has_a_sample():
    sampled = {s.family_op for f in FAMILIES for s in family_samples(f, "cpu").values()}
    assert _library_ops() <= sampled, sorted(_library_ops() - sampled)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_part_runs_and_every_skip_says_why(family):
    samples = family_samples(family, "cpu").values()
    for sample in samples:
        assert set(sample.skips) <= set(BATTERY_PARTS), (sample.name, sample.skips)
        assert all(isinstance(r, str) and r for r in sample.skips.values()), sample.name
    # Each part runs on some sample of the family (but for the parts its samples file declares
    # in FAMILY_SKIPS, with the reason), and opcheck on every op overload sampled.
    family_skips = getattr(importlib.import_module(f"samples.{family}"), "FAMILY_SKIPS", {})
    for part in BATTERY_PARTS:
        assert any(not_run(s, part) is None for s in samples) != (part in family_skips), (family, part)
    for op in {s.family_op for s in samples}:
        assert any(s.family_op == op and not_run(s, "opcheck") is None for s in samples), op
