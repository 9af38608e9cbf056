"""rms_norm family: ``torch.nn.functional.rms_norm`` and its backward.

The input is viewed as ``[M, N]`` rows, ``N = prod(normalized_shape)`` (its
trailing dims). Per row, in float32 (float64 for float64 input)::

    rstd = 1 / sqrt(mean(x**2) + eps),   y = x * rstd * w
    dx   = rstd * (dy * w) - x * rstd**3 * mean(dy * w * x)
    dw   = sum over rows of dy * x * rstd      (ordered partials, no atomics)

Semantics follow ``torch.nn.functional.rms_norm``:

* output dtype = input dtype, also with a float32 weight on a float16/bfloat16
  input (PyTorch computes ``x * rstd * w`` in float32 and casts it to the input
  dtype); the op takes a weight of the input's dtype, or float32 with a half input;
  ``rms_norm`` (and ``nn.RMSNorm``) also the other floating weights PyTorch
  accepts, converted exactly to the computation type first (``_kernel_weight``),
  but for a float64 weight on a non-float64 input;
* ``eps=None`` means the machine epsilon of the computation type:
  ``torch.finfo(torch.float32).eps`` for float16/bfloat16/float32 and
  ``torch.finfo(torch.float64).eps`` for float64 — what PyTorch's kernels use;
* ``rstd`` has the input's shape with the normalized dims set to 1, in float32,
  or float64 for a float64 input (as ``aten::_fused_rms_norm`` returns it; a
  float32 rstd would cap a float64 backward at float32 precision).

``rms_norm_backward`` follows ``aten::_fused_rms_norm_backward``: an output
left out by ``output_mask`` is ``None`` (an undefined tensor), and so is
``grad_weight`` when ``weight`` is None. ``grad_weight`` has the weight's dtype.
In ``rms_norm_backward.out`` such outputs are not touched (pass any tensor, e.g.
an empty one). Its ``workspace`` holds the dW partials (float32, float64 for
float64): ``RMSNormBackwardPlan.workspace_size()`` bytes; none on CUDA for decode
rows (no more rows than SMs, where the kernel's column CTAs sum dW beside the rows)
or when one row group covers every row: the kernel writes dW directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _dtensor
from .._autograd import differentiable_op, op_without_backward
from .._vmap import arg_dims, batch_first, per_sample, sample_meta
from .._errors import BaracudaValueError, check_same_device, raise_typed_error
from .._plan import InvalidProblemError, Plan, PlanPreference, Workspace, plan_errors

__all__ = [
    "rms_norm",
    "RMSNormDescriptor",
    "RMSNormArgs",
    "RMSNormPlan",
    "RMSNormBackwardDescriptor",
    "RMSNormBackwardArgs",
    "RMSNormBackwardPlan",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def rms_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int] | int,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    residual: torch.Tensor | None = None,
    residual_dtype: torch.dtype | None = None,
    weight_offset: float = 0.0,
    casting: str = "torch",
):
    """Same result (and argument names) as ``torch.nn.functional.rms_norm``; differentiable w.r.t.
    ``input`` and ``weight`` (once: a gradient of the gradient raises NotImplementedError). A
    weight of another floating dtype than the op takes is converted first (see ``_kernel_weight``).

    The keyword-only options, and a per-head weight (shape ``(H, D)`` for ``[..., H, D]`` input
    normalized over ``D``), are :func:`baracuda_ops.rms_norm_fused`'s: with ``residual``,
    ``h = input + residual`` is normalized and ``(y, h)`` returned (the pre-norm residual stream,
    ``h`` in ``residual_dtype``); ``weight_offset`` scales by ``weight + weight_offset`` (Gemma's
    ``1 + w``); ``casting`` is ``"torch"`` (this function), ``"llama"`` or ``"gemma"`` (Hugging
    Face's LlamaRMSNorm / GemmaRMSNorm arithmetic)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    try:
        if (residual is not None or residual_dtype is not None or weight_offset != 0.0 or casting != "torch"
                or (weight is not None and weight.dim() != len(normalized_shape))):
            from .rms_norm_fused import rms_norm_fused  # that module imports this one

            return rms_norm_fused(input, normalized_shape, weight, eps, residual=residual,
                                  residual_dtype=residual_dtype, weight_offset=weight_offset, casting=casting)
        if weight is not None and weight.dtype != input.dtype:
            weight = _kernel_weight(input, weight)
        return _RMSNorm(input, normalized_shape, weight, eps)[0]
    except (TypeError, RuntimeError, AttributeError) as e:
        raise_typed_error("rms_norm", e, locals(), ("normalized_shape",), ("input", "weight"))


def _kernel_weight(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A weight whose dtype differs from x's, in a dtype the op takes (x's, or float32 with a half x), for the other
    floating combinations ``torch.nn.functional.rms_norm`` accepts with a warning (e.g. a
    bfloat16 weight on a float32 input). PyTorch computes ``x * rstd * w`` in the promoted
    type of the computation type (float32; float64 for float64 x) and the weight's, then
    casts to x's dtype; where that promoted type is the computation type, converting the
    weight to it is exact and gives the same result (the conversion is differentiable, so
    dW comes back in the weight's dtype). A float64 weight on a non-float64 input would
    need float64 products: not supported (the op's dtype error)."""
    if x.dtype not in _FLOATS or weight.dtype not in _FLOATS:
        return weight  # the op's own dtypes, or its dtype error
    computation = _acc_dtype(x.dtype)
    if weight.dtype == computation or (weight.dtype == torch.float64 and computation != torch.float64):
        return weight  # a float32 weight on a half input, or the op's dtype error
    return weight.to(computation)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_dims(op: str, input_shape: Sequence, normalized_shape: Sequence) -> None:
    """What the fakes can check without guarding on symbolic sizes."""
    if len(normalized_shape) == 0:
        raise BaracudaValueError(f"baracuda::{op}: normalized_shape must have at least 1 dim, got []")
    if len(normalized_shape) > len(input_shape):
        raise BaracudaValueError(
            f"baracuda::{op}: normalized_shape {list(normalized_shape)} does not match the trailing dims of "
            f"input shape {list(input_shape)}"
        )


def _rstd_shape(input_shape: Sequence, normalized_dims: int) -> list:
    return list(input_shape[: len(input_shape) - normalized_dims]) + [1] * normalized_dims


@torch.library.register_fake("baracuda::rms_norm")
def _rms_norm_fake(x, normalized_shape, weight=None, eps=None):
    check_same_device("rms_norm", locals())
    _check_dims("rms_norm", x.shape, normalized_shape)
    rstd = x.new_empty(_rstd_shape(x.shape, len(normalized_shape)), dtype=_acc_dtype(x.dtype))
    return torch.empty_like(x, memory_format=torch.contiguous_format), rstd


@torch.library.register_fake("baracuda::rms_norm.out")
def _rms_norm_out_fake(x, normalized_shape, weight=None, eps=None, *, output, rstd):
    check_same_device("rms_norm", locals())
    return None


@torch.library.register_fake("baracuda::rms_norm_backward")
def _rms_norm_backward_fake(grad_out, x, normalized_shape, rstd, weight, output_mask):
    check_same_device("rms_norm_backward", locals())
    _check_dims("rms_norm_backward", x.shape, normalized_shape)
    grad_input = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else None
    grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format) if (
        output_mask[1] and weight is not None) else None
    return grad_input, grad_weight


@torch.library.register_fake("baracuda::rms_norm_backward.out")
def _rms_norm_backward_out_fake(grad_out, x, normalized_shape, rstd, weight, output_mask, *, grad_input,
                                grad_weight, workspace):
    check_same_device("rms_norm_backward", locals())
    return None


def _rms_norm_setup_context(ctx, inputs, output):
    x, normalized_shape, weight, _ = inputs
    _, rstd = output
    ctx.normalized_shape = normalized_shape
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)
    ctx.save_for_forward(x, weight, rstd)


def _rms_norm_autograd(ctx, grad_out, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2]]
    if not any(mask):
        return None, None, None, None
    grad_input, grad_weight = _RMSNormBackward(grad_out, x, ctx.normalized_shape, rstd, weight, mask)
    return grad_input, None, grad_weight, None


