"""Autograd of the ``torch.ops.baracuda.*`` ops under torch.func and forward-mode AD.

Each op's gradient is a C++ autograd kernel (``csrc/autograd/<family>.cpp``, the Autograd
dispatch key) that calls the family's backward op: an eager ``backward()`` never enters Python,
and ``torch.compile`` and ``torch.export`` trace it (AOTAutograd runs the C++ kernel on fake
tensors). A C++ autograd Function refuses torch.func's transforms ("cannot use C++
torch::autograd::Function with functorch transforms") and has no forward-mode AD, which
torch.library cannot give a custom op either; so each op also has an ``autograd.Function`` built
from Python formulas (``backward`` and ``jvp``, from what ``setup_context`` saved), with a
``setup_context`` staticmethod as torch.func requires, which :class:`DifferentiableOp` applies in
place of the op only while a torch.func transform or a forward-AD level is active
(``grad``, ``vjp``, ``jacrev``, ``vmap``, ``jvp``, ``jacfwd``, ``torch.autograd.forward_ad``).
Everywhere else a DifferentiableOp is the op itself, after two flag reads. Inside the Function
the op runs with the transforms' layers lowered, where its C++ kernel is allowed.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import forward_ad


_transforms_active = torch._C._are_functorch_transforms_active


class DifferentiableOp:
    """An op of ours with its forward-mode autograd.Function (see the module docstring)."""

    __slots__ = ("op", "function")

    def __init__(self, op: torch._ops.OpOverload, function: type[torch.autograd.Function]):
        self.op = op
        self.function = function

    def __call__(self, *args):
        """The op; under torch.func's transforms and forward-mode AD (tangents only the
        Function's ``jvp`` carries) its Function. Dynamo traces the op itself (it cannot trace an
        autograd.Function with a ``jvp``)."""
        if (forward_ad._current_level >= 0 or _transforms_active()) and not torch.compiler.is_compiling():
            return self.function.apply(*args)
        return self.op(*args)


def differentiable_op(name: str, backward: Callable, setup_context: Callable,
                      jvp: Callable | None = None) -> DifferentiableOp:
    """``torch.ops.baracuda.<name>`` with an autograd.Function built from ``setup_context(ctx,
    inputs, output)`` (saves what the others need, ``ctx.save_for_forward`` for the jvp),
    ``backward(ctx, *grad_outputs)`` (a gradient or None per op input: what the C++ kernel
    computes, for a backward through the Function, e.g. ``jacrev`` of ``jacfwd``) and
    ``jvp(ctx, *input_tangents)`` (a tangent or None per output)."""
    op = getattr(torch.ops.baracuda, name).default

    class Function(torch.autograd.Function):
        # vmap of the Function runs forward under vmap, where each op's batching rule
        # (baracuda_ops/_vmap.py) runs the op once for the whole batch.
        generate_vmap_rule = True

        @staticmethod
        def forward(*args):
            return op(*args)  # autograd.Function runs forward with grad mode off: the op's own autograd stays out

        @staticmethod
        def setup_context(ctx, inputs, output):
            setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    if jvp is not None:
        Function.jvp = staticmethod(jvp)
    Function.__name__ = Function.__qualname__ = f"{name}_function"
    return DifferentiableOp(op, Function)


def op_without_backward(name: str, message: str) -> DifferentiableOp:
    """``torch.ops.baracuda.<name>`` (a backward op whose C++ autograd kernel refuses a
    gradient) with a Function whose backward raises NotImplementedError(message) the same way."""

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, *grads):
        raise NotImplementedError(message)

    return differentiable_op(name, backward, setup_context)
