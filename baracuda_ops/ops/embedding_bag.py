"""embedding_bag family: ``torch.nn.functional.embedding_bag`` with a deterministic backward.

Ops (bag_mode: 0 sum, 1 mean, 2 max; ``padding_idx``: -1 for none, else in
``[0, num_embeddings)``; ``offsets`` is None exactly when ``indices`` is 2-D):

* ``embedding_bag(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
  padding_idx) -> (output [B, D], offset2bag [N] int64, bag_size [B] int64, max_positions int64)``.
  ``offset2bag[i]`` is the bag of flattened position ``i`` (-1 for positions in no bag),
  ``bag_size[b]`` the number of non-padding entries of bag ``b``, ``max_positions`` ([B, D] in
  max mode, else [0]) the position in the flattened indices whose weight gave ``output[b, d]``
  (-1 for an empty bag). Empty bags give zeros in every mode; padding entries are left out of the
  bag and of the mean's count; max keeps the first maximum (NaN only when it comes first), as
  PyTorch.
* ``embedding_bag_backward(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
  per_sample_weights, padding_idx) -> grad_weight [num_weights, D]`` (dense, every row written);
  ``embedding_bag_per_sample_weights_backward(grad, weight, indices, offset2bag, bag_mode, padding_idx)``
  -> the gradient of ``per_sample_weights`` (sum mode).

Determinism: no floating-point atomics. The backward groups positions by row with a stable sort
(CUDA: CUB radix sort of (row, position); CPU: counting sort) and sums each row's contributions in
position order — on CUDA with fixed chunk/group partials for very frequent rows — so results are
bit-identical run to run in every mode, including max.

Bad values. On CPU an out-of-range or negative index (other than a valid padding_idx) raises
IndexError, offsets that do not start at 0, decrease or pass the number of indices raise
ValueError, before anything is written. On CUDA checking values would need a host sync, so the
kernels instead never read or write out of bounds and *flag* the bag: a bag holding an
out-of-range index, or whose offsets break those rules, gets NaN in its whole output row and
``bag_size == -1`` (its valid entries still reach the gradient). The CUDA context stays usable
(no device-side assert). ``torch.isnan(out).any()`` or ``(bag_size < 0).any()`` detects it when
the caller chooses to sync.

The functional form takes every argument of F.embedding_bag: ``max_norm`` through
``torch.embedding_renorm_``, ``sparse`` and ``scale_grad_by_freq`` through
``embedding_bag_with_options`` (embedding_bag's forward; its C++ autograd kernel's weight
gradient is one op, ``embedding_bag_weight_backward(..., scale_grad_by_freq, sparse)``; under
torch.func the autograd.Function ``_WithGradientOptions``): the dense gradient with each
row divided by its count in the indices, or a sparse COO gradient with one entry per position in
order (F.embedding_bag's entries; a position that takes no gradient, such as padding, keeps its
entry with value 0, so that no host sync counts the entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _dtensor
from .._autograd import DifferentiableOp, differentiable_op, op_without_backward
from .._vmap import arg_dims, batch_first, per_sample, sample_meta
from .._errors import (
    BaracudaNotImplementedError,
    BaracudaValueError,
    check_index_range,
    check_same_device,
    raise_typed_error,
)
from .._plan import (
    InvalidProblemError,
    Plan,
    PlanPreference,
    PrecisionGuarantee,
    UnsupportedError,
    Workspace,
    plan_errors,
)

__all__ = [
    "embedding_bag",
    "EmbeddingBagDescriptor",
    "EmbeddingBagArgs",
    "EmbeddingBagPlan",
    "EmbeddingBagBackwardDescriptor",
    "EmbeddingBagBackwardArgs",
    "EmbeddingBagBackwardPlan",
]

_MODES = {"sum": 0, "mean": 1, "max": 2}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _mode_enum(mode: str) -> int:
    if mode not in _MODES:
        raise BaracudaValueError(f"baracuda::embedding_bag: mode has to be one of sum, mean or max, got {mode!r}")
    return _MODES[mode]


def _normalize_padding_idx(padding_idx: int | None, num_embeddings) -> int:
    """PyTorch's rule: padding_idx in [-num_embeddings, num_embeddings), negative counts from the end."""
    if padding_idx is None:
        return -1
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise BaracudaValueError(
            f"baracuda::embedding_bag: padding_idx must be within the number of embeddings, "
            f"-{num_embeddings} through {num_embeddings - 1}, but got {padding_idx}"
        )
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


