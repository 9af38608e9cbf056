"""Shared test helpers: opcheck runner, references and tolerances, compile, export, torch.func,
CUDA-graph and second-GPU checks."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pytest
import torch
from torch.autograd import forward_ad

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


def opcheck(op, args: Sequence, kwargs: dict | None = None, test_utils: Sequence[str] = OPCHECK_UTILS) -> None:
    """torch.library.opcheck with all four test utils (or `test_utils`); raises on the first failure."""
    result = torch.library.opcheck(op, tuple(args), kwargs or {}, test_utils=tuple(test_utils), raise_exception=True)
    bad = {k: v for k, v in result.items() if v != "SUCCESS"}
    assert not bad, bad


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """Compare with a (usually float64) reference at the tolerance of `dtype` (default: actual's dtype)."""
    dtype = dtype or actual.dtype
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(
        actual.to(torch.float64).cpu(), expected.to(torch.float64).cpu(), rtol=rtol * scale, atol=atol * scale
    )


def require_free_gpu_memory(gib: float) -> None:
    """Skip (naming the need) unless a CUDA device with `gib` GiB free is present; tests that
    call it are marked big_memory, and tools/gpu_check.sh runs those one at a time."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.cuda.empty_cache()
    if torch.cuda.mem_get_info()[0] < gib * 2**30:
        pytest.skip(f"needs {gib} GiB of free GPU memory")


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


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def outputs_and_grads(fn: Callable, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """fn(*inputs)'s outputs, then the gradients of a fixed weighted sum of its floating-point
    outputs with respect to the inputs that require grad."""
    outs = _as_tuple(fn(*inputs))
    wrt = [x for x in inputs if x.requires_grad]
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum()
               for o in outs if o.dtype.is_floating_point)
    grads = torch.autograd.grad(loss, wrt) if wrt else ()
    return [o.detach() for o in outs] + list(grads)


def check_compile_matches_eager(fn: Callable, inputs: Sequence[torch.Tensor], exact: bool = False) -> None:
    """torch.compile(fn, fullgraph=True, dynamic=True): forward and gradients (w.r.t. the
    inputs that require grad) equal eager's: bit for bit with exact=True (and integer outputs
    always), else within the dtype tolerance (Inductor may round the ops around ours differently)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)

    def run(f):
        return outputs_and_grads(f, [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs])

    for a, b in zip(run(compiled), run(fn), strict=True):
        if exact or not a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            assert_close(a, b)


_FALLBACK_WARNING = "There is a performance drop because we have not yet implemented the batching rule"


def check_torch_func_matches_autograd(fn: Callable, inputs: Sequence[torch.Tensor], batch: int = 3) -> None:
    """fn's gradients under torch.func equal autograd's, bit for bit (the same kernels on the
    same values): ``grad`` of the sum of fn's output and ``vjp`` with a random cotangent, with
    respect to every input; and per-sample gradients, ``vmap`` of ``grad`` over a batch of
    `batch` variants of the first input (the others shared), against autograd on each variant,
    within rounding (a batching rule runs the batch as one call, whose kernel may sum in
    another order), and without PyTorch's per-sample fallback (which warns) for any op. Forward
    mode: ``jacfwd`` equals ``jacrev`` (within rounding: another formula), and the tangent of
    ``torch.autograd.forward_ad`` equals ``torch.func.jvp``'s."""
    inputs = [x.detach() for x in inputs]

    def autograd(args, cotangent=None):
        leaves = [x.clone().requires_grad_() for x in args]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, torch.ones_like(out) if cotangent is None else cotangent)

    def same(got, want):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

    argnums = tuple(range(len(inputs)))
    same(torch.func.grad(lambda *a: fn(*a).sum(), argnums=argnums)(*inputs), autograd(inputs))
    out, vjp_fn = torch.func.vjp(fn, *inputs)
    cotangent = torch.randn_like(out)
    same(vjp_fn(cotangent), autograd(inputs, cotangent))
    first = torch.stack([inputs[0] * (1 + k) for k in range(batch)])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", _FALLBACK_WARNING)
        per_sample = torch.func.vmap(torch.func.grad(lambda *a: fn(*a).sum(), argnums=argnums),
                                     in_dims=(0,) + (None,) * (len(inputs) - 1))(first, *inputs[1:])
        forward = torch.func.jacfwd(fn, argnums=argnums)(*inputs)
        reverse = torch.func.jacrev(fn, argnums=argnums)(*inputs)
    want = [autograd([first[k], *inputs[1:]]) for k in range(batch)]
    for got, expected in zip(per_sample, [torch.stack([w[i] for w in want]) for i in range(len(inputs))], strict=True):
        torch.testing.assert_close(got, expected)
    for a, b in zip(forward, reverse, strict=True):
        torch.testing.assert_close(a, b)
    tangents = [torch.randn_like(x) for x in inputs]
    _, tangent = torch.func.jvp(fn, tuple(inputs), tuple(tangents))
    with forward_ad.dual_level():
        dual_out = fn(*[forward_ad.make_dual(x, t) for x, t in zip(inputs, tangents)])
        same([forward_ad.unpack_dual(dual_out).tangent], [tangent])