def _rms_norm_jvp(ctx, x_tangent, _normalized_shape, weight_tangent, _eps):
    # y = x * rstd * w: dy = (rstd * dx - x * rstd^3 * mean(x * dx)) * w + x * rstd * dw, the
    # first term rms_norm_backward's dx for grad dx and no weight; rstd takes no tangent.
    x, weight, rstd = ctx.saved_tensors
    tangent = None
    if x_tangent is not None:
        tangent, _ = _RMSNormBackward(x_tangent, x, ctx.normalized_shape, rstd, None, [True, False])
        if weight is not None:
            tangent = tangent * weight
    if weight_tangent is not None:
        term = x * rstd * weight_tangent
        tangent = term if tangent is None else tangent + term
    return tangent.to(x.dtype), None


# torch.autocast: where the installed PyTorch autocasts aten::rms_norm on CUDA (its float32
# list, after 2.11: floating inputs, float64 excepted, cast to float32, so F.rms_norm returns
# float32 there), ours does the same. PyTorch 2.11 and CPU autocast leave both alone (so on
# the device machines, 2.11, it is off; the test compares with F.rms_norm either way).
if torch.amp.is_autocast_available("cuda") and torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::rms_norm", "AutocastCUDA"):
    torch.library.register_autocast("baracuda::rms_norm", "cuda", torch.float32)