def embedding_bag(
    input: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> torch.Tensor:
    """Same result and gradients as ``torch.nn.functional.embedding_bag``, every argument included;
    differentiable w.r.t. ``weight`` and ``per_sample_weights``, with a deterministic backward.

    As F.embedding_bag: ``max_norm`` first renormalises, in place, the rows of ``weight`` that
    ``input`` names (``torch.embedding_renorm_`` under no_grad); ``sparse=True`` gives ``weight`` a
    sparse COO gradient, one entry per position, not coalesced (value 0 where a position takes no
    gradient, e.g. padding, which F.embedding_bag leaves out); ``scale_grad_by_freq=True`` divides
    row ``r`` of the dense gradient by the number of times ``r`` occurs in ``input`` (PyTorch
    divides each term, this divides each row's sum: the same up to rounding)."""
    mode_enum = _MODES.get(mode)
    if mode_enum is None:
        _mode_enum(mode)  # its error
    if mode_enum == 2 and scale_grad_by_freq:
        raise BaracudaValueError("baracuda::embedding_bag: max mode does not support scaling the gradient by the frequency")
    if mode_enum == 2 and sparse:
        raise BaracudaValueError("baracuda::embedding_bag: max mode does not support sparse weights")
    if weight.dim() != 2:
        raise BaracudaValueError(
            f"baracuda::embedding_bag: weight must be 2-D [num_embeddings, embedding_dim], got shape {list(weight.shape)}"
        )
    pad = -1 if padding_idx is None else _normalize_padding_idx(padding_idx, weight.shape[0])
    if include_last_offset and input.dim() == 2:
        include_last_offset = False  # F.embedding_bag ignores it for 2-D input
    if max_norm is not None:
        check_index_range("embedding_bag", input, weight.shape[0])  # before the in-place renorm
        with torch.no_grad():
            torch.embedding_renorm_(weight, input.reshape(-1), max_norm, norm_type)
    args = (weight, input, offsets, mode_enum, per_sample_weights, include_last_offset, pad)
    try:
        if not _wants_gradient(weight, per_sample_weights):
            return _forward_only(*args)
        if sparse and scale_grad_by_freq:  # the forward runs, the backward refuses (as F.embedding_bag)
            return _WithGradientOptions.apply(*args, scale_grad_by_freq, sparse)[0]
        if sparse or scale_grad_by_freq:
            return _EmbeddingBagWithOptions(*args, scale_grad_by_freq, sparse)[0]
        return _EmbeddingBag(*args)[0]
    except (TypeError, RuntimeError) as e:
        raise_typed_error("embedding_bag", e, locals(), (), ("input", "weight", "offsets", "per_sample_weights"))


def _wants_gradient(weight, per_sample_weights) -> bool:
    """Whether a call may need embedding_bag's saved state (offset2bag, bag_size): a gradient of
    weight or per_sample_weights by autograd, forward-mode AD or a torch.func transform, or any
    call under torch.compile (which keeps one op in its graphs). Else the forward-only op,
    as F.embedding_bag takes _embedding_bag_forward_only."""
    if torch.compiler.is_compiling() or torch.autograd.forward_ad._current_level >= 0:
        return True
    wrapped, grad_mode = torch._C._functorch.is_functorch_wrapped_tensor, torch.is_grad_enabled()
    if wrapped(weight) or (grad_mode and weight.requires_grad):
        return True
    psw = per_sample_weights
    return psw is not None and (wrapped(psw) or (grad_mode and psw.requires_grad))


# --------------------------------------------------------------------------- fakes


def _fake_geometry(weight, indices, offsets, mode, per_sample_weights, include_last_offset):
    op = "baracuda::embedding_bag"
    if mode not in (0, 1, 2):
        raise BaracudaValueError(f"{op}: mode must be 0 (sum), 1 (mean) or 2 (max), got {mode}")
    if weight.dim() != 2:
        raise BaracudaValueError(f"{op}: weight must be 2-D [num_embeddings, embedding_dim], got shape {list(weight.shape)}")
    if indices.dim() == 2:
        if offsets is not None:
            raise BaracudaValueError(
                f"{op}: offsets must be None when indices is 2-D (fixed-size bags), got offsets of shape "
                f"{list(offsets.shape)}"
            )
        num_bags = indices.shape[0]
    elif indices.dim() == 1:
        if offsets is None:
            raise BaracudaValueError(f"{op}: offsets are required when indices is 1-D")
        if offsets.dim() != 1:
            raise BaracudaValueError(f"{op}: offsets must be 1-D, got shape {list(offsets.shape)}")
        if include_last_offset and offsets.shape[0] == 0:
            raise BaracudaValueError(f"{op}: include_last_offset needs at least 1 offset, got 0")
        num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    else:
        raise BaracudaValueError(
            f"{op}: indices must be 1-D (with offsets) or 2-D (fixed-size bags), got shape {list(indices.shape)}"
        )
    if per_sample_weights is not None and mode != 0:
        raise BaracudaNotImplementedError(
            f"{op}: per_sample_weights is only supported with mode 0 (sum), got mode {mode} "
            f"({['sum', 'mean', 'max'][mode]})"
        )
    return num_bags


@torch.library.register_fake("baracuda::embedding_bag")
def _embedding_bag_fake(weight, indices, offsets, bag_mode=0, per_sample_weights=None, include_last_offset=False,
                        padding_idx=-1):
    check_same_device("embedding_bag", locals())
    num_bags = _fake_geometry(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset)
    dim = weight.shape[1]
    output = weight.new_empty([num_bags, dim])
    offset2bag = weight.new_empty([indices.numel()], dtype=torch.int64)
    bag_size = weight.new_empty([num_bags], dtype=torch.int64)
    max_positions = weight.new_empty([num_bags, dim] if bag_mode == 2 else [0], dtype=torch.int64)
    return output, offset2bag, bag_size, max_positions


@torch.library.register_fake("baracuda::embedding_bag_with_options")
def _embedding_bag_with_options_fake(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                                     padding_idx, scale_grad_by_freq, sparse):
    return _embedding_bag_fake(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                               padding_idx)


@torch.library.register_fake("baracuda::embedding_bag_forward_only")
def _embedding_bag_forward_only_fake(weight, indices, offsets, bag_mode=0, per_sample_weights=None,
                                     include_last_offset=False, padding_idx=-1):
    return _embedding_bag_fake(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset,
                               padding_idx)[0]


@torch.library.register_fake("baracuda::embedding_bag.out")
def _embedding_bag_out_fake(weight, indices, offsets, bag_mode=0, per_sample_weights=None, include_last_offset=False,
                            padding_idx=-1, *, output, offset2bag, bag_size, max_positions):
    check_same_device("embedding_bag", locals())
    return None


@torch.library.register_fake("baracuda::embedding_bag_backward")
def _embedding_bag_backward_fake(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                                 per_sample_weights=None, padding_idx=-1):
    check_same_device("embedding_bag_backward", locals())
    if grad.dim() != 2:
        raise BaracudaValueError(
            f"baracuda::embedding_bag_backward: grad must be 2-D [num_bags, embedding_dim], got shape {list(grad.shape)}"
        )
    return grad.new_empty([num_weights, grad.shape[1]])


@torch.library.register_fake("baracuda::embedding_bag_backward.out")
def _embedding_bag_backward_out_fake(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                                     per_sample_weights=None, padding_idx=-1, *, grad_weight, workspace):
    check_same_device("embedding_bag_backward", locals())
    return None


@torch.library.register_fake("baracuda::embedding_bag_per_sample_weights_backward")
def _per_sample_weights_backward_fake(grad, weight, indices, offset2bag, bag_mode, padding_idx=-1):
    check_same_device("embedding_bag_per_sample_weights_backward", locals())
    if bag_mode != 0:
        raise BaracudaValueError(
            f"baracuda::embedding_bag_per_sample_weights_backward: per_sample_weights only have a gradient in mode 0 "
            f"(sum), got mode {bag_mode} ({['sum', 'mean', 'max'][bag_mode] if bag_mode in (0, 1, 2) else 'invalid'})"
        )
    return weight.new_empty(indices.shape)


@torch.library.register_fake("baracuda::embedding_bag_per_sample_weights_backward.out")
def _per_sample_weights_backward_out_fake(grad, weight, indices, offset2bag, bag_mode, padding_idx=-1, *,
                                          grad_per_sample_weights):
    check_same_device("embedding_bag_per_sample_weights_backward", locals())
    return None


@torch.library.register_fake("baracuda::embedding_bag_weight_backward")
def _weight_backward_fake(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                          per_sample_weights, padding_idx, scale_grad_by_freq, sparse):
    dense = _embedding_bag_backward_fake(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                                         per_sample_weights, padding_idx)
    if not sparse:
        return dense
    n, dim = indices.numel(), grad.shape[1]
    rows, values = indices.new_empty([1, n], dtype=torch.int64), grad.new_empty([n, dim])
    return torch.ops.aten._sparse_coo_tensor_unsafe(rows, values, [num_weights, dim])


# --------------------------------------------------------------------------- autograd


def _setup_context(ctx, inputs, output):
    weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset, padding_idx = inputs
    _, offset2bag, bag_size, max_positions = output
    ctx.num_weights = weight.shape[0]
    ctx.mode = bag_mode
    ctx.padding_idx = padding_idx
    needs_psw_grad = per_sample_weights is not None and per_sample_weights.requires_grad
    ctx.save_for_backward(indices, offset2bag, bag_size, max_positions, per_sample_weights,
                          weight if needs_psw_grad else None)
    ctx.save_for_forward(weight, indices, offsets, per_sample_weights, max_positions)
    ctx.include_last_offset = include_last_offset


def _gradients(ctx, grad_output, sparse: bool = False, scale_grad_by_freq: bool = False):
    """(grad_weight, grad_per_sample_weights) from what _setup_context saved; grad_weight dense, or
    with F.embedding_bag's sparse=True / scale_grad_by_freq=True gradient (one op,
    ``embedding_bag_weight_backward``)."""
    indices, offset2bag, bag_size, max_positions, per_sample_weights, weight = ctx.saved_tensors
    grad_weight = grad_psw = None
    if ctx.needs_input_grad[0]:
        if sparse and scale_grad_by_freq:
            raise UnsupportedError("baracuda::embedding_bag: scale_grad_by_freq is not supported with sparse "
                                   "gradients (nor by PyTorch)")
        if sparse or scale_grad_by_freq:
            grad_weight = torch.ops.baracuda.embedding_bag_weight_backward(
                grad_output, indices, offset2bag, bag_size, max_positions, ctx.num_weights, ctx.mode,
                per_sample_weights, ctx.padding_idx, scale_grad_by_freq, sparse)
        else:
            grad_weight = _EmbeddingBagBackward(
                grad_output, indices, offset2bag, bag_size, max_positions, ctx.num_weights, ctx.mode,
                per_sample_weights, ctx.padding_idx,
            )
    # needs_input_grad covers only the arguments the call passed (defaults may be left out).
    if len(ctx.needs_input_grad) > 4 and ctx.needs_input_grad[4]:
        grad_psw = _PerSampleWeightsBackward(
            grad_output, weight, indices, offset2bag, ctx.mode, ctx.padding_idx
        )
    return grad_weight, grad_psw


def _backward(ctx, grad_output, _grad_offset2bag, _grad_bag_size, _grad_max_positions):
    grad_weight, grad_psw = _gradients(ctx, grad_output)
    return grad_weight, None, None, None, grad_psw, None, None


def _jvp(ctx, weight_tangent, _indices, _offsets, _mode, psw_tangent, _include_last_offset, _padding_idx):
    # The output is linear in weight (max mode: the argmax rows, fixed) and in
    # per_sample_weights: its tangent is the bag of the tangents.
    weight, indices, offsets, per_sample_weights, max_positions = ctx.saved_tensors
    tangent = None
    if weight_tangent is not None:
        if ctx.mode == 2:
            rows = indices.reshape(-1)[max_positions.clamp(min=0)]
            tangent = torch.where(max_positions >= 0, weight_tangent.gather(0, rows), 0)
        else:
            tangent = _EmbeddingBag(weight_tangent, indices, offsets, ctx.mode, per_sample_weights,
                                    ctx.include_last_offset, ctx.padding_idx)[0]
    if psw_tangent is not None:
        term = _EmbeddingBag(weight, indices, offsets, ctx.mode, psw_tangent, ctx.include_last_offset,
                             ctx.padding_idx)[0]
        tangent = term if tangent is None else tangent + term
    return tangent, None, None, None


class _WithGradientOptions(torch.autograd.Function):
    """baracuda::embedding_bag_with_options under torch.func and forward-mode AD: embedding_bag
    (the same seven arguments) whose weight gradient follows F.embedding_bag's
    ``scale_grad_by_freq`` and ``sparse`` (the two trailing arguments)."""

    @staticmethod
    def forward(weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset, padding_idx,
                scale_grad_by_freq, sparse):
        return torch.ops.baracuda.embedding_bag(weight, indices, offsets, bag_mode, per_sample_weights,
                                                include_last_offset, padding_idx)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs[:7], output)
        ctx.scale_grad_by_freq, ctx.sparse = inputs[7:]
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    def backward(ctx, grad_output, _grad_offset2bag, _grad_bag_size, _grad_max_positions):
        grad_weight, grad_psw = _gradients(ctx, grad_output, ctx.sparse, ctx.scale_grad_by_freq)
        return grad_weight, None, None, None, grad_psw, None, None, None, None


