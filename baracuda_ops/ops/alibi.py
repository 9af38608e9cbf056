"""alibi family: the ALiBi attention bias (Press et al., "Train Short, Test Long").

``alibi(scores, slopes)[b, h, i, j] = scores[b, h, i, j] + slopes[h] * (j - i)``
for ``scores`` ``[B, H, Q, K]`` and ``slopes`` ``[H]``. ``i`` is the query index
in ``[0, Q)`` and ``j`` the key index in ``[0, K)``, used as they are when
``Q != K`` (the same as ``scores + slopes.view(H, 1, 1) * (j - i)``); a caller
whose queries sit at the end of the keys (a decode step) can add the offset to
its own convention, the bias only shifts by ``slopes[h] * offset`` per head,
which softmax ignores.

Dtypes: ``scores`` float16/bfloat16/float32/float64, ``slopes`` float32 or the
scores dtype; math in float32 (float64 for float64); the result has the scores
dtype (PyTorch's formula would promote bf16 scores with float32 slopes to
float32; we keep the scores dtype). ``grad_slopes`` has the slopes dtype.

Backward: ``grad_scores = grad`` and ``grad_slopes[h] = sum_{b,i,j} grad * (j - i)``,
the latter reduced deterministically (per-(head, chunk) partials with a
fixed-order block sum, then an ordered combine). ``alibi_backward`` returns
``grad_scores`` as a fresh copy when asked (a custom op may not return an alias
of its input); the autograd formula asks only for ``grad_slopes``
(``output_mask=[False, True]``) and passes ``grad`` itself on as the scores
gradient, so training never copies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _dtensor
from .._autograd import differentiable_op
from .._vmap import arg_dims, batch_first, sample_meta
from .._errors import BaracudaTypeError, BaracudaValueError, check_same_device, raise_typed_error
from .._plan import InvalidProblemError, Plan, PlanPreference, Workspace, plan_errors

__all__ = [
    "alibi",
    "alibi_",
    "alibi_slopes",
    "alibi_bias",
    "AlibiDescriptor",
    "AlibiArgs",
    "AlibiPlan",
    "AlibiBackwardDescriptor",
    "AlibiBackwardArgs",
    "AlibiBackwardPlan",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def alibi(scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``scores + slopes[h] * (j - i)`` on ``[B, H, Q, K]`` scores, or on BLOOM's 3-D
    ``[B*H, Q, K]`` scores (row ``n`` is head ``n % H``, ``H = len(slopes)``: computed on the
    ``[B, H, Q, K]`` view); differentiable w.r.t. both."""
    try:
        if scores.dim() == 3:
            return _Alibi(_heads_view("alibi", scores, slopes), slopes).flatten(0, 1)
        return _Alibi(scores, slopes)
    except (TypeError, RuntimeError, AttributeError) as e:
        raise_typed_error("alibi", e, locals(), (), ("scores", "slopes"))