_RMSNorm = differentiable_op("rms_norm", _rms_norm_autograd, _rms_norm_setup_context, _rms_norm_jvp)
_RMSNormBackward = op_without_backward(
    "rms_norm_backward", "baracuda::rms_norm_backward: double backward (the gradient of rms_norm's gradient) "
    "is not supported")


# --------------------------------------------------------------------------- vmap
#
# The samples become more rows of one call; a weight that differs per sample cannot be folded
# so, and runs once per sample.


@torch.library.register_vmap("baracuda::rms_norm")
def _rms_norm_vmap(info, in_dims, x, normalized_shape, weight=None, eps=None):
    in_dims = arg_dims(in_dims, 4)
    if in_dims[2] is not None or in_dims[0] is None:
        return per_sample(torch.ops.baracuda.rms_norm.default, info.batch_size, in_dims, x, normalized_shape,
                          weight, eps)
    _check_dims("rms_norm", sample_meta(x, in_dims[0]).shape, normalized_shape)
    return torch.ops.baracuda.rms_norm(x.movedim(in_dims[0], 0), normalized_shape, weight, eps), (0, 0)


@torch.library.register_vmap("baracuda::rms_norm_backward")
def _rms_norm_backward_vmap(info, in_dims, grad_out, x, normalized_shape, rstd, weight, output_mask):
    """dx from one call over the samples' rows; dW per sample, ``sum_rows dy * x * rstd`` in the
    computation type over each sample's rows by torch ops (one call cannot keep the samples'
    sums apart), equal to the op's dW within rounding."""
    in_dims = arg_dims(in_dims, 6)
    if in_dims[4] is not None:
        return per_sample(torch.ops.baracuda.rms_norm_backward.default, info.batch_size, in_dims, grad_out, x,
                          normalized_shape, rstd, weight, output_mask)
    _check_dims("rms_norm_backward", sample_meta(x, in_dims[1]).shape, normalized_shape)
    n = info.batch_size
    dy, x, rstd = (batch_first(t, in_dims[i], n) for t, i in ((grad_out, 0), (x, 1), (rstd, 3)))
    grad_input = grad_weight = None
    if output_mask[0]:
        grad_input, _ = torch.ops.baracuda.rms_norm_backward(dy, x, normalized_shape, rstd, weight, [True, False])
    if output_mask[1] and weight is not None:
        terms = dy.to(rstd.dtype) * x.to(rstd.dtype) * rstd
        rows = tuple(range(1, x.dim() - len(normalized_shape)))
        grad_weight = (terms.sum(dim=rows) if rows else terms).to(weight.dtype)
    return (grad_input, grad_weight), (None if grad_input is None else 0, None if grad_weight is None else 0)


# --------------------------------------------------------------------------- DTensor sharding
#
# Rows are independent: a Shard of a dim before the normalized ones passes through to the output
# and rstd (and, backward, to dx), the weight Replicate; dW sums over the rows, so with the rows
# sharded each rank's dW is its share: Partial(sum), which the engine reduces. A Shard inside the
# normalized dims would need each row's sum of squares across ranks: the rule refuses it (a
# NotImplementedError naming the placement) rather than gather the rows unasked. The rules take
# the row count of the normalized dims and the positions of the arguments, so that the rms_norm
# variants reuse them.