_EmbeddingBag = differentiable_op("embedding_bag", _backward, _setup_context, _jvp)
_forward_only = torch.ops.baracuda.embedding_bag_forward_only.default
# The eager gradient with the options is the C++ kernel of embedding_bag_with_options.
_EmbeddingBagWithOptions = DifferentiableOp(torch.ops.baracuda.embedding_bag_with_options.default,
                                            _WithGradientOptions)
_EmbeddingBagBackward, _PerSampleWeightsBackward = (
    op_without_backward(op, f"baracuda::{op}: double backward of embedding_bag is not supported")
    for op in ("embedding_bag_backward", "embedding_bag_per_sample_weights_backward"))


# --------------------------------------------------------------------------- vmap
#
# The samples become more bags of one call. Their indices index one table: the weight itself
# when it is shared, else the samples' weights stacked ([n * V, D]), each sample's indices moved
# to its rows (padding entries kept: the one padding value names no moved row; out-of-range ones
# set to -1, out of range still). Fixed-size bags ([nb, L] a sample) stack; bags given by
# offsets are laid end to end with include_last_offset, each sample's offsets clamped into
# [0, L] and moved by its first position, closed by one extra bag over whatever follows its last
# bag (dropped from the outputs, its positions in no bag). A sample's bag whose offsets break
# the rules (first not 0, decreasing, past L) is flagged as the op flags it on CUDA (NaN row,
# bag_size -1, max positions -1); on CPU, where the op raises for bad values, such a batch runs
# per sample and raises the op's error (so does a batch of no samples: no table to fold). The
# backward ops fold the same way and give each sample its own gradient rows.


