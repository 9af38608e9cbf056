"""repeat family: ``Tensor.repeat`` and its backward (a deterministic tile sum).

``repeat(x, repeats)[i] = x[i_d mod s_d for each d]`` with x padded on the left
to ``len(repeats)`` dims; ``repeat_backward(grad, repeats, input_shape)[c] =
sum over the repeat grid k of grad[c + k * input_shape]`` (extra leading dims
summed away), in a fixed order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .._autograd import differentiable_op
from .._vmap import arg_dims, per_sample, sample_meta
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
    return _Repeat(x, repeats)


def _output_shape(op: str, input_shape: Sequence, repeats: Sequence) -> list:
    if len(repeats) < len(input_shape):
        raise ValueError(
            f"baracuda::{op}: repeats {list(repeats)} has {len(repeats)} entries but the input has "
            f"{len(input_shape)} dims; expected at least {len(input_shape)}"
        )
    for r in repeats:
        if isinstance(r, int) and r < 0:
            raise ValueError(f"baracuda::{op}: repeats must be >= 0, got {list(repeats)}")
    padded = [1] * (len(repeats) - len(input_shape)) + list(input_shape)
    return [s * r for s, r in zip(padded, repeats)]


@torch.library.register_fake("baracuda::repeat")
def _repeat_fake(x, repeats):
    return x.new_empty(_output_shape("repeat", x.shape, repeats))


@torch.library.register_fake("baracuda::repeat.out")
def _repeat_out_fake(x, repeats, *, out):
    return None


@torch.library.register_fake("baracuda::repeat_backward")
def _repeat_backward_fake(grad, repeats, input_shape):
    expected = _output_shape("repeat_backward", input_shape, repeats)
    if grad.dim() != len(expected):
        raise ValueError(f"baracuda::repeat_backward: grad shape {list(grad.shape)} != expected {expected}")
    return grad.new_empty(list(input_shape))


@torch.library.register_fake("baracuda::repeat_backward.out")
def _repeat_backward_out_fake(grad, repeats, input_shape, *, grad_input, workspace):
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


# --------------------------------------------------------------------------- self-check and benchmarks


def _reference_backward(grad: torch.Tensor, repeats: Sequence[int], input_shape: Sequence[int]) -> torch.Tensor:
    """What PyTorch's autograd does for Tensor.repeat: view grad as [r0, s0, r1, s1, ...] and sum the r's."""
    shape = [1] * (len(repeats) - len(input_shape)) + list(input_shape)
    split = [d for r, s in zip(repeats, shape) for d in (r, s)]
    return grad.reshape(split).sum(dim=tuple(range(0, 2 * len(repeats), 2))).reshape(input_shape)


def self_checks():
    from ..bench import SelfCheck

    # Odd rows (scalar path), 16-byte rows (vector path), many tiles (split path), empty.
    cases = [((5, 7), (3, 2, 3)), ((4, 64), (2, 3)), ((64,), (300, 1)), ((0, 3), (2, 2)), ((3,), (0,))]

    def forward(dtype):
        def run(device):
            for shape, reps in cases:
                x = torch.randn(shape, device=device).to(dtype)
                assert torch.equal(repeat(x, reps), x.repeat(*reps)), f"repeat != Tensor.repeat at {shape} x {reps}"

        return run

    def backward(dtype):
        def run(device):
            for shape, reps in cases:
                g = torch.randn(_output_shape("repeat", shape, reps), device=device, dtype=dtype)
                ours = torch.ops.baracuda.repeat_backward(g, list(reps), list(shape))
                ref = _reference_backward(g.double(), reps, shape)
                tol = {torch.float16: 3e-2, torch.bfloat16: 2e-1}.get(dtype, 1e-4)
                torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)

        return run

    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return [SelfCheck("repeat", d, forward(d)) for d in floats + (torch.int64, torch.bool)] + [
        SelfCheck("repeat_backward", d, backward(d)) for d in floats
    ]


def benchmarks(device: torch.device, full: bool):
    from ..bench import BenchCase

    shapes = [
        ((4096,), (8192, 1), "bias"),
        ((8192, 1024), (4, 1), "rows"),
        ((8192, 256), (1, 16), "cols"),
        ((32, 64, 56, 56), (1, 1, 2, 2), "image"),
        ((1024, 1024), (16, 1, 1), "leading"),
    ]
    if full:
        shapes.append(((16384, 4096), (2, 1), "large"))
    dtypes = (torch.float32, torch.bfloat16)
    if device.type == "cpu":  # keep the CPU run short: 1/16 of the work
        shapes = [((4096,), (512, 1), "bias"), ((512, 1024), (4, 1), "rows"), ((512, 256), (1, 16), "cols"),
                  ((2, 64, 56, 56), (1, 1, 2, 2), "image"), ((64, 1024), (16, 1, 1), "leading")]
    cases = []
    for shape, reps, label in shapes:
        for dtype in dtypes:
            numel = math.prod(shape)
            out_numel = numel * math.prod(reps)
            size = torch.tensor([], dtype=dtype).element_size()
            tag = f"{label} {list(shape)}x{tuple(reps)} {str(dtype).replace('torch.', '')}"

            def fwd_inputs(shape=shape, dtype=dtype):
                return (torch.randn(shape, device=device, dtype=dtype),)

            def bwd_inputs(shape=shape, reps=reps, dtype=dtype):
                return (torch.randn(_output_shape("repeat", shape, reps), device=device, dtype=dtype),)

            cases.append(BenchCase(
                "repeat", f"repeat {tag}", (numel + out_numel) * size, fwd_inputs,
                ours=lambda x, reps=reps: torch.ops.baracuda.repeat(x, list(reps)),
                peers={"eager": lambda x, reps=reps: x.repeat(*reps)},
                compile_peer=lambda x, reps=reps: x.repeat(*reps),
            ))
            cases.append(BenchCase(
                "repeat", f"repeat_backward {tag}", (numel + out_numel) * size, bwd_inputs,
                ours=lambda g, reps=reps, shape=shape: torch.ops.baracuda.repeat_backward(g, list(reps), list(shape)),
                # The ops PyTorch's autograd runs for Tensor.repeat's backward (view + sum).
                peers={"eager": lambda g, reps=reps, shape=shape: _reference_backward(g, reps, shape)},
                compile_peer=lambda g, reps=reps, shape=shape: _reference_backward(g, reps, shape),
            ))
    return cases