def row_norm_sharding(op: str, x, normalized_dims: int, args: int, rows_like: Sequence[int],
                      replicated: Sequence[int], outputs: Sequence[str]) -> list:
    """Strategies of a row-wise normalization op over ``x`` (a DTensorSpec) with ``normalized_dims``
    trailing dims: ``args`` arguments, those at ``rows_like`` (x, grad_out, rstd...) sharded like
    x, those at ``replicated`` (weights) Replicate, the rest None; ``outputs`` names each output's
    kind: ``"rows"`` (sharded like x), ``"weight"`` (a weight's gradient: Partial(sum) when the rows
    are sharded) or ``"none"`` (absent)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    first_normalized = x.ndim - normalized_dims
    for mesh_dim, p in enumerate(x.placements):
        if p.is_shard() and p.dim >= first_normalized:
            raise NotImplementedError(
                f"baracuda::{op}: input placement {p!r} on mesh dim {mesh_dim} shards normalized dim {p.dim} "
                f"(input of {x.ndim} dims, the last {normalized_dims} normalized); shard a dim before "
                f"{first_normalized}, or redistribute the input to Replicate on that mesh dim"
            )

    def strategy(rows, weight_grad):
        kinds = {"rows": rows, "weight": weight_grad, "none": None}
        ins = [rows if i in rows_like else Replicate() if i in replicated else None for i in range(args)]
        return [kinds[k] for k in outputs], ins

    return [strategy(Replicate(), Replicate())] + [strategy(Shard(d), Partial()) for d in range(first_normalized)]


def _register_sharding() -> None:
    @_dtensor.rule([torch.ops.baracuda.rms_norm.default])
    def _rms_norm_sharding(x, normalized_shape, weight=None, eps=None):
        return row_norm_sharding("rms_norm", x, len(normalized_shape), 4, [0], [2] if weight is not None else [],
                                 ["rows", "rows"])

    @_dtensor.rule([torch.ops.baracuda.rms_norm_backward.default])
    def _rms_norm_backward_sharding(grad_out, x, normalized_shape, rstd, weight, output_mask):
        outputs = ["rows" if output_mask[0] else "none",
                   "weight" if output_mask[1] and weight is not None else "none"]
        return row_norm_sharding("rms_norm_backward", x, len(normalized_shape), 6, [0, 1, 3],
                                 [4] if weight is not None else [], outputs)


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- Plan API
#
# problem encoding (for the kernel choice): forward [M, N], backward [M, N, grad_weight's element
# size, 0 when it computes no grad_weight], with N = prod(normalized_shape) and M = numel / N (the rows).


def _rows(op: str, input_shape: Sequence[int], normalized_shape: Sequence[int]) -> tuple[int, int]:
    _check_dims(op, input_shape, normalized_shape)
    k = len(normalized_shape)
    if tuple(input_shape[len(input_shape) - k:]) != tuple(normalized_shape):
        raise BaracudaValueError(
            f"baracuda::{op}: normalized_shape {list(normalized_shape)} does not match the trailing dims of "
            f"input shape {list(input_shape)}"
        )
    return math.prod(input_shape[: len(input_shape) - k]), math.prod(normalized_shape)


def _check_dtypes(op: str, dtype: torch.dtype, weight_dtype: torch.dtype | None) -> None:
    if dtype not in _FLOATS:
        raise InvalidProblemError(f"baracuda::{op}: input must be float16, bfloat16, float32 or float64, got {dtype}")
    if weight_dtype is not None and weight_dtype != dtype and not (
            weight_dtype == torch.float32 and dtype in (torch.float16, torch.bfloat16)):
        raise InvalidProblemError(f"baracuda::{op}: weight dtype {weight_dtype} is not supported with input dtype {dtype}")


class _RowShapes:
    """Shapes derived from a descriptor's input_shape, normalized_shape and weight fields."""

    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    dtype: torch.dtype
    has_weight: bool
    weight_dtype: torch.dtype | None

    @property
    def rstd_shape(self) -> tuple[int, ...]:
        return tuple(_rstd_shape(self.input_shape, len(self.normalized_shape)))

    @property
    def resolved_weight_dtype(self) -> torch.dtype | None:
        return (self.weight_dtype or self.dtype) if self.has_weight else None


@dataclass(frozen=True)
class RMSNormDescriptor(_RowShapes):
    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    dtype: torch.dtype
    has_weight: bool = True
    weight_dtype: torch.dtype | None = None  # None: the input dtype
    eps: float | None = None
    device: torch.device | str = "cpu"


@dataclass
class RMSNormArgs:
    input: torch.Tensor
    weight: torch.Tensor | None
    output: torch.Tensor
    rstd: torch.Tensor