def _rows_of_samples(indices, num_weights: int, padding_idx: int):
    """[n, ...] indices moved to sample k's rows k * num_weights of the stacked table."""
    n = indices.shape[0]
    if n * num_weights > torch.iinfo(torch.int32).max:
        indices = indices.long()
    first = torch.arange(n, device=indices.device, dtype=indices.dtype) * num_weights
    first = first.view(n, *[1] * (indices.dim() - 1))
    in_range = (indices >= 0) & (indices < num_weights)
    moved = torch.where(indices == padding_idx, indices, indices + first) if padding_idx >= 0 else indices + first
    return torch.where(in_range, moved, -1)


def _one_table(weight, weight_dim, indices, padding_idx: int):
    """(table, indices) for one call over [n, ...] indices: the weight itself when it is shared,
    else the samples' weights stacked, [n * V, D], each sample's indices moved to its rows."""
    if weight_dim is None:
        return weight, indices
    stacked = batch_first(weight, weight_dim, indices.shape[0])
    return stacked.flatten(0, 1), _rows_of_samples(indices, stacked.shape[1], padding_idx)


def _bags_of_samples(offset2bag, bags: int):
    """[n, positions] offset2bag of each sample's bags moved to its bags of the folded call
    (-1, in no bag, kept)."""
    first = torch.arange(offset2bag.shape[0], device=offset2bag.device) * bags
    return torch.where(offset2bag < 0, -1, offset2bag + first.unsqueeze(1))


def _values_valid(indices, num_weights: int, padding_idx: int, offsets=None, length: int = 0) -> bool:
    """Whether every sample's indices (and offsets) pass the op's value checks (CPU: no sync)."""
    in_range = (indices >= 0) & (indices < num_weights)
    ok = bool((in_range | (indices == padding_idx) if padding_idx >= 0 else in_range).all())
    if offsets is not None and offsets.shape[1] > 0:
        ok = ok and bool((offsets[:, 0] == 0).all() and (offsets[:, 1:] >= offsets[:, :-1]).all()
                         and (offsets <= length).all())
    return ok


def _sample_args(args, in_dims):
    return [sample_meta(a, d) if isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)]


def _embedding_bag_vmap(info, in_dims, weight, indices, offsets=None, bag_mode=0, per_sample_weights=None,
                        include_last_offset=False, padding_idx=-1):
    in_dims = arg_dims(in_dims, 7)
    args = (weight, indices, offsets, bag_mode, per_sample_weights, include_last_offset, padding_idx)
    _embedding_bag_fake(*_sample_args(args, in_dims))  # a sample's shape checks
    n = info.batch_size
    num_weights = sample_meta(weight, in_dims[0]).shape[0]
    idx = batch_first(indices, in_dims[1], n)
    off = batch_first(offsets, in_dims[2], n)
    fixed = idx.dim() == 3  # [n, bags, L]: fixed-size bags
    length, positions = idx.shape[-1], idx.shape[1:].numel()
    if n == 0 or (idx.device.type == "cpu" and not _values_valid(idx, num_weights, padding_idx, off, length)):
        return per_sample(torch.ops.baracuda.embedding_bag.default, n, in_dims, *args)
    table, idx = _one_table(weight, in_dims[0], idx, padding_idx)
    psw = batch_first(per_sample_weights, in_dims[4], n)
    samples = torch.arange(n, device=idx.device)
    if fixed:
        bags = idx.shape[1]
        output, offset2bag, bag_size, max_positions = torch.ops.baracuda.embedding_bag(
            table, idx.flatten(0, 1), None, bag_mode, None if psw is None else psw.flatten(0, 1), False, padding_idx)
        output, bag_size = output.unflatten(0, (n, bags)), bag_size.unflatten(0, (n, bags))
        offset2bag = offset2bag.unflatten(0, (n, positions)) - (samples * bags).unsqueeze(1)
        per_bag, bad = bags, None
    else:
        count = off.shape[1]
        bags = count - 1 if include_last_offset else count
        if n * length > torch.iinfo(torch.int32).max:
            off = off.long()
        clamped = off.clamp(0, length)
        # The closing bag starts where the sample's last bag ends: its last offset, the end of its
        # positions (the last bag runs to the end), or 0 when it has no bags at all.
        last = torch.full((n, 1), length if bags > 0 else 0, dtype=off.dtype, device=off.device)
        if include_last_offset:
            last = clamped[:, -1:]
        starts = torch.cat([clamped[:, :bags], last], 1) + (samples * length).to(off.dtype).unsqueeze(1)
        folded = torch.cat([starts.flatten(), starts.new_full((1,), n * length)])
        output, offset2bag, bag_size, max_positions = torch.ops.baracuda.embedding_bag(
            table, idx.flatten(), folded, bag_mode, None if psw is None else psw.flatten(), True, padding_idx)
        per_bag = bags + 1
        output = output.unflatten(0, (n, per_bag))[:, :bags]
        bag_size = bag_size.unflatten(0, (n, per_bag))[:, :bags]
        offset2bag = offset2bag.unflatten(0, (n, length))
        offset2bag = torch.where(offset2bag < 0, -1, offset2bag - (samples * per_bag).unsqueeze(1))
        offset2bag = torch.where(offset2bag == bags, -1, offset2bag)  # the closing bag: in no bag
        begin = off[:, :bags]
        end = off[:, 1:] if include_last_offset else torch.cat([off[:, 1:], torch.full_like(off[:, :1], length)], 1)
        bad = (begin < 0) | (begin > end) | (end > length)
        if bags > 0:
            bad[:, 0] |= begin[:, 0] != 0
    if bag_mode == 2:
        max_positions = max_positions.unflatten(0, (n, per_bag))[:, :bags]
        max_positions = torch.where(max_positions < 0, -1, max_positions - (samples * positions).view(n, 1, 1))
    else:
        max_positions = max_positions.new_empty((n, 0))
    if bad is not None:  # the op's flags for a sample's bad offsets
        output = torch.where(bad.unsqueeze(-1), torch.nan, output)
        bag_size = torch.where(bad, -1, bag_size)
        if bag_mode == 2:
            max_positions = torch.where(bad.unsqueeze(-1), -1, max_positions)
    return (output, offset2bag, bag_size, max_positions), (0, 0, 0, 0)


