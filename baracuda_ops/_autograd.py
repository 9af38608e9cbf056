"""Autograd of the ``torch.ops.baracuda.*`` ops, in a form torch.func can transform too.

``torch.library.register_autograd`` gives an op its gradient for ordinary autograd (and for
``torch.compile`` and ``torch.export``), but through an ``autograd.Function`` that torch.func's
transforms (``grad``, ``vjp``, ``jacrev``, ``vmap`` of them) refuse: "must override the
setup_context staticmethod" (open PyTorch issues pytorch#168393, pytorch#170834), so a
per-sample gradient or a Jacobian through a custom op fails; and torch.library has no way to
give a custom op forward-mode AD (``jvp``, ``jacfwd``, ``torch.autograd.forward_ad``).
``register_autograd`` here registers the two functions that way and also returns an
``autograd.Function`` built from them with a ``setup_context`` staticmethod (and the op's
``jvp``). The public functions, the backward formulas and the jvps call ops through
``DifferentiableOp``, which applies that Function under torch.func's transforms and forward-mode
AD (there every op a formula calls must be differentiable the same way).
Calling the Function from the op's Autograd kernel instead does not work: under torch.func an
autograd.Function must be applied above the dispatcher.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import forward_ad


class DifferentiableOp:
    """An op of ours with its autograd.Function (see the module docstring)."""

    def __init__(self, op: torch._ops.OpOverload, function: type[torch.autograd.Function]):
        self.op = op
        self.function = function

    def __call__(self, *args):
        """The op; under torch.func's transforms and forward-mode AD (``torch.autograd.forward_ad``,
        whose tangents only the Function's ``jvp`` carries) through its Function. Elsewhere the
        op itself, with its registered autograd (the same gradients): applying the Function
        costs about 9 us more per call on the host, and Dynamo cannot trace an
        autograd.Function applied inside another's backward, nor one with a ``jvp``."""
        if not torch.compiler.is_compiling() and (torch._C._are_functorch_transforms_active()
                                                  or forward_ad._current_level >= 0):
            return self.function.apply(*args)
        return self.op(*args)


def register_autograd(name: str, backward: Callable, setup_context: Callable,
                      jvp: Callable | None = None) -> DifferentiableOp:
    """Registers ``backward`` and ``setup_context`` as the autograd of ``torch.ops.baracuda.<name>``
    (as ``torch.library.register_autograd``: ``setup_context(ctx, inputs, output)`` saves what
    ``backward(ctx, *grad_outputs)`` needs, which returns a gradient or None per op input) and
    returns the op with an autograd.Function built from them; with ``jvp(ctx, *input_tangents)``
    (a tangent or None per output; what it needs saved by setup_context with
    ``ctx.save_for_forward``) the Function has forward-mode AD too (torch.func.jvp, jacfwd,
    torch.autograd.forward_ad), which torch.library cannot register for a custom op."""
    torch.library.register_autograd(f"baracuda::{name}", backward, setup_context=setup_context)
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


def register_without_backward(name: str, message: str) -> DifferentiableOp:
    """``torch.ops.baracuda.<name>`` (a backward op) with a backward that raises
    NotImplementedError(message): its gradient, a second derivative of the forward op, is
    not supported, and a clear error beats a silent zero."""

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, *grads):
        raise NotImplementedError(message)

    return register_autograd(name, backward, setup_context)
