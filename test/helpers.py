"""Shared test helpers: opcheck runner, references and tolerances, compile check."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# (rtol, atol) for comparing a result computed in `dtype` with a float64 reference
# rounded to `dtype`: a few units in the last place of the type.
TOLERANCES = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-12, 1e-12),
}

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(op, args: Sequence, kwargs: dict | None = None) -> None:
    """torch.library.opcheck with all four test utils; raises on the first failure."""
    result = torch.library.opcheck(op, tuple(args), kwargs or {}, test_utils=OPCHECK_UTILS, raise_exception=True)
    bad = {k: v for k, v in result.items() if v != "SUCCESS"}
    assert not bad, bad


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """Compare with a (usually float64) reference at the tolerance of `dtype` (default: actual's dtype)."""
    dtype = dtype or actual.dtype
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(
        actual.to(torch.float64).cpu(), expected.to(torch.float64).cpu(), rtol=rtol * scale, atol=atol * scale
    )


def random(shape: Sequence[int], dtype: torch.dtype, device, requires_grad: bool = False) -> torch.Tensor:
    """Seeded random input of any dtype (never all zeros)."""
    if dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(tuple(shape), dtype=dtype, device=device)
    elif dtype == torch.bool:
        t = torch.rand(tuple(shape), device=device) > 0.5
    else:
        t = torch.randint(-100 if dtype.is_signed else 0, 100, tuple(shape), dtype=dtype, device=device)
    return t.requires_grad_(requires_grad)


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with a value no kernel writes, so unwritten elements show."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(123 if t.dtype != torch.bool else True)


def check_compile_matches_eager(fn: Callable, inputs: Sequence[torch.Tensor], exact: bool = False) -> None:
    """torch.compile(fn, fullgraph=True, dynamic=True): forward and gradients (w.r.t. the
    inputs that require grad) equal eager's: bit for bit with exact=True, else within the
    dtype tolerance (Inductor may round the ops around ours differently)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)

    def run(f):
        xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        out = f(*xs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        grads_in = [x for x in xs if x.requires_grad]
        loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum() for o in outs)
        grads = torch.autograd.grad(loss, grads_in) if grads_in else ()
        return [o.detach() for o in outs], list(grads)

    eager_out, eager_grads = run(fn)
    comp_out, comp_grads = run(compiled)
    for a, b in zip(comp_out + comp_grads, eager_out + eager_grads):
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            assert_close(a, b)