torch.library.register_vmap("baracuda::embedding_bag", _embedding_bag_vmap)


@torch.library.register_vmap("baracuda::embedding_bag_forward_only")
def _embedding_bag_forward_only_vmap(info, in_dims, *args):
    outputs, out_dims = _embedding_bag_vmap(info, in_dims, *args)
    return outputs[0], out_dims[0]


@torch.library.register_vmap("baracuda::embedding_bag_backward")
def _embedding_bag_backward_vmap(info, in_dims, grad, indices, offset2bag, bag_size, max_positions, num_weights,
                                 bag_mode, per_sample_weights=None, padding_idx=-1):
    in_dims = arg_dims(in_dims, 9)
    args = (grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode, per_sample_weights, padding_idx)
    one = _sample_args(args, in_dims)
    _embedding_bag_backward_fake(*one)  # a sample's shape checks
    n = info.batch_size
    bags, dim = one[0].shape
    positions = one[1].numel()
    idx = batch_first(indices, in_dims[1], n)
    shapes_ok = (list(one[2].shape) == [positions] and list(one[3].shape) == [bags]
                 and (bag_mode != 2 or list(one[4].shape) == [bags, dim]))
    if n == 0 or not shapes_ok or (idx.device.type == "cpu" and not _values_valid(idx, num_weights, padding_idx)):
        return per_sample(torch.ops.baracuda.embedding_bag_backward.default, n, in_dims, *args)
    samples = torch.arange(n, device=idx.device)
    offset2bag = _bags_of_samples(batch_first(offset2bag, in_dims[2], n), bags)
    if bag_mode == 2:
        max_positions = batch_first(max_positions, in_dims[4], n)
        max_positions = torch.where(max_positions < 0, -1, max_positions + (samples * positions).view(n, 1, 1))
        max_positions = max_positions.flatten(0, 1)
    else:
        max_positions = offset2bag.new_empty(0)
    psw = batch_first(per_sample_weights, in_dims[7], n)
    grad_weight = torch.ops.baracuda.embedding_bag_backward(
        batch_first(grad, in_dims[0], n).flatten(0, 1), _rows_of_samples(idx, num_weights, padding_idx).flatten(0, 1),
        offset2bag.flatten(), batch_first(bag_size, in_dims[3], n).flatten(), max_positions, n * num_weights,
        bag_mode, None if psw is None else psw.flatten(0, 1), padding_idx)
    return grad_weight.unflatten(0, (n, num_weights)), 0


@torch.library.register_vmap("baracuda::embedding_bag_per_sample_weights_backward")
def _per_sample_weights_backward_vmap(info, in_dims, grad, weight, indices, offset2bag, bag_mode, padding_idx=-1):
    in_dims = arg_dims(in_dims, 6)
    args = (grad, weight, indices, offset2bag, bag_mode, padding_idx)
    one = _sample_args(args, in_dims)
    _per_sample_weights_backward_fake(*one)  # a sample's checks
    n = info.batch_size
    bags = one[0].shape[0]
    num_weights = one[1].shape[0]
    idx = batch_first(indices, in_dims[2], n)
    if n == 0 or list(one[3].shape) != [one[2].numel()] or (
            idx.device.type == "cpu" and not _values_valid(idx, num_weights, padding_idx)):
        return per_sample(torch.ops.baracuda.embedding_bag_per_sample_weights_backward.default, n, in_dims, *args)
    table, idx = _one_table(weight, in_dims[1], idx, padding_idx)
    offset2bag = _bags_of_samples(batch_first(offset2bag, in_dims[3], n), bags)
    grad_psw = torch.ops.baracuda.embedding_bag_per_sample_weights_backward(
        batch_first(grad, in_dims[0], n).flatten(0, 1), table, idx.flatten(0, 1), offset2bag.flatten(), bag_mode,
        padding_idx)
    return grad_psw.reshape(n, *one[2].shape), 0