def check_vmap_matches_per_sample(fn: Callable, inputs: Sequence, in_dims: Sequence[int | None],
                                  exact: bool = True) -> None:
    """``torch.vmap(fn, in_dims)`` equals fn on each sample, stacked (bit for bit with `exact`,
    else within rounding), without PyTorch's per-sample fallback (which warns) for any op; and
    over a batch of zero samples gives the same shapes with a leading 0. `fn` returns a tensor
    or a tuple of tensors (or None)."""
    size = next(x.shape[d] for x, d in zip(inputs, in_dims) if d is not None)

    def stacked(outs):
        if isinstance(outs[0], tuple):
            return tuple(None if o is None else torch.stack([out[i] for out in outs]) for i, o in enumerate(outs[0]))
        return torch.stack(outs)

    def as_tuple(out):
        return out if isinstance(out, tuple) else (out,)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", _FALLBACK_WARNING)
        got = torch.func.vmap(fn, in_dims=tuple(in_dims))(*inputs)
        empty = [x.narrow(d, 0, 0) if d is not None else x for x, d in zip(inputs, in_dims)]
        got_empty = torch.func.vmap(fn, in_dims=tuple(in_dims))(*empty)
    want = stacked([fn(*[x.select(d, k) if d is not None else x for x, d in zip(inputs, in_dims)])
                    for k in range(size)])
    for a, b, e in zip(as_tuple(got), as_tuple(want), as_tuple(got_empty), strict=True):
        if b is None:
            assert a is None and e is None
            continue
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a, b, equal_nan=True)
        assert e.shape == (0, *b.shape[1:]) and e.dtype == b.dtype, (e.shape, b.shape)