def alibi_(scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """In-place :func:`alibi` (4-D or 3-D scores): adds the bias to ``scores`` and returns it."""
    torch.ops.baracuda.alibi_inplace(_heads_view("alibi_inplace", scores, slopes) if scores.dim() == 3 else scores,
                                     slopes)
    return scores


def _heads_view(op: str, scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``[B*H, Q, K]`` scores as the ``[B, H, Q, K]`` view, ``H = len(slopes)``."""
    heads = slopes.shape[0] if slopes.dim() == 1 else -1
    if heads < 0 or (scores.shape[0] % heads != 0 if heads > 0 else scores.shape[0] != 0):
        raise BaracudaValueError(
            f"baracuda::{op}: 3-D scores [B*H, Q, K] {list(scores.shape)} need 1-D slopes whose length H "
            f"divides B*H, got slopes shape {list(slopes.shape)}"
        )
    return scores.view(scores.shape[0] // heads if heads else 0, heads, scores.shape[1], scores.shape[2])


def alibi_slopes(num_heads: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The standard ALiBi slopes for ``num_heads`` heads.

    For ``n`` a power of two, ``2^(-8 k / n)`` for ``k = 1..n``. Otherwise, with
    ``p`` the largest power of two below ``n``: the ``p`` slopes of ``p`` heads,
    then the odd-numbered slopes of ``2p`` heads, ``2^(-4 k / p)`` for
    ``k = 1, 3, 5, ...``, until there are ``n``. Computed in float64, rounded once.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise BaracudaValueError(f"baracuda.alibi_slopes: num_heads must be an int >= 1, got {num_heads!r}")
    p = 1 << (num_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * k / p) for k in range(1, p + 1)]
    slopes += [2.0 ** (-4.0 * k / p) for k in range(1, 2 * (num_heads - p), 2)]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype)


# --------------------------------------------------------------------------- the bias as a tensor
#
# The ALiBi bias as a tensor, for attention code that adds a bias or takes a mask
# (``scaled_dot_product_attention``'s ``attn_mask``, FlexAttention's ``score_mod`` reading
# it, Hugging Face's BLOOM/MPT/Falcon attention).
#
# ``alibi_bias(H, Q, K)[h, i, j] = slopes[h] * (j - (i + q_offset))``: query ``i`` sits at
# position ``i + q_offset`` of the keys (``q_offset = K - Q`` for the new queries of a decode
# step with a KV cache), and ``causal=True`` sets ``-inf`` where the key comes after the
# query (``j > i + q_offset``). With ``q_offset = 0`` it is the bias :func:`alibi` adds.
#
# How Hugging Face builds the same bias (transformers' ``modeling_bloom.py``,
# ``modeling_mpt.py``, ``modeling_falcon.py``); the slopes are the same sequence
# (:func:`alibi_slopes`: BLOOM and Falcon compute it by ``torch.pow`` in float32, MPT
# with ``alibi_bias_max=8``, the default, as ``1 / 2^(8 k / n)``; another
# ``alibi_bias_max`` needs its own ``slopes``):
#
# - BLOOM and Falcon (``build_alibi_tensor``) add ``slopes[h] * j`` as ``[B*H, 1, K]``,
#   where ``j`` counts the unpadded keys of each row (``cumsum`` of the attention mask).
#   Without padding that is ``alibi_bias(H, 1, K, layout="bqk").repeat(B, 1, 1)``.
# - MPT (``build_mpt_alibi_bias``) adds ``slopes[h] * (j - (K - 1))`` as ``[H, 1, K]``:
#   ``alibi_bias(H, 1, K, q_offset=K - 1, layout="bqk")``.
# - The full ``[H, Q, K]`` bias differs from each of those by ``slopes[h]`` times a number
#   that depends on the query row alone (``i + q_offset``, or ``i + q_offset - (K - 1)``),
#   which softmax removes: the attention weights are the same up to rounding (the scores
#   are smaller in magnitude here, so a low-precision dtype rounds them less). With left
#   padding BLOOM's positions shift per batch row by the row's padding, again a constant
#   per row over the keys it attends to.
#
# Gradients reach ``slopes`` when it requires them: ``sum_{i,j} grad[h, i, j] * (j - i - q_offset)``
# over the unmasked entries, a PyTorch broadcast-and-reduce (deterministic; a bias of
# ``[H, Q, K]`` is small next to the scores it is added to).

_LAYOUTS = ("bhqk", "bqk")


def alibi_bias(
    num_heads: int,
    q_len: int,
    k_len: int,
    *,
    slopes: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device=None,
    layout: str = "bhqk",
) -> torch.Tensor:
    """The ALiBi bias ``slopes[h] * (j - i - q_offset)``, ``-inf`` above the shifted diagonal
    when ``causal``.

    Args:
        num_heads: H.
        q_len, k_len: Q queries and K keys.
        slopes: ``[H]`` slopes (float tensor; may require grad); default ``alibi_slopes(H)``.
        causal: mask keys after each query (``j > i + q_offset``) with ``-inf``.
        q_offset: position of query 0 among the keys (``K - Q`` when decoding with a KV cache).
        dtype, device: of the result (default float32; the slopes' device when given).
        layout: ``"bhqk"``, ``[1, H, Q, K]`` (broadcasts against ``[B, H, Q, K]`` scores, e.g.
            SDPA's ``attn_mask``); ``"bqk"``, ``[H, Q, K]`` (``.repeat(B, 1, 1)`` gives BLOOM's
            ``[B*H, Q, K]`` batch of heads).

    Computed in float32 (float64 for a float64 result), rounded once to ``dtype``.
    """
    op = "baracuda.alibi_bias"
    for name, value, low in (("num_heads", num_heads, 1), ("q_len", q_len, 0), ("k_len", k_len, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BaracudaValueError(f"{op}: {name} must be an int >= {low}, got {value!r}")
    if isinstance(q_offset, bool) or not isinstance(q_offset, int):
        raise BaracudaValueError(f"{op}: q_offset must be an int, got {q_offset!r}")
    if layout not in _LAYOUTS:
        raise BaracudaValueError(f"{op}: layout must be one of {_LAYOUTS}, got {layout!r}")
    if not dtype.is_floating_point:
        raise BaracudaTypeError(f"{op}: dtype must be a floating type, got {dtype}")
    if slopes is None:
        slopes = alibi_slopes(num_heads, device=device)
    else:
        if slopes.shape != (num_heads,) or not slopes.dtype.is_floating_point:
            raise BaracudaValueError(
                f"{op}: slopes must be a float tensor of shape [{num_heads}], got {slopes.dtype} {list(slopes.shape)}"
            )
        want = None if device is None else torch.device(device)
        if want is not None and (slopes.device.type != want.type or
                                 (want.index is not None and slopes.device.index != want.index)):
            raise BaracudaValueError(f"{op}: slopes are on {slopes.device}, expected {device}")
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    device = slopes.device
    query_pos = torch.arange(q_len, device=device, dtype=math_dtype) + q_offset
    distance = torch.arange(k_len, device=device, dtype=math_dtype) - query_pos[:, None]  # [Q, K]: j - i - q_offset
    bias = slopes.to(math_dtype)[:, None, None] * distance
    if causal:
        bias = bias.masked_fill(distance > 0, float("-inf"))
    bias = bias.to(dtype)
    return bias.unsqueeze(0) if layout == "bhqk" else bias


# --------------------------------------------------------------------------- fakes


def _check_shapes(op: str, scores_name: str, scores, slopes) -> None:
    """The shape checks of check_alibi_args that need no guard on symbolic sizes."""
    if scores.dim() != 4:
        raise BaracudaValueError(f"baracuda::{op}: {scores_name} must be 4-D [B, H, Q, K], got shape {list(scores.shape)}")
    heads = scores.shape[1]
    bad = slopes.dim() != 1 or (isinstance(heads, int) and isinstance(slopes.shape[0], int) and slopes.shape[0] != heads)
    if bad:
        raise BaracudaValueError(
            f"baracuda::{op}: slopes shape {list(slopes.shape)} != expected [{heads}] "
            f"(one slope per head of {scores_name} {list(scores.shape)})"
        )


@torch.library.register_fake("baracuda::alibi")
def _alibi_fake(scores, slopes):
    check_same_device("alibi", locals())
    _check_shapes("alibi", "scores", scores, slopes)
    return scores.new_empty(scores.shape)


@torch.library.register_fake("baracuda::alibi.out")
def _alibi_out_fake(scores, slopes, *, out):
    check_same_device("alibi", locals())
    _check_shapes("alibi", "scores", scores, slopes)
    return None


@torch.library.register_fake("baracuda::alibi_inplace")
def _alibi_inplace_fake(scores, slopes):
    check_same_device("alibi_inplace", locals())
    _check_shapes("alibi_inplace", "scores", scores, slopes)
    return None


@torch.library.register_fake("baracuda::alibi_backward")
def _alibi_backward_fake(grad, slopes, output_mask):
    check_same_device("alibi_backward", locals())
    _check_shapes("alibi_backward", "grad", grad, slopes)
    grad_scores = grad.new_empty(grad.shape) if output_mask[0] else None
    grad_slopes = slopes.new_empty(slopes.shape) if output_mask[1] else None
    return grad_scores, grad_slopes


@torch.library.register_fake("baracuda::alibi_backward.out")
def _alibi_backward_out_fake(grad, slopes, output_mask, *, grad_scores, grad_slopes, workspace):
    check_same_device("alibi_backward", locals())
    _check_shapes("alibi_backward", "grad", grad, slopes)
    return None


# --------------------------------------------------------------------------- autograd


def _alibi_setup_context(ctx, inputs, output):
    scores, slopes = inputs
    ctx.save_for_backward(slopes)
    ctx.scores_shape, ctx.scores_dtype = scores.shape, scores.dtype


def _alibi_autograd(ctx, grad):
    # d scores = grad, passed on as it is (no copy); d slopes from the reduction op.
    need_scores, need_slopes = ctx.needs_input_grad
    grad_slopes = None
    if need_slopes:
        (slopes,) = ctx.saved_tensors
        _, grad_slopes = _AlibiBackward(grad, slopes, [False, True])
    return (grad if need_scores else None), grad_slopes


def _alibi_jvp(ctx, scores_tangent, slopes_tangent):
    # alibi is affine in (scores, slopes): its tangent is alibi of the tangents.
    if slopes_tangent is None:
        return scores_tangent
    if scores_tangent is None:
        scores_tangent = slopes_tangent.new_zeros(ctx.scores_shape, dtype=ctx.scores_dtype)
    return _Alibi(scores_tangent, slopes_tangent)


def _alibi_backward_setup_context(ctx, inputs, output):
    grad, slopes, output_mask = inputs
    ctx.grad_shape = grad.shape
    ctx.grad_dtype = grad.dtype
    ctx.output_mask = output_mask
    ctx.save_for_forward(slopes)


def _alibi_backward_autograd(ctx, gg_scores, gg_slopes):
    # alibi_backward is linear in grad: (grad_scores, grad_slopes) = (grad, sum grad * (j - i)),
    # so d grad = gg_scores + gg_slopes[h] * (j - i) = alibi(gg_scores, gg_slopes); slopes get none.
    if gg_slopes is None:
        d_grad = gg_scores
    else:
        if gg_scores is None:
            gg_scores = gg_slopes.new_zeros(ctx.grad_shape, dtype=ctx.grad_dtype)
        d_grad = _Alibi(gg_scores, gg_slopes)
    return d_grad, None, None


def _alibi_backward_jvp(ctx, grad_tangent, _slopes_tangent, _output_mask):
    # linear in grad; slopes give only the dtype of grad_slopes
    (slopes,) = ctx.saved_tensors
    return _AlibiBackward(grad_tangent, slopes, ctx.output_mask)


_Alibi = differentiable_op("alibi", _alibi_autograd, _alibi_setup_context, _alibi_jvp)
_AlibiBackward = differentiable_op("alibi_backward", _alibi_backward_autograd, _alibi_backward_setup_context,
                                   _alibi_backward_jvp)


# --------------------------------------------------------------------------- vmap
#
# The samples join the batch ([n * B, H, Q, K]); where the slopes differ per sample, or each
# sample needs its own slope gradient, they join the heads instead ([B, n * H, Q, K], slopes
# [n * H]), since every head has its own slope and its own slope sum. (alibi_inplace has no
# rule: alibi_ is not supported under torch.func.)


@torch.library.register_vmap("baracuda::alibi")
def _alibi_vmap(info, in_dims, scores, slopes):
    scores_dim, slopes_dim = arg_dims(in_dims, 2)
    _alibi_fake(sample_meta(scores, scores_dim), sample_meta(slopes, slopes_dim))  # a sample's checks
    n = info.batch_size
    scores = batch_first(scores, scores_dim, n)
    batch, heads = scores.shape[1], scores.shape[2]
    if slopes_dim is None:
        return torch.ops.baracuda.alibi(scores.flatten(0, 1), slopes).unflatten(0, (n, batch)), 0
    slopes = slopes.movedim(slopes_dim, 0).flatten()
    return torch.ops.baracuda.alibi(scores.transpose(0, 1).flatten(1, 2), slopes).unflatten(1, (n, heads)), 1


@torch.library.register_vmap("baracuda::alibi_backward")
def _alibi_backward_vmap(info, in_dims, grad, slopes, output_mask):
    grad_dim, slopes_dim, _ = arg_dims(in_dims, 3)
    _alibi_backward_fake(sample_meta(grad, grad_dim), sample_meta(slopes, slopes_dim), output_mask)
    n = info.batch_size
    grad = batch_first(grad, grad_dim, n)
    batch, heads = grad.shape[1], grad.shape[2]
    if not output_mask[1] and slopes_dim is None:
        grad_scores, _ = torch.ops.baracuda.alibi_backward(grad.flatten(0, 1), slopes, output_mask)
        return (grad_scores.unflatten(0, (n, batch)), None), (0, None)
    slopes = batch_first(slopes, slopes_dim, n).reshape(n * heads)
    grad_scores, grad_slopes = torch.ops.baracuda.alibi_backward(grad.transpose(0, 1).flatten(1, 2), slopes,
                                                                 output_mask)
    return ((None if grad_scores is None else grad_scores.unflatten(1, (n, heads)),
             None if grad_slopes is None else grad_slopes.unflatten(0, (n, heads))),
            (None if grad_scores is None else 1, None if grad_slopes is None else 0))


# --------------------------------------------------------------------------- DTensor sharding
#
# Every dim of the scores can be sharded without communication: batch (Shard(0)) and heads
# (Shard(1), the slopes Shard(0) alike) as they are; queries (Shard(2)) and keys (Shard(3)) with
# the bias of the rank's shard shifted: its positions start at offsets (q0, k0), so
# ``slope * (j - i)`` there is the local op's bias plus ``slope * (k0 - q0)``, added in the
# computation type after the op (one more rounding to the scores dtype). The slope gradient is
# Partial(sum) over batch, query and key shards: ``sum dy * (j - i)`` of the shard, plus
# ``(k0 - q0) * sum dy``. Partial scores are reduced first (the bias is not linear in them); in
# place (alibi_inplace) they are refused, since the sum would land in a temporary.


def _shift(shards) -> int:
    """k0 - q0 of this rank's shard of the scores (argument 0)."""
    return shards.offset(0, 3) - shards.offset(0, 2)


def _shifted_bias(scores: torch.Tensor, slopes: torch.Tensor, shift: int) -> torch.Tensor:
    """``slopes[h] * shift`` broadcast over the heads of ``scores`` in the computation type."""
    acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return (slopes.to(acc) * shift).view(-1, 1, 1)


def _register_sharding() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    def strategies(outputs) -> list:
        """``outputs(scores_placement, slope_grad_placement)``: the outputs of one strategy."""
        scores_slopes = [(Replicate(), Replicate(), Replicate()), (Shard(0), Replicate(), Partial()),
                         (Shard(1), Shard(0), Shard(0)), (Shard(2), Replicate(), Partial()),
                         (Shard(3), Replicate(), Partial())]
        return [(outputs(s, g), [s, w]) for s, w, g in scores_slopes]

    def local_alibi(shards, scores, slopes):
        out = torch.ops.baracuda.alibi(scores, slopes)
        shift = _shift(shards)
        return out if shift == 0 else (out + _shifted_bias(out, slopes, shift)).to(out.dtype)

    @_dtensor.rule([torch.ops.baracuda.alibi.default], local=local_alibi)
    def _alibi_sharding(scores, slopes):
        return strategies(lambda s, g: [s])

    def local_alibi_inplace(shards, scores, slopes):
        torch.ops.baracuda.alibi_inplace(scores, slopes)
        shift = _shift(shards)
        if shift != 0:
            scores.copy_(scores + _shifted_bias(scores, slopes, shift))

    @_dtensor.rule([torch.ops.baracuda.alibi_inplace.default], local=local_alibi_inplace)
    def _alibi_inplace_sharding(scores, slopes):
        for mesh_dim, p in enumerate(scores.placements):
            if not (p.is_replicate() or p.is_shard()):
                raise NotImplementedError(
                    f"baracuda::alibi_inplace: scores placement {p!r} on mesh dim {mesh_dim} cannot be updated in "
                    f"place (it needs a reduction first); use alibi, or redistribute the scores to Replicate or "
                    f"a Shard"
                )
        return [([], ins) for _, ins in strategies(lambda s, g: [])]

    def local_alibi_backward(shards, grad, slopes, output_mask):
        grad_scores, grad_slopes = torch.ops.baracuda.alibi_backward(grad, slopes, output_mask)
        shift = _shift(shards)
        if grad_slopes is not None and shift != 0:
            acc = torch.float64 if grad.dtype == torch.float64 else torch.float32
            sums = grad.sum(dim=(0, 2, 3), dtype=acc)
            grad_slopes = (grad_slopes.to(acc) + shift * sums).to(grad_slopes.dtype)
        return grad_scores, grad_slopes

    @_dtensor.rule([torch.ops.baracuda.alibi_backward.default], local=local_alibi_backward)
    def _alibi_backward_sharding(grad, slopes, output_mask):
        return [(outs, ins + [None]) for outs, ins in strategies(
            lambda s, g: [s if output_mask[0] else None, g if output_mask[1] else None])]


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- Plan API


def _problem(shape: Sequence[int]) -> list[int]:
    return list(shape)  # validated as int64 sizes by kernel_choice


def _check_desc(op: str, shape: Sequence[int], dtype: torch.dtype, slopes_dtype: torch.dtype) -> None:
    if len(shape) != 4:
        raise InvalidProblemError(f"baracuda::{op}: shape must be [B, H, Q, K], got {list(shape)}")
    if dtype not in _FLOATS:
        raise InvalidProblemError(f"baracuda::{op}: dtype must be float16, bfloat16, float32 or float64, got {dtype}")
    if slopes_dtype not in (torch.float32, dtype):
        raise InvalidProblemError(f"baracuda::{op}: slopes dtype {slopes_dtype} must be float32 or {dtype}")


@dataclass(frozen=True)
class AlibiDescriptor:
    """``shape`` = [B, H, Q, K] of the scores; problem encoding for the kernel choice: the same four ints."""

    shape: tuple[int, int, int, int]
    dtype: torch.dtype
    slopes_dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"


@dataclass
class AlibiArgs:
    scores: torch.Tensor
    slopes: torch.Tensor
    out: torch.Tensor


class AlibiPlan(Plan):
    """Writes ``alibi(scores, slopes)`` into ``args.out`` (contiguous, 16-byte aligned on CUDA)."""

    op = "alibi"

    @classmethod
    def select(cls, desc: AlibiDescriptor, pref: PlanPreference = PlanPreference()) -> "AlibiPlan":
        _check_desc(cls.op, desc.shape, desc.dtype, desc.slopes_dtype)
        return cls(desc, pref, _problem(desc.shape))

    def can_implement(self, args: AlibiArgs) -> None:
        self._check_tensor("scores", args.scores, self.desc.shape, self.desc.dtype)
        self._check_tensor("slopes", args.slopes, self.desc.shape[1:2], self.desc.slopes_dtype)
        self._check_tensor("out", args.out, self.desc.shape, self.desc.dtype)

    def run(self, args: AlibiArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        with plan_errors():
            torch.ops.baracuda.alibi.out(args.scores, args.slopes, out=args.out)


@dataclass(frozen=True)
class AlibiBackwardDescriptor(AlibiDescriptor):
    """The same fields, with ``shape`` = [B, H, Q, K] of grad."""


@dataclass
class AlibiBackwardArgs:
    grad: torch.Tensor
    slopes: torch.Tensor
    grad_slopes: torch.Tensor
    grad_scores: torch.Tensor | None = None  # written (a copy of grad) only when given


class AlibiBackwardPlan(Plan):
    """Writes the slope gradient into ``args.grad_slopes`` (and grad into ``args.grad_scores`` if given).
    The workspace holds the per-(head, chunk) partial sums."""

    op = "alibi_backward"

    @classmethod
    def select(cls, desc: AlibiBackwardDescriptor, pref: PlanPreference = PlanPreference()) -> "AlibiBackwardPlan":
        _check_desc(cls.op, desc.shape, desc.dtype, desc.slopes_dtype)
        return cls(desc, pref, _problem(desc.shape))

    def can_implement(self, args: AlibiBackwardArgs) -> None:
        self._check_tensor("grad", args.grad, self.desc.shape, self.desc.dtype)
        self._check_tensor("slopes", args.slopes, self.desc.shape[1:2], self.desc.slopes_dtype)
        self._check_tensor("grad_slopes", args.grad_slopes, self.desc.shape[1:2], self.desc.slopes_dtype)
        if args.grad_scores is not None:
            self._check_tensor("grad_scores", args.grad_scores, self.desc.shape, self.desc.dtype)

    def run(self, args: AlibiBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        buffer = self._workspace(workspace)
        with_scores = args.grad_scores is not None
        grad_scores = args.grad_scores if with_scores else args.grad.new_empty(0)
        with plan_errors():
            torch.ops.baracuda.alibi_backward.out(
                args.grad, args.slopes, [with_scores, True],
                grad_scores=grad_scores, grad_slopes=args.grad_slopes, workspace=buffer,
            )