# --------------------------------------------------------------------------- DTensor sharding
#
# Two layouts, which combine over the dims of a mesh:
#
# * Bags sharded: ``indices``, ``offsets`` and ``per_sample_weights`` Shard(0), each rank holding
#   its own bags with offsets into its own indices (a per-rank batch, ``DTensor.from_local``), the
#   table Replicate. Output, offset2bag, bag_size and max_positions are Shard(0); the weight
#   gradient is Partial(sum), per_sample_weights' gradient Shard(0).
# * Rows sharded: the table Shard(0) (rank r owns rows [start_r, start_r + rows_r)), the bags
#   Replicate. Each rank pools the entries whose rows it owns: in sum and mean mode the other
#   entries get weight 0 (a sum-mode call with a 0/1 per-sample weight) and the output is
#   Partial(sum), the mean dividing each rank's sum by the bag's global size (its count of
#   non-padding entries, known from the replicated indices); in max mode each rank pools its
#   entries (regrouped by a stable sort into bags of their own), a bag with none of them gives
#   -inf, and two all-reduces over the table's mesh dims (max of the values, then min of the
#   positions holding that max) give the output and the global first argmax, Replicate, which
#   the backward needs. bag_size comes out Partial(max): its value is the same on every rank, so
#   that is exact, and it tells the backward the table is row-sharded. The backward then writes
#   each rank's own rows (weight gradient Shard(0)); per_sample_weights' gradient is
#   Partial(sum).


def _owned_rows(indices, start: int, rows: int, padding_idx: int):
    """(flattened indices, mask of the entries in rows [start, start + rows) that are not padding)."""
    flat = indices.reshape(-1)
    return flat, (flat >= start) & (flat < start + rows) & (flat != padding_idx)


def _global_bag_size(flat, offset2bag, bags: int, padding_idx: int):
    """Each bag's count of non-padding entries."""
    counted = (offset2bag >= 0) & (flat != padding_idx)
    return torch.zeros(bags, dtype=torch.int64, device=flat.device).index_add_(
        0, offset2bag.clamp(min=0), counted.long())


def _offset2bag(indices, offsets, include_last_offset: bool, bags: int):
    """The bag of each flattened entry (-1 for an entry in no bag), from the geometry alone."""
    n = indices.numel()
    positions = torch.arange(n, device=indices.device)
    if offsets is None:
        return positions // max(indices.shape[1], 1)
    starts = offsets[:bags].long()
    bag = torch.searchsorted(starts, positions, right=True) - 1
    if include_last_offset:
        bag = torch.where(positions < offsets[bags], bag, -1)
    return bag


def _rowwise_max(shards, weight, indices, offsets, include_last_offset, padding_idx, start):
    """Max mode on a row-sharded table (see the section comment)."""
    rows = weight.shape[0]
    bags = indices.shape[0] if offsets is None else offsets.shape[0] - int(include_last_offset)
    flat, owned = _owned_rows(indices, start, rows, padding_idx)
    offset2bag = _offset2bag(indices, offsets, include_last_offset, bags)
    key = torch.where(owned & (offset2bag >= 0), offset2bag, bags)  # bag `bags`: the entries of other ranks
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=bags + 1)
    local_offsets = torch.cumsum(counts, 0) - counts
    local_indices = torch.where(owned, flat - start, 0)[order]
    out, _, size, positions = torch.ops.baracuda.embedding_bag(weight, local_indices, local_offsets.to(flat.dtype), 2)
    out, size, positions = out[:bags], size[:bags, None], positions[:bags]
    positions = torch.where(positions >= 0, order[positions.clamp(min=0)], -1)
    value = torch.where(size > 0, out, float("-inf"))
    dims = shards.mesh_dims(0, 0)
    best = shards.all_reduce(value, "max", dims)
    position = shards.all_reduce(torch.where((size > 0) & (value == best), positions, flat.numel()), "min", dims)
    bag_size = _global_bag_size(flat, offset2bag, bags, padding_idx)
    empty = (bag_size == 0)[:, None]
    return (torch.where(empty, 0, best).to(weight.dtype), offset2bag, bag_size, torch.where(empty, -1, position))


def _register_sharding() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    def local_embedding_bag(shards, weight, indices, offsets, bag_mode=0, per_sample_weights=None,
                            include_last_offset=False, padding_idx=-1):
        if not shards.mesh_dims(0, 0):
            return torch.ops.baracuda.embedding_bag(weight, indices, offsets, bag_mode, per_sample_weights,
                                                    include_last_offset, padding_idx)
        start = shards.offset(0, 0)
        if bag_mode == 2:
            return _rowwise_max(shards, weight, indices, offsets, include_last_offset, padding_idx, start)
        flat, owned = _owned_rows(indices, start, weight.shape[0], padding_idx)
        mask = owned.to(weight.dtype).view(indices.shape)
        weights = mask if per_sample_weights is None else mask * per_sample_weights
        local_indices = torch.where(owned, flat - start, 0).view(indices.shape)
        out, offset2bag, _, positions = torch.ops.baracuda.embedding_bag(
            weight, local_indices, offsets, 0, weights, include_last_offset, -1)
        bag_size = _global_bag_size(flat, offset2bag, out.shape[0], padding_idx)
        if bag_mode == 1:
            acc = torch.float64 if out.dtype == torch.float64 else torch.float32
            out = (out.to(acc) / bag_size.clamp(min=1).to(acc)[:, None]).to(out.dtype)
        return out, offset2bag, bag_size, positions

    @_dtensor.rule([torch.ops.baracuda.embedding_bag.default], local=local_embedding_bag)
    def _embedding_bag_sharding(weight, indices, offsets, bag_mode=0, per_sample_weights=None,
                                include_last_offset=False, padding_idx=-1):
        def ins(table, bags):
            return [table, bags, None if offsets is None else bags, None,
                    None if per_sample_weights is None else bags, None, None]

        # max_positions outside max mode is empty, the same on every rank: Replicate
        positions = Shard(0) if bag_mode == 2 else Replicate()
        rows = [Partial() if bag_mode != 2 else Replicate(), Replicate(), Partial("max"), Replicate()]
        return [([Replicate()] * 4, ins(Replicate(), Replicate())),
                ([Shard(0)] * 3 + [positions], ins(Replicate(), Shard(0))),
                (rows, ins(Shard(0), Replicate()))]

    def local_backward(shards, grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                       per_sample_weights=None, padding_idx=-1):
        if not any(p.is_partial() for p in shards.specs[3].placements):  # bags sharded, or Replicate
            return torch.ops.baracuda.embedding_bag_backward(grad, indices, offset2bag, bag_size, max_positions,
                                                             num_weights, bag_mode, per_sample_weights, padding_idx)
        start, rows = shards.output_rows(0)
        flat, owned = _owned_rows(indices, start, rows, padding_idx)
        # the entries of other ranks go to one more row, a padding row, dropped after
        local_indices = torch.where(owned, flat - start, rows).view(indices.shape)
        return torch.ops.baracuda.embedding_bag_backward(grad, local_indices, offset2bag, bag_size, max_positions,
                                                         rows + 1, bag_mode, per_sample_weights, rows)[:rows]

    @_dtensor.rule([torch.ops.baracuda.embedding_bag_backward.default], local=local_backward)
    def _embedding_bag_backward_sharding(grad, indices, offset2bag, bag_size, max_positions, num_weights, bag_mode,
                                         per_sample_weights=None, padding_idx=-1):
        def ins(bags, size):
            positions = bags if bag_mode == 2 else Replicate()
            return [bags, bags, bags, size, positions, None, None, None if per_sample_weights is None else bags, None]

        r = Replicate()
        return [([r], ins(r, r)), ([Partial()], ins(Shard(0), Shard(0))), ([Shard(0)], ins(r, Partial("max")))]

    def local_psw_backward(shards, grad, weight, indices, offset2bag, bag_mode, padding_idx=-1):
        if not shards.mesh_dims(1, 0):
            return torch.ops.baracuda.embedding_bag_per_sample_weights_backward(grad, weight, indices, offset2bag,
                                                                                bag_mode, padding_idx)
        start = shards.offset(1, 0)
        flat, owned = _owned_rows(indices, start, weight.shape[0], padding_idx)
        local_indices = torch.where(owned, flat - start, 0).view(indices.shape)
        out = torch.ops.baracuda.embedding_bag_per_sample_weights_backward(grad, weight, local_indices, offset2bag,
                                                                           bag_mode, -1)
        return out * owned.view(indices.shape)

    @_dtensor.rule([torch.ops.baracuda.embedding_bag_per_sample_weights_backward.default], local=local_psw_backward)
    def _psw_backward_sharding(grad, weight, indices, offset2bag, bag_mode, padding_idx=-1):
        r = Replicate()
        return [([r], [r, r, r, r, None, None]), ([Shard(0)], [Shard(0), r, Shard(0), Shard(0), None, None]),
                ([Partial()], [r, Shard(0), r, r, None, None])]


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- Plan API
#
# problem (the int list the kernel choice is made from) =
#   [num_embeddings, embedding_dim, num_indices, num_bags, mode, has_per_sample_weights]


