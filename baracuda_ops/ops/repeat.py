"""repeat family: ``Tensor.repeat`` and its backward (a deterministic tile sum).

``repeat(x, repeats)[i] = x[i_d mod s_d for each d]`` with x padded on the left
to ``len(repeats)`` dims; ``repeat_backward(grad, repeats, input_shape)[c] =
sum over the repeat grid k of grad[c + k * input_shape]`` (extra leading dims
summed away), in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _dtensor
from .._autograd import differentiable_op
from .._vmap import arg_dims, per_sample, sample_meta
from .._errors import BaracudaValueError, check_numel, check_same_device, raise_typed_error
from .._plan import InvalidProblemError, Plan, PlanPreference, PrecisionGuarantee, Workspace, plan_errors

__all__ = [
    "repeat",
    "RepeatDescriptor",
    "RepeatArgs",
    "RepeatPlan",
    "RepeatBackwardDescriptor",
    "RepeatBackwardArgs",
    "RepeatBackwardPlan",
]


def repeat(x: torch.Tensor, repeats: Sequence[int]) -> torch.Tensor:
    """Same result as ``x.repeat(*repeats)``; differentiable (twice)."""
    try:
        return _Repeat(x, repeats)
    except (TypeError, RuntimeError) as e:
        raise_typed_error("repeat", e, locals(), sequences=("repeats",))


def _output_shape(op: str, input_shape: Sequence, repeats: Sequence) -> list:
    if len(repeats) < len(input_shape):
        raise BaracudaValueError(
            f"baracuda::{op}: repeats {list(repeats)} has {len(repeats)} entries but the input has "
            f"{len(input_shape)} dims; expected at least {len(input_shape)}"
        )
    for r in repeats:
        if isinstance(r, int) and r < 0:
            raise BaracudaValueError(f"baracuda::{op}: repeats must be >= 0, got {list(repeats)}")
    padded = [1] * (len(repeats) - len(input_shape)) + list(input_shape)
    check_numel(op, "input_shape", input_shape)
    out = [s * r for s, r in zip(padded, repeats)]
    check_numel(op, "the output shape", out)
    return out


@torch.library.register_fake("baracuda::repeat")
def _repeat_fake(x, repeats):
    check_same_device("repeat", locals())
    return x.new_empty(_output_shape("repeat", x.shape, repeats))


@torch.library.register_fake("baracuda::repeat.out")
def _repeat_out_fake(x, repeats, *, out):
    check_same_device("repeat", locals())
    return None


@torch.library.register_fake("baracuda::repeat_backward")
def _repeat_backward_fake(grad, repeats, input_shape):
    check_same_device("repeat_backward", locals())
    expected = _output_shape("repeat_backward", input_shape, repeats)
    if grad.dim() != len(expected):
        raise BaracudaValueError(f"baracuda::repeat_backward: grad shape {list(grad.shape)} != expected {expected}")
    return grad.new_empty(list(input_shape))


@torch.library.register_fake("baracuda::repeat_backward.out")
def _repeat_backward_out_fake(grad, repeats, input_shape, *, grad_input, workspace):
    check_same_device("repeat_backward", locals())
    return None


def _repeat_setup_context(ctx, inputs, output):
    x, repeats = inputs
    ctx.repeats = repeats
    ctx.input_shape = x.shape


def _repeat_autograd(ctx, grad):
    return _RepeatBackward(grad, ctx.repeats, ctx.input_shape), None


def _repeat_jvp(ctx, x_tangent, _):
    return _Repeat(x_tangent, ctx.repeats)  # linear


def _repeat_backward_setup_context(ctx, inputs, output):
    _, repeats, input_shape = inputs
    ctx.repeats = repeats
    ctx.input_shape = input_shape


def _repeat_backward_autograd(ctx, grad_grad_input):
    return _Repeat(grad_grad_input, ctx.repeats), None, None


def _repeat_backward_jvp(ctx, grad_tangent, _repeats, _input_shape):
    return _RepeatBackward(grad_tangent, ctx.repeats, ctx.input_shape)  # linear


_Repeat = differentiable_op("repeat", _repeat_autograd, _repeat_setup_context, _repeat_jvp)
_RepeatBackward = differentiable_op("repeat_backward", _repeat_backward_autograd, _repeat_backward_setup_context,
                                    _repeat_backward_jvp)


# --------------------------------------------------------------------------- vmap
#
# The samples are one more leading dim, repeated once: x [n, 1, .., 1, *S] (S padded on the
# left to len(repeats) dims) with repeats [1, *repeats], and the backward's tile sums with it.


@torch.library.register_vmap("baracuda::repeat")
def _repeat_vmap(info, in_dims, x, repeats):
    x_dim = arg_dims(in_dims, 2)[0]
    _repeat_fake(sample_meta(x, x_dim), repeats)  # a sample's checks, with its shape in the message
    x = x.movedim(x_dim, 0)
    x = x[(slice(None),) + (None,) * (len(repeats) - (x.dim() - 1))]
    return torch.ops.baracuda.repeat(x, [1, *repeats]), 0


@torch.library.register_vmap("baracuda::repeat_backward")
def _repeat_backward_vmap(info, in_dims, grad, repeats, input_shape):
    grad_dim = arg_dims(in_dims, 3)[0]
    if list(sample_meta(grad, grad_dim).shape) != _output_shape("repeat_backward", input_shape, repeats):
        return per_sample(torch.ops.baracuda.repeat_backward.default, info.batch_size, arg_dims(in_dims, 3), grad,
                          repeats, input_shape)
    grad = grad.movedim(grad_dim, 0)
    padded = [1] * (len(repeats) - len(input_shape)) + list(input_shape)
    grad_input = torch.ops.baracuda.repeat_backward(grad, [1, *repeats], [grad.shape[0], *padded])
    return grad_input.reshape(grad.shape[0], *input_shape), 0


# --------------------------------------------------------------------------- DTensor sharding
#
# repeat is linear: Replicate and Partial pass through, and so does a Shard of an input dim that
# is repeated once (the output's dim, counted after the extra leading repeat dims, sharded
# alike); a dim repeated more than once is gathered first (its tiles interleave the shards). The
# backward mirrors it; a Shard of one of the grad's extra leading dims (summed away) gives a
# Partial(sum) gradient. The backward runs on the local shards with the local sizes in
# ``repeats`` and ``input_shape``.


def _register_sharding() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    def strategies(repeats, input_dims: int, extra: int, backward: bool) -> list:
        tail = [None, None] if backward else [None]
        found = [([Replicate()], [Replicate(), *tail]), ([Partial()], [Partial(), *tail])]
        for d in range(input_dims):
            if repeats[extra + d] == 1:
                x_shard, y_shard = (Shard(extra + d), Shard(d)) if backward else (Shard(d), Shard(extra + d))
                found.append(([y_shard], [x_shard, *tail]))
        if backward:
            found += [([Partial()], [Shard(e), *tail]) for e in range(extra)]
        return found

    @_dtensor.rule([torch.ops.baracuda.repeat.default])
    def _repeat_sharding(x, repeats):
        return strategies(repeats, x.ndim, len(repeats) - x.ndim, backward=False)

    def local_backward(shards, grad, repeats, input_shape):
        extra = len(repeats) - len(input_shape)
        local_repeats = [grad.shape[e] for e in range(extra)] + list(repeats[extra:])
        local_shape = [grad.shape[extra + d] if repeats[extra + d] == 1 else size
                       for d, size in enumerate(input_shape)]
        return torch.ops.baracuda.repeat_backward(grad, local_repeats, local_shape)

    @_dtensor.rule([torch.ops.baracuda.repeat_backward.default], local=local_backward)
    def _repeat_backward_sharding(grad, repeats, input_shape):
        return strategies(repeats, len(input_shape), len(repeats) - len(input_shape), backward=True)


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- Plan API


@dataclass(frozen=True)
class RepeatDescriptor:
    input_shape: tuple[int, ...]
    repeats: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device | str = "cpu"

    @property
    def output_shape(self) -> tuple[int, ...]:
        with plan_errors():
            return tuple(_output_shape("repeat", self.input_shape, self.repeats))


@dataclass
class RepeatArgs:
    input: torch.Tensor
    out: torch.Tensor


def _problem(input_shape: Sequence[int], repeats: Sequence[int]) -> list[int]:
    return [len(input_shape), *input_shape, *repeats]


class RepeatPlan(Plan):
    """Writes ``input.repeat(*repeats)`` into ``args.out``."""

    op = "repeat"

    @classmethod
    def select(cls, desc: RepeatDescriptor, pref: PlanPreference = PlanPreference()) -> "RepeatPlan":
        desc.output_shape  # validates
        return cls(desc, pref, _problem(desc.input_shape, desc.repeats))

    def precision_guarantee(self) -> PrecisionGuarantee:
        # A pure copy: exact in every dtype.
        return PrecisionGuarantee(self.desc.dtype, self.desc.dtype, True, True)

    def can_implement(self, args: RepeatArgs) -> None:
        self._check_tensor("input", args.input, self.desc.input_shape, self.desc.dtype)
        self._check_tensor("out", args.out, self.desc.output_shape, self.desc.dtype)

    def run(self, args: RepeatArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        with plan_errors():
            torch.ops.baracuda.repeat.out(args.input, list(self.desc.repeats), out=args.out)


@dataclass(frozen=True)
class RepeatBackwardDescriptor:
    input_shape: tuple[int, ...]
    repeats: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device | str = "cpu"

    @property
    def grad_shape(self) -> tuple[int, ...]:
        with plan_errors():
            return tuple(_output_shape("repeat_backward", self.input_shape, self.repeats))


@dataclass
class RepeatBackwardArgs:
    grad: torch.Tensor
    grad_input: torch.Tensor


class RepeatBackwardPlan(Plan):
    """Writes the gradient of ``repeat`` w.r.t. its input into ``args.grad_input``."""

    op = "repeat_backward"

    @classmethod
    def select(
        cls, desc: RepeatBackwardDescriptor, pref: PlanPreference = PlanPreference()
    ) -> "RepeatBackwardPlan":
        desc.grad_shape  # validates
        if desc.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise InvalidProblemError(
                f"baracuda::repeat_backward: grad must be float16, bfloat16, float32 or float64, got {desc.dtype}"
            )
        return cls(desc, pref, _problem(desc.input_shape, desc.repeats))

    def can_implement(self, args: RepeatBackwardArgs) -> None:
        self._check_tensor("grad", args.grad, self.desc.grad_shape, self.desc.dtype)
        self._check_tensor("grad_input", args.grad_input, self.desc.input_shape, self.desc.dtype)

    def run(self, args: RepeatBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        buffer = self._workspace(workspace)
        with plan_errors():
            torch.ops.baracuda.repeat_backward.out(
                args.grad,
                list(self.desc.repeats),
                list(self.desc.input_shape),
                grad_input=args.grad_input,
                workspace=buffer,
            )