class _Wrap(torch.nn.Module):
    """torch.export takes a Module; this one calls `fn` on its inputs."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def check_export_matches_eager(fn: Callable, example: Sequence[torch.Tensor], dynamic_shapes: Sequence[dict],
                               others: Sequence[Sequence[torch.Tensor]], ops: Sequence[str]) -> None:
    """torch.export.export(fn) with `dynamic_shapes` (one dict per input) on `example`: the
    graph calls each of `ops` (torch.ops.baracuda names, not decomposed), and the exported
    program, the same after a save/load round trip, and after run_decompositions() all equal
    eager bit for bit on `example` and on every input set in `others` (other sizes of the
    dynamic dimensions); so do the gradients through the exported module (w.r.t. the inputs
    whose `example` requires grad)."""
    example = list(example)
    program = torch.export.export(_Wrap(fn), tuple(x.detach() for x in example), dynamic_shapes=(tuple(dynamic_shapes),))
    called = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    for op in ops:
        assert f"baracuda.{op}.default" in called, (op, called)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    programs = (program, torch.export.load(buffer), program.run_decompositions())
    for inputs in (example, *others):
        inputs = [x.detach() for x in inputs]
        eager = _as_tuple(fn(*inputs))
        for p in programs:
            for a, b in zip(_as_tuple(p.module()(*inputs)), eager, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)

    def run(f, inputs):
        return outputs_and_grads(f, [x.detach().clone().requires_grad_(r.requires_grad) for x, r in zip(inputs, example)])

    for inputs in (example, *others):
        for a, b in zip(run(program.module(), inputs), run(fn, inputs), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def check_cuda_graph_matches_eager(fn: Callable, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> None:
    """fn's forward and autograd backward (outputs_and_grads, w.r.t. the inputs of `first` that
    require grad) captured in one CUDA graph on `first` (warmed up on a side stream, as torch.cuda.graph
    documents), then `second` copied into the captured inputs and the graph replayed: its
    outputs and gradients equal eager's on `second` bit for bit (so nothing syncs with the host,
    allocates outside the graph's pool, or keeps state from the capture)."""
    static = [x.detach().clone().requires_grad_(x.requires_grad) for x in first]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            outputs_and_grads(fn, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = outputs_and_grads(fn, static)
    with torch.no_grad():
        for s, x in zip(static, second, strict=True):
            s.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    eager = outputs_and_grads(fn, [x.detach().clone().requires_grad_(s.requires_grad) for x, s in zip(second, static)])
    for a, b in zip(captured, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs two CUDA devices")


def check_second_gpu_matches_first(fn: Callable, inputs: Sequence[torch.Tensor]) -> None:
    """With cuda:0 the current device, fn's outputs and gradients (outputs_and_grads) on copies of
    `inputs` on cuda:1 lie on cuda:1 and equal those on cuda:0 bit for bit: every kernel, side
    stream, workspace and device property follows the tensors' device, not the current one."""
    def on(device):
        return [x.detach().to(device).requires_grad_(x.requires_grad) for x in inputs]

    with torch.cuda.device(0):
        expected = outputs_and_grads(fn, on("cuda:0"))
        got = outputs_and_grads(fn, on("cuda:1"))
        torch.cuda.synchronize(1)
    for a, b in zip(got, expected, strict=True):
        assert a.device == torch.device("cuda:1"), a.device
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------------------- samples for the battery

# The parts of the shared battery (test/test_battery.py) a sample runs; CUDA_PARTS run on CUDA only.
BATTERY_PARTS = ("opcheck", "reference", "gradcheck", "determinism", "compile", "export", "vmap", "torch_func",
                 "cuda_graph", "second_gpu")
CUDA_PARTS = ("cuda_graph", "second_gpu")


@dataclass(frozen=True)
class Export:
    """torch.export of a sample: one dynamic_shapes dict per tensor input, input sets of other
    sizes of those dims, and the baracuda ops the exported graph must call (default: the sample's)."""

    dynamic_shapes: Sequence[dict]
    others: Sequence[Sequence[torch.Tensor]]
    ops: Sequence[str] = ()


@dataclass(frozen=True)
class SampleInput:
    """One call of one op for the battery. `op` (an OpOverload: .default or .out) runs on
    (`args`, `kwargs`) under opcheck; the other parts run `fn` (default: `op` with its
    optional outputs left out, for a public callable pass it) on the tensor arguments, in
    order, with requires_grad on the positions of `args` listed in `grad`. `reference` takes
    float64 copies of the tensor arguments and returns the expected outputs (compared at the
    sample's dtype tolerance times `ref_scale`). `vmap` lists in_dims (one entry per tensor
    argument) and `vmap_exact` says where vmap must equal the per-sample calls bit for bit
    ("everywhere", "cpu": a batched CUDA launch may sum in another order, or "nowhere").
    `args` may be a function that builds them: a GPU-sized sample, built only where it runs (the
    CUDA-only parts). `batch` may give, per tensor argument, a stack (dim 0) of the samples
    vmap batches (say, offsets that differ per sample); else vmap stacks shuffled copies.
    `opcheck_utils` narrows opcheck where a util cannot run (say why where the sample is made).
    `skips` maps each part the sample does not run to the reason."""

    name: str
    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict = field(default_factory=dict)
    grad: tuple[int, ...] = ()
    fn: Callable | None = None
    reference: Callable | None = None
    ref_scale: float = 1.0
    compile_exact: bool = False
    vmap: Sequence[tuple] = ()
    vmap_exact: str = "everywhere"
    batch: Sequence | None = None
    export: Export | None = None
    gradgrad: bool = False
    opcheck_utils: tuple[str, ...] = OPCHECK_UTILS
    skips: dict = field(default_factory=dict)

    @property
    def family_op(self) -> str:
        return self.op._schema.name.split("::")[1] + ("" if self.op._overloadname == "default"
                                                       else "." + self.op._overloadname)

    def tensor_positions(self) -> list[int]:
        return [i for i, a in enumerate(self.args) if isinstance(a, torch.Tensor)]

    def inputs(self, requires_grad: bool = True) -> list[torch.Tensor]:
        """Fresh leaves for the tensor arguments (requires_grad on `grad` when asked)."""
        return [self.args[i].detach().clone().requires_grad_(requires_grad and i in self.grad)
                for i in self.tensor_positions()]

    def call(self) -> Callable:
        """fn(*tensor inputs)."""
        if self.fn is not None:
            return self.fn
        positions = self.tensor_positions()

        def run(*tensors):
            args = list(self.args)
            for i, t in zip(positions, tensors, strict=True):
                args[i] = t
            out = self.op(*args, **self.kwargs)
            return tuple(o for o in out if o is not None) if isinstance(out, (tuple, list)) else out

        return run


def only(parts: Sequence[str], reason: str) -> dict:
    """skips for a sample that runs `parts` alone, every other part for `reason`."""
    return {p: reason for p in BATTERY_PARTS if p not in parts}