@dataclass(frozen=True)
class EmbeddingBagDescriptor:
    """One embedding_bag problem. ``indices_shape`` is ``(N,)`` with ``num_offsets`` offsets, or
    ``(B, L)`` (fixed-size bags, ``num_offsets=None``)."""

    num_embeddings: int
    embedding_dim: int
    indices_shape: tuple[int, ...]
    num_offsets: int | None
    mode: str = "mean"
    dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int64
    per_sample_weights: bool = False
    include_last_offset: bool = False
    padding_idx: int | None = None
    device: torch.device | str = "cpu"

    @property
    def mode_enum(self) -> int:
        with plan_errors():
            return _mode_enum(self.mode)

    @property
    def padding(self) -> int:
        with plan_errors():
            return _normalize_padding_idx(self.padding_idx, self.num_embeddings)

    @property
    def num_indices(self) -> int:
        n = 1
        for s in self.indices_shape:
            n *= int(s)
        return n

    @property
    def num_bags(self) -> int:
        if len(self.indices_shape) == 2:
            if self.num_offsets is not None:
                raise InvalidProblemError("baracuda::embedding_bag: num_offsets must be None for 2-D indices")
            return int(self.indices_shape[0])
        if len(self.indices_shape) != 1 or self.num_offsets is None:
            raise InvalidProblemError(
                f"baracuda::embedding_bag: indices_shape {list(self.indices_shape)} must be 1-D with num_offsets, "
                "or 2-D without"
            )
        if self.include_last_offset and self.num_offsets < 1:
            raise InvalidProblemError("baracuda::embedding_bag: include_last_offset needs at least 1 offset, got 0")
        return self.num_offsets - 1 if self.include_last_offset else self.num_offsets

    def validate(self) -> None:
        if self.dtype not in _FLOATS:
            raise InvalidProblemError(
                f"baracuda::embedding_bag: weight must be float16, bfloat16, float32 or float64, got {self.dtype}"
            )
        if self.index_dtype not in (torch.int32, torch.int64):
            raise InvalidProblemError(
                f"baracuda::embedding_bag: indices must be int32 or int64, got {self.index_dtype}"
            )
        if self.per_sample_weights and self.mode_enum != 0:
            raise InvalidProblemError(
                f"baracuda::embedding_bag: per_sample_weights is only supported with mode 'sum', got {self.mode!r}"
            )
        if min(self.num_embeddings, self.embedding_dim, *self.indices_shape) < 0:
            raise InvalidProblemError("baracuda::embedding_bag: sizes must be >= 0")
        self.num_bags, self.padding  # validate

    def problem(self) -> list[int]:
        return [self.num_embeddings, self.embedding_dim, self.num_indices, self.num_bags, self.mode_enum,
                int(self.per_sample_weights)]


@dataclass
class EmbeddingBagArgs:
    weight: torch.Tensor
    indices: torch.Tensor
    offsets: torch.Tensor | None
    output: torch.Tensor
    offset2bag: torch.Tensor
    bag_size: torch.Tensor
    max_positions: torch.Tensor
    per_sample_weights: torch.Tensor | None = None


