"""rms_norm_fused family: RMSNorm as LLMs use it, forward and backward in one op each.

The input is viewed as ``[M, N]`` rows, ``N = prod(normalized_shape)``. Per row, in float32
(float64 for float64 input)::

    h    = input + residual             (with a residual: the pre-norm block's residual stream,
                                         rounded to the residual's dtype and written once)
    rstd = 1 / sqrt(mean(h**2) + eps)   (of h as stored)
    y    = h * rstd * (weight + weight_offset)

* ``weight_offset``: Gemma's ``(1 + w)`` with a zero-initialised weight is ``weight_offset=1.0``;
  ``weight + weight_offset`` is formed in the computation type; the weight gradient is unchanged.
  It needs a weight.
* per-head weight: a weight of shape ``input.shape[-k:]`` with ``k > len(normalized_shape)``, e.g.
  ``(H, D)`` for an input ``[..., H, D]`` normalized over ``D`` (QK-norm): row ``i`` of ``N``
  elements uses weight row ``i mod H``; the weight gradient keeps ``(H, D)``.
* ``casting``: ``"torch"`` is ``torch.nn.functional.rms_norm`` (one rounding, at the end, to the
  input dtype); ``"gemma"`` computes everything in float32 and casts at the end (with
  ``weight_offset=1.0``: Hugging Face's ``GemmaRMSNorm``; the arithmetic is the one of "torch");
  ``"llama"`` is Hugging Face's ``LlamaRMSNorm``: x-hat is rounded to the input dtype, then
  multiplied by ``weight + weight_offset``, the output in PyTorch's promotion of the input and
  weight dtypes (float32 for a float32 weight on a half input).
* residual dtype: the residual's own (the input's, or float32 on a float16/bfloat16 input:
  the residual stream kept in float32); ``rms_norm_fused(..., residual_dtype=)`` converts the
  residual first. Without a residual the op's ``residual_out`` is an empty ``[0]`` tensor.

``rms_norm_quant`` (inference): ``y`` as above, in the output dtype, quantized to float8_e4m3fn,
``q = (y / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`` with a static per-tensor scale or a
dynamic one per row (``max|y| / 448``), in one pass over the rows.

Backward (``rms_norm_fused_backward``), with ``g = dy * (w + offset)``::

    dh = rstd * g - h * rstd**3 * mean(g * h) + d(residual_out)
    grad_input = dh (input dtype), grad_residual = dh (residual dtype), dw = sum_rows dy * x_hat

``output_mask`` = (grad_input, grad_residual, grad_weight); an output left out is None. When the
residual has the input's dtype the two gradients are one tensor, written once (the autograd
formula asks for grad_input only and returns it for both). dW: ordered per-chunk partials,
no atomics (deterministic). The llama rounding of x-hat counts as the identity in dh, as
autograd treats a dtype cast, and stays in dW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _dtensor
from .._autograd import differentiable_op, op_without_backward
from .._errors import BaracudaTypeError, BaracudaValueError
from .._plan import InvalidProblemError, Plan, PlanPreference, Workspace, plan_errors
from .._vmap import arg_dims, batch_first, per_sample, sample_meta
from .rms_norm import _FLOATS, _acc_dtype, _check_dims, _rstd_shape, row_norm_sharding
from .rms_norm import _kernel_weight as _plain_kernel_weight

__all__ = [
    "rms_norm_fused",
    "rms_norm_quant",
    "RMSNormFusedDescriptor",
    "RMSNormFusedArgs",
    "RMSNormFusedPlan",
    "RMSNormQuantDescriptor",
    "RMSNormQuantArgs",
    "RMSNormQuantPlan",
    "RMSNormFusedBackwardDescriptor",
    "RMSNormFusedBackwardArgs",
    "RMSNormFusedBackwardPlan",
]

_HALF = (torch.float16, torch.bfloat16)
_CASTINGS = ("torch", "llama", "gemma")


def rms_norm_fused(
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
    """RMSNorm of ``input`` (see the module docstring); with ``residual``, ``h = input + residual``
    normalized instead and ``(y, h)`` returned, ``h`` in ``residual_dtype`` (default: the
    residual's dtype). Differentiable w.r.t. ``input``, ``residual`` and ``weight``. A weight of a
    floating dtype the op does not take (e.g. bfloat16 on a float32 input) is converted exactly
    to the computation type first."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if residual_dtype is not None:
        if residual is None:
            raise BaracudaValueError("baracuda::rms_norm_fused: residual_dtype is given but residual is None")
        residual = residual.to(residual_dtype)
    y, h, _ = _RMSNormFused(input, residual, list(normalized_shape), _kernel_weight(input, weight), eps,
                            float(weight_offset), casting)
    return y if residual is None else (y, h)


def rms_norm_quant(
    input: torch.Tensor,
    normalized_shape: Sequence[int] | int,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    residual: torch.Tensor | None = None,
    residual_dtype: torch.dtype | None = None,
    weight_offset: float = 0.0,
    casting: str = "torch",
):
    """``rms_norm_fused``'s output quantized to float8_e4m3fn (inference: not differentiable):
    ``q = (y / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`` with ``y`` in the output dtype of
    ``rms_norm_fused``. ``scale``: a float32 tensor of one element (static, per tensor; finite and
    > 0, checked with a host read of its value), or None for a scale per row, ``max|y| / 448``
    in float32 (1 for a row of zeros). Returns ``(q, scale)`` (the per-row scales, shape of
    ``rstd``, or the given scale), and ``(q, scale, h)`` with a residual."""
    if out_dtype != torch.float8_e4m3fn:
        raise BaracudaTypeError(f"baracuda::rms_norm_quant: out_dtype must be torch.float8_e4m3fn, got {out_dtype}")
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if residual_dtype is not None:
        if residual is None:
            raise BaracudaValueError("baracuda::rms_norm_quant: residual_dtype is given but residual is None")
        residual = residual.to(residual_dtype)
    if (scale is not None and scale.device.type != "cpu" and scale.numel() == 1 and scale.dtype == torch.float32
            and not torch.compiler.is_compiling()):
        value = scale.item()  # the op checks a CPU scale itself; a device one would cost it a sync
        if not (math.isfinite(value) and value > 0):
            raise BaracudaValueError(f"baracuda::rms_norm_quant: scale must be finite and > 0, got {value:g}")
    q, h, row_scale = torch.ops.baracuda.rms_norm_quant(input, residual, list(normalized_shape),
                                                        _kernel_weight(input, weight), eps, float(weight_offset),
                                                        casting, scale)
    out = (q, row_scale if scale is None else scale)
    return out if residual is None else out + (h,)


def _kernel_weight(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor | None:
    """The weight in a dtype the op takes (rms_norm's rule, which every casting mode shares: the
    computation type is what each multiplies in, and its promotion with x is the same)."""
    return weight if weight is None or weight.dtype == x.dtype else _plain_kernel_weight(x, weight)


def _check_casting(op: str, casting: str) -> None:
    if casting not in _CASTINGS:
        raise BaracudaValueError(f'baracuda::{op}: casting must be "torch", "llama" or "gemma", got "{casting}"')


def _output_dtype(dtype: torch.dtype, weight_dtype: torch.dtype | None, casting: str) -> torch.dtype:
    if casting == "llama" and weight_dtype is not None:
        return torch.promote_types(dtype, weight_dtype)
    return dtype





def _forward_fake(op, x, residual, normalized_shape, weight, casting):
    _check_dims(op, x.shape, normalized_shape)
    _check_casting(op, casting)
    out_dtype = _output_dtype(x.dtype, None if weight is None else weight.dtype, casting)
    y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    h = torch.empty_like(residual, memory_format=torch.contiguous_format) if residual is not None else \
        x.new_empty([0])
    rstd = x.new_empty(_rstd_shape(x.shape, len(normalized_shape)), dtype=_acc_dtype(x.dtype))
    return y, h, rstd


@torch.library.register_fake("baracuda::rms_norm_fused")
def _rms_norm_fused_fake(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0, casting="torch"):
    return _forward_fake("rms_norm_fused", x, residual, normalized_shape, weight, casting)


@torch.library.register_fake("baracuda::rms_norm_fused.out")
def _rms_norm_fused_out_fake(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                             casting="torch", *, output, residual_out, rstd):
    return None


@torch.library.register_fake("baracuda::rms_norm_quant")
def _rms_norm_quant_fake(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0, casting="torch",
                         scale=None):
    _, h, rstd = _forward_fake("rms_norm_quant", x, residual, normalized_shape, weight, casting)
    q = torch.empty_like(x, dtype=torch.float8_e4m3fn, memory_format=torch.contiguous_format)
    row_scale = x.new_empty([0], dtype=torch.float32) if scale is not None else rstd.to(torch.float32)
    return q, h, row_scale


@torch.library.register_fake("baracuda::rms_norm_quant.out")
def _rms_norm_quant_out_fake(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                             casting="torch", scale=None, *, output, residual_out, scale_out):
    return None


@torch.library.register_fake("baracuda::rms_norm_fused_backward")
def _rms_norm_fused_backward_fake(grad_out, grad_residual_out, h, normalized_shape, rstd, weight, weight_offset,
                                  casting, input_dtype, output_mask):
    _check_dims("rms_norm_fused_backward", h.shape, normalized_shape)
    _check_casting("rms_norm_fused_backward", casting)
    like = dict(memory_format=torch.contiguous_format)
    grad_input = torch.empty_like(h, dtype=input_dtype, **like) if output_mask[0] else None
    grad_residual = torch.empty_like(h, **like) if output_mask[1] else None
    grad_weight = torch.empty_like(weight, **like) if output_mask[2] and weight is not None else None
    return grad_input, grad_residual, grad_weight


@torch.library.register_fake("baracuda::rms_norm_fused_backward.out")
def _rms_norm_fused_backward_out_fake(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                      weight_offset, casting, input_dtype, output_mask, *, grad_input, grad_residual,
                                      grad_weight, workspace):
    return None


def _setup_context(ctx, inputs, output):
    x, residual, normalized_shape, weight, _eps, weight_offset, casting = inputs
    y, h, rstd = output
    ctx.normalized_shape = normalized_shape
    ctx.weight_offset = weight_offset
    ctx.casting = casting
    ctx.input_dtype = x.dtype
    ctx.output_dtype = y.dtype
    ctx.has_residual = residual is not None
    ctx.same_dtype = residual is not None and residual.dtype == x.dtype
    # (one call: each call replaces the set marked before)
    ctx.mark_non_differentiable(*((rstd,) if residual is not None else (rstd, h)))
    ctx.save_for_backward(h if residual is not None else x, weight, rstd)
    ctx.save_for_forward(h if residual is not None else x, weight, rstd)


def _backward(ctx, grad_y, grad_h, _grad_rstd):
    h, weight, rstd = ctx.saved_tensors
    # (needs_input_grad covers the arguments given: trailing ones at their defaults are dropped)
    need_x, need_r, _, need_w = (tuple(ctx.needs_input_grad) + (False,) * 4)[:4]
    # one tensor for both gradients when the residual has the input's dtype
    mask = [need_x or (ctx.same_dtype and need_r), ctx.has_residual and not ctx.same_dtype and need_r,
            weight is not None and need_w]
    if not any(mask):
        return None, None, None, None, None, None, None
    if grad_y is None:
        grad_y = torch.zeros(h.shape, dtype=ctx.output_dtype, device=h.device)
    grad_input, grad_residual, grad_weight = _RMSNormFusedBackward(
        grad_y, grad_h if ctx.has_residual else None, h, ctx.normalized_shape, rstd, weight, ctx.weight_offset,
        ctx.casting, ctx.input_dtype, mask)
    if ctx.same_dtype:
        grad_residual = grad_input
    return (grad_input if need_x else None, grad_residual if need_r else None, None, grad_weight, None, None, None)


def _jvp(ctx, x_tangent, residual_tangent, _normalized_shape, weight_tangent, _eps, _weight_offset, _casting):
    # h = x + r, y = x_hat * (w + offset) with x_hat = h * rstd: dh = dx + dr, dy = J(dh) * (w + offset)
    # + x_hat * dw, J(dh) = rstd * dh - x_hat * rstd * mean(x_hat * dh) (the backward op's dx for
    # grad dh, no weight: J is symmetric). The casts of the forward (h to its dtype, llama's x_hat
    # to the input's) count as the identity, as in the backward; rstd takes no tangent.
    h, weight, rstd = ctx.saved_tensors
    acc = torch.promote_types(h.dtype, torch.float32)  # the computation type: float32, float64 for float64
    dh = x_tangent if residual_tangent is None else residual_tangent if x_tangent is None else (
        x_tangent.to(h.dtype) + residual_tangent.to(h.dtype))
    y_tangent = None
    if dh is not None:
        y_tangent = _RMSNormFusedBackward(dh.to(h.dtype), None, h, ctx.normalized_shape, rstd, None, 0.0, "torch",
                                          h.dtype, [True, False, False])[0].to(acc)
        if weight is not None:
            y_tangent = y_tangent * (weight.to(acc) + ctx.weight_offset)
    if weight_tangent is not None:
        term = h.to(acc) * rstd.to(acc) * weight_tangent.to(acc)
        y_tangent = term if y_tangent is None else y_tangent + term
    h_tangent = dh.to(h.dtype) if ctx.has_residual and dh is not None else None
    return (None if y_tangent is None else y_tangent.to(ctx.output_dtype)), h_tangent, None


_DOUBLE_BACKWARD = ("baracuda::rms_norm_fused_backward: double backward (the gradient of rms_norm_fused's "
                    "gradient) is not supported")


# The eager gradient is the C++ autograd kernel (csrc/autograd/rms_norm_fused.cpp); these
# Functions serve torch.func and forward-mode AD (baracuda_ops/_autograd.py).
_RMSNormFused = differentiable_op("rms_norm_fused", _backward, _setup_context, _jvp)
_RMSNormFusedBackward = op_without_backward("rms_norm_fused_backward", _DOUBLE_BACKWARD)


# --------------------------------------------------------------------------- DTensor sharding
#
# rms_norm's rules (rows are independent): a Shard of a dim before the normalized ones passes
# through to y, residual_out (h), rstd and the per-row scales, and backward to both input
# gradients; the residual and the gradients of y and h are sharded like the input; the weight
# Replicate and dW Partial(sum). A per-head weight (shape input.shape[-k:], more dims than the
# normalized ones) covers dims before the normalized ones: a Shard of one of those (the heads,
# tensor parallel) takes the weight rows of its heads, Shard of the weight's matching dim, and
# dW comes out sharded alike (each rank owns its heads' rows, nothing to sum). The empty
# outputs (residual_out without a residual, the row scales with a static scale) are Replicate,
# as is a static scale. A Shard inside the normalized dims is refused as for rms_norm.


def _fused_sharding(op: str, x, normalized_dims: int, args: int, rows_like: Sequence[int], weight_arg: int,
                    weight, outputs: Sequence[str], replicated: Sequence[int] = (), empty: Sequence[int] = ()) -> list:
    """``row_norm_sharding`` with a per-head weight at ``weight_arg`` and the outputs at ``empty``
    (empty tensors) Replicate; ``replicated`` are further Replicate arguments."""
    from torch.distributed.tensor import Replicate, Shard

    weights = [weight_arg] if weight is not None else []
    kinds = ["none" if i in empty else kind for i, kind in enumerate(outputs)]
    strategies = row_norm_sharding(op, x, normalized_dims, args, rows_like, [*weights, *replicated], kinds)
    first_weight_dim = x.ndim - (weight.ndim if weight is not None else 0)
    result = []
    for outs, ins in strategies:
        outs = [Replicate() if i in empty else p for i, p in enumerate(outs)]
        rows = ins[rows_like[0]]
        if weight is not None and rows.is_shard() and rows.dim >= first_weight_dim:
            heads = Shard(rows.dim - first_weight_dim)
            ins[weight_arg] = heads
            outs = [heads if kind == "weight" else p for kind, p in zip(outputs, outs)]
        result.append((outs, ins))
    return result


def _register_sharding() -> None:
    @_dtensor.rule([torch.ops.baracuda.rms_norm_fused.default])
    def _rms_norm_fused_sharding(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                                 casting="torch"):
        with_residual = residual is not None
        return _fused_sharding("rms_norm_fused", x, len(normalized_shape), 7, [0, 1] if with_residual else [0], 3,
                               weight, ["rows", "rows", "rows"], empty=[] if with_residual else [1])

    @_dtensor.rule([torch.ops.baracuda.rms_norm_quant.default])
    def _rms_norm_quant_sharding(x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                                 casting="torch", scale=None):
        with_residual, static = residual is not None, scale is not None
        return _fused_sharding("rms_norm_quant", x, len(normalized_shape), 8, [0, 1] if with_residual else [0], 3,
                               weight, ["rows", "rows", "rows"], replicated=[7] if static else [],
                               empty=([] if with_residual else [1]) + ([2] if static else []))

    @_dtensor.rule([torch.ops.baracuda.rms_norm_fused_backward.default])
    def _rms_norm_fused_backward_sharding(grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                          weight_offset, casting, input_dtype, output_mask):
        outputs = ["rows" if output_mask[0] else "none", "rows" if output_mask[1] else "none",
                   "weight" if output_mask[2] and weight is not None else "none"]
        rows_like = [2, 0, 4] + ([1] if grad_residual_out is not None else [])
        return _fused_sharding("rms_norm_fused_backward", h, len(normalized_shape), 10, rows_like, 5, weight,
                               outputs)


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- vmap
#
# The samples become more rows of one call (the normalized and per-head dims are trailing, so
# they stay put); a weight that differs per sample cannot be folded so, and runs once per sample.


@torch.library.register_vmap("baracuda::rms_norm_fused")
def _rms_norm_fused_vmap(info, in_dims, x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                         casting="torch"):
    in_dims = arg_dims(in_dims, 7)
    op = torch.ops.baracuda.rms_norm_fused.default
    if in_dims[3] is not None or (in_dims[0] is None and in_dims[1] is None):
        return per_sample(op, info.batch_size, in_dims, x, residual, normalized_shape, weight, eps, weight_offset,
                          casting)
    _check_dims("rms_norm_fused", sample_meta(x, in_dims[0]).shape, normalized_shape)
    n = info.batch_size
    x = batch_first(x, in_dims[0], n)
    residual = batch_first(residual, in_dims[1], n)
    y, h, rstd = op(x, residual, normalized_shape, weight, eps, weight_offset, casting)
    if residual is None:  # the empty residual_out, one per sample
        h = h.expand(n, *h.shape)
    return (y, h, rstd), (0, 0, 0)


@torch.library.register_vmap("baracuda::rms_norm_quant")
def _rms_norm_quant_vmap(info, in_dims, x, residual, normalized_shape, weight=None, eps=None, weight_offset=0.0,
                         casting="torch", scale=None):
    in_dims = arg_dims(in_dims, 8)
    op = torch.ops.baracuda.rms_norm_quant.default
    if in_dims[3] is not None or in_dims[7] is not None or (in_dims[0] is None and in_dims[1] is None):
        return per_sample(op, info.batch_size, in_dims, x, residual, normalized_shape, weight, eps, weight_offset,
                          casting, scale)
    _check_dims("rms_norm_quant", sample_meta(x, in_dims[0]).shape, normalized_shape)
    n = info.batch_size
    x = batch_first(x, in_dims[0], n)
    residual = batch_first(residual, in_dims[1], n)
    q, h, row_scale = op(x, residual, normalized_shape, weight, eps, weight_offset, casting, scale)
    if residual is None:  # the empty residual_out, one per sample
        h = h.expand(n, *h.shape)
    if scale is not None:  # the empty scale_out, one per sample
        row_scale = row_scale.expand(n, *row_scale.shape)
    return (q, h, row_scale), (0, 0, 0)


@torch.library.register_vmap("baracuda::rms_norm_fused_backward")
def _rms_norm_fused_backward_vmap(info, in_dims, grad_out, grad_residual_out, h, normalized_shape, rstd, weight,
                                  weight_offset, casting, input_dtype, output_mask):
    """grad_input and grad_residual from one call over the samples' rows; dW per sample,
    ``sum_rows dy * x_hat`` in the computation type over each sample's rows by torch ops (one
    call cannot keep the samples' sums apart), equal to the op's dW within rounding."""
    in_dims = arg_dims(in_dims, 10)
    op = torch.ops.baracuda.rms_norm_fused_backward.default
    if in_dims[5] is not None:
        return per_sample(op, info.batch_size, in_dims, grad_out, grad_residual_out, h, normalized_shape, rstd,
                          weight, weight_offset, casting, input_dtype, output_mask)
    _check_dims("rms_norm_fused_backward", sample_meta(h, in_dims[2]).shape, normalized_shape)
    n = info.batch_size
    dy, dres, h, rstd = (batch_first(t, in_dims[i], n) for t, i in ((grad_out, 0), (grad_residual_out, 1), (h, 2),
                                                                    (rstd, 4)))
    grad_input = grad_residual = grad_weight = None
    if output_mask[0] or output_mask[1]:
        grad_input, grad_residual, _ = op(dy, dres, h, normalized_shape, rstd, weight, weight_offset, casting,
                                          input_dtype, [output_mask[0], output_mask[1], False])
    if output_mask[2] and weight is not None:
        xhat = h.to(rstd.dtype) * rstd
        if casting == "llama":
            xhat = xhat.to(input_dtype).to(rstd.dtype)
        terms = dy.to(rstd.dtype) * xhat
        rows = tuple(range(1, h.dim() - weight.dim()))
        grad_weight = (terms.sum(dim=rows) if rows else terms).to(weight.dtype)
    outs = (grad_input, grad_residual, grad_weight)
    return outs, tuple(None if o is None else 0 for o in outs)


# --------------------------------------------------------------------------- Plan API
#
# problem encoding (for the kernel choice): forward [M, N, H, 1 when the residual (if any) is of
# the input's dtype, else 0], backward [M, N, H, grad_weight's element size, 0 when it computes no
# grad_weight; 1 when grad_out and h are of the input's dtype, else 0]: M rows of N =
# prod(normalized_shape), H weight rows (1 unless the weight is per head).


def _problem(op: str, input_shape: Sequence[int], normalized_shape: Sequence[int],
             weight_shape: Sequence[int] | None) -> tuple[int, int, int]:
    _check_dims(op, input_shape, normalized_shape)
    k = len(normalized_shape)
    if tuple(input_shape[len(input_shape) - k:]) != tuple(normalized_shape):
        raise BaracudaValueError(
            f"baracuda::{op}: normalized_shape {list(normalized_shape)} does not match the trailing dims of "
            f"input shape {list(input_shape)}")
    m, n = math.prod(input_shape[: len(input_shape) - k]), math.prod(normalized_shape)
    heads = 1
    if weight_shape is not None and tuple(weight_shape) != tuple(normalized_shape):
        w = len(weight_shape)
        if not (k < w <= len(input_shape) and tuple(input_shape[len(input_shape) - w:]) == tuple(weight_shape)):
            raise BaracudaValueError(
                f"baracuda::{op}: weight shape {list(weight_shape)} must be normalized_shape {list(normalized_shape)} "
                f"or, per head, the input's trailing dims (input shape {list(input_shape)})")
        heads = math.prod(weight_shape[: w - k])
    return m, n, heads


def _check_dtype_pair(op: str, name: str, dtype: torch.dtype, other: torch.dtype | None) -> None:
    if other is not None and other != dtype and not (other == torch.float32 and dtype in _HALF):
        raise InvalidProblemError(f"baracuda::{op}: {name} dtype {other} is not supported with input dtype {dtype}")


@dataclass(frozen=True)
class RMSNormFusedDescriptor:
    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    dtype: torch.dtype
    has_weight: bool = True
    weight_shape: tuple[int, ...] | None = None  # None: normalized_shape; else per head
    weight_dtype: torch.dtype | None = None  # None: the input dtype
    residual_dtype: torch.dtype | None = None  # None: no residual
    eps: float | None = None
    weight_offset: float = 0.0
    casting: str = "torch"
    device: torch.device | str = "cpu"

    @property
    def resolved_weight_shape(self) -> tuple[int, ...] | None:
        return (self.weight_shape or self.normalized_shape) if self.has_weight else None

    @property
    def resolved_weight_dtype(self) -> torch.dtype | None:
        return (self.weight_dtype or self.dtype) if self.has_weight else None

    @property
    def output_dtype(self) -> torch.dtype:
        return _output_dtype(self.dtype, self.resolved_weight_dtype, self.casting)

    @property
    def rstd_shape(self) -> tuple[int, ...]:
        return tuple(_rstd_shape(self.input_shape, len(self.normalized_shape)))


def _select_problem(op: str, d) -> list[int]:
    with plan_errors():
        _check_casting(op, d.casting)
        m, n, heads = _problem(op, d.input_shape, d.normalized_shape, d.resolved_weight_shape)
    if d.dtype not in _FLOATS:
        raise InvalidProblemError(f"baracuda::{op}: input must be float16, bfloat16, float32 or float64, got {d.dtype}")
    _check_dtype_pair(op, "weight", d.dtype, d.resolved_weight_dtype)
    _check_dtype_pair(op, "residual", d.dtype, d.residual_dtype)
    if not math.isfinite(d.weight_offset) or (d.weight_offset != 0.0 and not d.has_weight):
        raise InvalidProblemError(f"baracuda::{op}: weight_offset={d.weight_offset} needs a weight and a finite value")
    return [m, n, heads]


def _forward_problem(op: str, d) -> list[int]:
    return _select_problem(op, d) + [int(d.residual_dtype in (None, d.dtype))]


@dataclass
class RMSNormFusedArgs:
    input: torch.Tensor
    residual: torch.Tensor | None
    weight: torch.Tensor | None
    output: torch.Tensor
    residual_out: torch.Tensor | None  # None without a residual
    rstd: torch.Tensor


class RMSNormFusedPlan(Plan):
    """Writes ``rms_norm_fused``'s y into ``args.output``, h into ``args.residual_out`` (with a
    residual) and the per-row ``rstd`` into ``args.rstd``."""

    op = "rms_norm_fused"

    @classmethod
    def select(cls, desc: RMSNormFusedDescriptor, pref: PlanPreference = PlanPreference()) -> "RMSNormFusedPlan":
        return cls(desc, pref, _forward_problem(cls.op, desc))

    def _check_optional(self, name: str, t: torch.Tensor | None, shape, dtype: torch.dtype | None) -> None:
        """A tensor the descriptor has exactly when ``dtype`` is not None."""
        if (dtype is None) != (t is None):
            raise InvalidProblemError(
                f"baracuda::{self.op}: the descriptor {'has no' if dtype is None else 'has a'} {name} but "
                f"args.{name} is {'given' if t is not None else 'None'}")
        if t is not None:
            self._check_tensor(name, t, shape, dtype)

    def _check_forward(self, args) -> None:
        """input, weight, residual and residual_out as the descriptor says."""
        d = self.desc
        self._check_tensor("input", args.input, d.input_shape, d.dtype)
        self._check_optional("weight", args.weight, d.resolved_weight_shape, d.resolved_weight_dtype)
        self._check_optional("residual", args.residual, d.input_shape, d.residual_dtype)
        self._check_optional("residual_out", args.residual_out, d.input_shape, d.residual_dtype)

    def can_implement(self, args: RMSNormFusedArgs) -> None:
        d = self.desc
        self._check_forward(args)
        self._check_tensor("output", args.output, d.input_shape, d.output_dtype)
        self._check_tensor("rstd", args.rstd, d.rstd_shape, _acc_dtype(d.dtype))

    def run(self, args: RMSNormFusedArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        d = self.desc
        residual_out = args.residual_out if args.residual_out is not None else \
            torch.empty(0, dtype=d.dtype, device=self._device)
        with plan_errors():
            torch.ops.baracuda.rms_norm_fused.out(args.input, args.residual, list(d.normalized_shape), args.weight,
                                                  d.eps, d.weight_offset, d.casting, output=args.output,
                                                  residual_out=residual_out, rstd=args.rstd)


@dataclass(frozen=True)
class RMSNormQuantDescriptor(RMSNormFusedDescriptor):
    """The forward's descriptor; ``static_scale``: one float32 scale given by the caller, else a
    scale per row (max|y| / 448) written to ``scale_out``."""

    static_scale: bool = False


@dataclass
class RMSNormQuantArgs:
    input: torch.Tensor
    residual: torch.Tensor | None
    weight: torch.Tensor | None
    scale: torch.Tensor | None  # a float32 tensor of one element, with static_scale; else None
    output: torch.Tensor  # float8_e4m3fn, the input's shape
    residual_out: torch.Tensor | None  # None without a residual
    scale_out: torch.Tensor | None  # float32, the rstd shape: a scale per row; None with static_scale


class RMSNormQuantPlan(RMSNormFusedPlan):
    """Writes ``rms_norm_quant``'s float8_e4m3fn y / scale (saturated to +-448) into
    ``args.output``, h into ``args.residual_out`` (with a residual) and, without a static scale,
    each row's scale into ``args.scale_out``."""

    op = "rms_norm_quant"

    @classmethod
    def select(cls, desc: RMSNormQuantDescriptor, pref: PlanPreference = PlanPreference()) -> "RMSNormQuantPlan":
        return cls(desc, pref, _forward_problem(cls.op, desc))

    def can_implement(self, args: RMSNormQuantArgs) -> None:
        d = self.desc
        self._check_forward(args)
        self._check_optional("scale", args.scale, (1,), torch.float32 if d.static_scale else None)
        self._check_tensor("output", args.output, d.input_shape, torch.float8_e4m3fn)
        self._check_optional("scale_out", args.scale_out, d.rstd_shape, None if d.static_scale else torch.float32)

    def run(self, args: RMSNormQuantArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        d = self.desc
        unused = torch.empty(0, dtype=d.dtype, device=self._device)
        with plan_errors():
            torch.ops.baracuda.rms_norm_quant.out(
                args.input, args.residual, list(d.normalized_shape), args.weight, d.eps, d.weight_offset, d.casting,
                args.scale, output=args.output,
                residual_out=args.residual_out if args.residual_out is not None else unused,
                scale_out=args.scale_out if args.scale_out is not None else unused.float())


@dataclass(frozen=True)
class RMSNormFusedBackwardDescriptor(RMSNormFusedDescriptor):
    """The forward's descriptor plus which gradients to compute (grad_input, grad_residual,
    grad_weight) and whether a gradient of residual_out comes in."""

    output_mask: tuple[bool, bool, bool] = (True, False, True)
    has_grad_residual_out: bool = False

    @property
    def h_dtype(self) -> torch.dtype:
        return self.residual_dtype or self.dtype

    @property
    def computes_grad_weight(self) -> bool:
        return bool(self.output_mask[2]) and self.has_weight


@dataclass
class RMSNormFusedBackwardArgs:
    grad_out: torch.Tensor
    grad_residual_out: torch.Tensor | None
    h: torch.Tensor  # residual_out, or the input without a residual
    rstd: torch.Tensor
    weight: torch.Tensor | None
    grad_input: torch.Tensor | None  # None when output_mask[0] is False
    grad_residual: torch.Tensor | None  # None when output_mask[1] is False
    grad_weight: torch.Tensor | None  # None when grad_weight is not computed


class RMSNormFusedBackwardPlan(Plan):
    """Writes rms_norm_fused's gradients into ``args``; the dW partials live in the workspace
    (``workspace_size()`` bytes; none on CPU)."""

    op = "rms_norm_fused_backward"

    @classmethod
    def select(cls, desc: RMSNormFusedBackwardDescriptor,
               pref: PlanPreference = PlanPreference()) -> "RMSNormFusedBackwardPlan":
        problem = _select_problem(cls.op, desc)
        dw_elem = desc.resolved_weight_dtype.itemsize if desc.computes_grad_weight else 0
        streams_in_dtype = desc.h_dtype == desc.dtype and desc.output_dtype == desc.dtype
        return cls(desc, pref, problem + [dw_elem, int(streams_in_dtype)])

    def can_implement(self, args: RMSNormFusedBackwardArgs) -> None:
        d = self.desc
        shape = d.input_shape
        self._check_tensor("grad_out", args.grad_out, shape, d.output_dtype)
        self._check_tensor("h", args.h, shape, d.h_dtype)
        self._check_tensor("rstd", args.rstd, d.rstd_shape, _acc_dtype(d.dtype))
        expected = [("grad_residual_out", args.grad_residual_out, d.has_grad_residual_out, shape, d.h_dtype),
                    ("weight", args.weight, d.has_weight, d.resolved_weight_shape, d.resolved_weight_dtype),
                    ("grad_input", args.grad_input, d.output_mask[0], shape, d.dtype),
                    ("grad_residual", args.grad_residual, d.output_mask[1], shape, d.h_dtype),
                    ("grad_weight", args.grad_weight, d.computes_grad_weight, d.resolved_weight_shape,
                     d.resolved_weight_dtype)]
        for name, t, wanted, tshape, dtype in expected:
            if wanted != (t is not None):
                raise InvalidProblemError(
                    f"baracuda::{self.op}: args.{name} is {'None' if t is None else 'given'} but the descriptor "
                    f"{'asks for' if wanted else 'has no'} it")
            if t is not None:
                self._check_tensor(name, t, tshape, dtype)

    def run(self, args: RMSNormFusedBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        d = self.desc
        buffer = self._workspace(workspace)
        unused = torch.empty(0, dtype=d.dtype, device=self._device)
        with plan_errors():
            torch.ops.baracuda.rms_norm_fused_backward.out(
                args.grad_out, args.grad_residual_out, args.h, list(d.normalized_shape), args.rstd, args.weight,
                d.weight_offset, d.casting, d.dtype, list(d.output_mask),
                grad_input=args.grad_input if args.grad_input is not None else unused,
                grad_residual=args.grad_residual if args.grad_residual is not None else unused,
                grad_weight=args.grad_weight if args.grad_weight is not None else unused,
                workspace=buffer)