class RMSNormPlan(Plan):
    """Writes ``rms_norm(input, normalized_shape, weight, eps)`` into ``args.output`` and its
    per-row ``rstd`` into ``args.rstd``."""

    op = "rms_norm"

    @classmethod
    def select(cls, desc: RMSNormDescriptor, pref: PlanPreference = PlanPreference()) -> "RMSNormPlan":
        with plan_errors():
            m, n = _rows("rms_norm", desc.input_shape, desc.normalized_shape)
        _check_dtypes("rms_norm", desc.dtype, desc.resolved_weight_dtype)
        if desc.eps is not None and not (isinstance(desc.eps, (int, float)) and math.isfinite(desc.eps)
                                         and desc.eps >= 0):
            raise InvalidProblemError(f"baracuda::rms_norm: eps must be None or a finite float >= 0, got {desc.eps!r}")
        return cls(desc, pref, [m, n])

    def can_implement(self, args: RMSNormArgs) -> None:
        d = self.desc
        self._check_tensor("input", args.input, d.input_shape, d.dtype)
        if d.has_weight:
            if args.weight is None:
                raise InvalidProblemError("baracuda::rms_norm: the descriptor has a weight but args.weight is None")
            self._check_tensor("weight", args.weight, d.normalized_shape, d.resolved_weight_dtype)
        elif args.weight is not None:
            raise InvalidProblemError("baracuda::rms_norm: the descriptor has no weight but args.weight is given")
        self._check_tensor("output", args.output, d.input_shape, d.dtype)
        self._check_tensor("rstd", args.rstd, d.rstd_shape, _acc_dtype(d.dtype))

    def run(self, args: RMSNormArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        with plan_errors():
            torch.ops.baracuda.rms_norm.out(args.input, list(self.desc.normalized_shape), args.weight, self.desc.eps,
                                            output=args.output, rstd=args.rstd)


@dataclass(frozen=True)
class RMSNormBackwardDescriptor(_RowShapes):
    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    dtype: torch.dtype
    has_weight: bool = True
    weight_dtype: torch.dtype | None = None  # None: the input dtype
    output_mask: tuple[bool, bool] = (True, True)
    device: torch.device | str = "cpu"

    @property
    def computes_grad_weight(self) -> bool:
        return bool(self.output_mask[1]) and self.has_weight


@dataclass
class RMSNormBackwardArgs:
    grad_out: torch.Tensor
    input: torch.Tensor
    rstd: torch.Tensor
    weight: torch.Tensor | None
    grad_input: torch.Tensor | None  # None when output_mask[0] is False
    grad_weight: torch.Tensor | None  # None when grad_weight is not computed


class RMSNormBackwardPlan(Plan):
    """Writes rms_norm's gradients into ``args.grad_input`` / ``args.grad_weight``; the dW
    partials live in the workspace (``workspace_size()`` bytes, 0 when the CUDA launch config's
    ``dw_sum`` is not 3: one row group, or decode rows' column CTAs, write dW itself)."""

    op = "rms_norm_backward"

    @classmethod
    def select(cls, desc: RMSNormBackwardDescriptor,
               pref: PlanPreference = PlanPreference()) -> "RMSNormBackwardPlan":
        with plan_errors():
            m, n = _rows("rms_norm_backward", desc.input_shape, desc.normalized_shape)
        _check_dtypes("rms_norm_backward", desc.dtype, desc.resolved_weight_dtype)
        dw_elem = desc.resolved_weight_dtype.itemsize if desc.computes_grad_weight else 0
        return cls(desc, pref, [m, n, dw_elem])

    def can_implement(self, args: RMSNormBackwardArgs) -> None:
        d = self.desc
        self._check_tensor("grad_out", args.grad_out, d.input_shape, d.dtype)
        self._check_tensor("input", args.input, d.input_shape, d.dtype)
        self._check_tensor("rstd", args.rstd, d.rstd_shape, _acc_dtype(d.dtype))
        if d.has_weight != (args.weight is not None):
            raise InvalidProblemError(
                f"baracuda::rms_norm_backward: the descriptor has_weight={d.has_weight} but args.weight is "
                f"{'None' if args.weight is None else 'given'}")
        if d.has_weight:
            self._check_tensor("weight", args.weight, d.normalized_shape, d.resolved_weight_dtype)
        if d.output_mask[0]:
            if args.grad_input is None:
                raise InvalidProblemError("baracuda::rms_norm_backward: output_mask[0] is set but args.grad_input is None")
            self._check_tensor("grad_input", args.grad_input, d.input_shape, d.dtype)
        if d.computes_grad_weight:
            if args.grad_weight is None:
                raise InvalidProblemError("baracuda::rms_norm_backward: grad_weight is computed but args.grad_weight is None")
            self._check_tensor("grad_weight", args.grad_weight, d.normalized_shape, d.resolved_weight_dtype)

    def run(self, args: RMSNormBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        buffer = self._workspace(workspace)
        unused = torch.empty(0, dtype=self.desc.dtype, device=self._device)
        with plan_errors():
            torch.ops.baracuda.rms_norm_backward.out(
                args.grad_out, args.input, list(self.desc.normalized_shape), args.rstd, args.weight,
                list(self.desc.output_mask),
                grad_input=args.grad_input if args.grad_input is not None else unused,
                grad_weight=args.grad_weight if args.grad_weight is not None else unused,
                workspace=buffer,
            )