class EmbeddingBagPlan(Plan):
    """Writes output, offset2bag, bag_size and max_positions of ``embedding_bag`` into ``args``."""

    op = "embedding_bag"

    @classmethod
    def select(cls, desc: EmbeddingBagDescriptor, pref: PlanPreference = PlanPreference()) -> "EmbeddingBagPlan":
        desc.validate()
        return cls(desc, pref, desc.problem())

    @property
    def index_dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.desc.index_dtype

    def precision_guarantee(self) -> PrecisionGuarantee:
        if self.desc.mode == "max":  # a selection: exact in every dtype
            return PrecisionGuarantee(self.desc.dtype, self.desc.dtype, True, True)
        return super().precision_guarantee()

    def can_implement(self, args: EmbeddingBagArgs) -> None:
        d = self.desc
        self._check_tensor("weight", args.weight, (d.num_embeddings, d.embedding_dim), d.dtype)
        self._check_tensor("indices", args.indices, d.indices_shape, d.index_dtype)
        if (args.offsets is None) != (d.num_offsets is None):
            raise InvalidProblemError("baracuda::embedding_bag: offsets must be given exactly when indices is 1-D")
        if args.offsets is not None:
            self._check_tensor("offsets", args.offsets, (d.num_offsets,), args.offsets.dtype)
        if (args.per_sample_weights is not None) != d.per_sample_weights:
            raise InvalidProblemError(
                f"baracuda::embedding_bag: the descriptor says per_sample_weights={d.per_sample_weights}"
            )
        if args.per_sample_weights is not None:
            self._check_tensor("per_sample_weights", args.per_sample_weights, d.indices_shape, d.dtype)
        self._check_tensor("output", args.output, (d.num_bags, d.embedding_dim), d.dtype)
        self._check_tensor("offset2bag", args.offset2bag, (d.num_indices,), torch.int64)
        self._check_tensor("bag_size", args.bag_size, (d.num_bags,), torch.int64)
        max_shape = (d.num_bags, d.embedding_dim) if d.mode_enum == 2 else (0,)
        self._check_tensor("max_positions", args.max_positions, max_shape, torch.int64)

    def run(self, args: EmbeddingBagArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        d = self.desc
        with plan_errors():
            torch.ops.baracuda.embedding_bag.out(
                args.weight, args.indices, args.offsets, d.mode_enum, args.per_sample_weights,
                d.include_last_offset, d.padding, output=args.output, offset2bag=args.offset2bag,
                bag_size=args.bag_size, max_positions=args.max_positions,
            )


@dataclass(frozen=True)
class EmbeddingBagBackwardDescriptor:
    """The backward of one embedding_bag problem (``num_bags`` rows of grad)."""

    num_embeddings: int
    embedding_dim: int
    indices_shape: tuple[int, ...]
    num_bags: int
    mode: str = "mean"
    dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int64
    per_sample_weights: bool = False
    padding_idx: int | None = None
    device: torch.device | str = "cpu"

    def _forward(self) -> EmbeddingBagDescriptor:
        shape = tuple(self.indices_shape)
        return EmbeddingBagDescriptor(
            self.num_embeddings, self.embedding_dim, shape, None if len(shape) == 2 else self.num_bags, self.mode,
            self.dtype, self.index_dtype, self.per_sample_weights, False, self.padding_idx, self.device,
        )


@dataclass
class EmbeddingBagBackwardArgs:
    """Inputs are the forward's outputs; ``grad_per_sample_weights`` (with ``weight``) is optional."""

    grad: torch.Tensor
    indices: torch.Tensor
    offset2bag: torch.Tensor
    bag_size: torch.Tensor
    max_positions: torch.Tensor
    grad_weight: torch.Tensor
    per_sample_weights: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    grad_per_sample_weights: torch.Tensor | None = None


class EmbeddingBagBackwardPlan(Plan):
    """Writes the dense grad_weight (and, when asked, grad_per_sample_weights) of embedding_bag."""

    op = "embedding_bag_backward"

    @classmethod
    def select(
        cls, desc: EmbeddingBagBackwardDescriptor, pref: PlanPreference = PlanPreference()
    ) -> "EmbeddingBagBackwardPlan":
        fwd = desc._forward()
        fwd.validate()
        if fwd.num_bags != desc.num_bags:
            raise InvalidProblemError(
                f"baracuda::embedding_bag_backward: num_bags {desc.num_bags} != indices_shape[0] "
                f"{desc.indices_shape[0]} for 2-D indices"
            )
        return cls(desc, pref, fwd.problem())

    @property
    def index_dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.desc.index_dtype

    def can_implement(self, args: EmbeddingBagBackwardArgs) -> None:
        d = self.desc
        fwd = d._forward()
        self._check_tensor("grad", args.grad, (d.num_bags, d.embedding_dim), d.dtype)
        self._check_tensor("indices", args.indices, d.indices_shape, d.index_dtype)
        self._check_tensor("offset2bag", args.offset2bag, (fwd.num_indices,), torch.int64)
        self._check_tensor("bag_size", args.bag_size, (d.num_bags,), torch.int64)
        if fwd.mode_enum == 2:
            self._check_tensor("max_positions", args.max_positions, (d.num_bags, d.embedding_dim), torch.int64)
        self._check_tensor("grad_weight", args.grad_weight, (d.num_embeddings, d.embedding_dim), d.dtype)
        if (args.per_sample_weights is not None) != d.per_sample_weights:
            raise InvalidProblemError(
                f"baracuda::embedding_bag_backward: the descriptor says per_sample_weights={d.per_sample_weights}"
            )
        if args.grad_per_sample_weights is not None:
            if args.weight is None:
                raise InvalidProblemError(
                    "baracuda::embedding_bag_backward: grad_per_sample_weights needs weight in the args"
                )
            self._check_tensor("weight", args.weight, (d.num_embeddings, d.embedding_dim), d.dtype)
            self._check_tensor("grad_per_sample_weights", args.grad_per_sample_weights, d.indices_shape, d.dtype)

    def run(self, args: EmbeddingBagBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        buffer = self._workspace(workspace)
        fwd = self.desc._forward()
        with plan_errors():
            torch.ops.baracuda.embedding_bag_backward.out(
                args.grad, args.indices, args.offset2bag, args.bag_size, args.max_positions, fwd.num_embeddings,
                fwd.mode_enum, args.per_sample_weights, fwd.padding, grad_weight=args.grad_weight, workspace=buffer,
            )
            if args.grad_per_sample_weights is not None:
                torch.ops.baracuda.embedding_bag_per_sample_weights_backward.out(
                    args.grad, args.weight, args.indices, args.offset2bag, fwd.mode_enum, fwd.padding,
                    grad_per_sample_weights=args.grad_per_sample_weights,
                )
