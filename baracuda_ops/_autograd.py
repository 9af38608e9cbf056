"""Autograd of the ``torch.ops.baracuda.*`` ops, in a form torch.func can transform too.

``torch.library.register_autograd`` gives an op its gradient for ordinary autograd (and for
``torch.compile`` and ``torch.export``), but through an ``autograd.Function`` that torch.func's
transforms (``grad``, ``vjp``, ``jacrev``, ``vmap`` of them) refuse: "must override the
setup_context staticmethod" (open PyTorch issues pytorch#168393, pytorch#170834), so a
per-sample gradient or a Jacobian through a custom op fails. ``register_autograd`` here
registers the two functions that way and also returns an ``autograd.Function`` built from them
with a ``setup_context`` staticmethod. The public functions and the backward formulas call ops
through ``DifferentiableOp``, which applies that Function under torch.func's transforms (under
torch.func every op a backward formula calls must be differentiable the torch.func way too).
Calling the Function from the op's Autograd kernel instead does not work: under torch.func an
autograd.Function must be applied above the dispatcher.
"""

from __future__ import annotations

from typing import Callable

import torch


class DifferentiableOp:
    """An op of ours with its autograd.Function (see the module docstring)."""

    def __init__(self, op: torch._ops.OpOverload, function: type[torch.autograd.Function]):
        self.op = op
        self.function = function

    def __call__(self, *args):
        """The op; under torch.func's transforms through its Function. Elsewhere the op itself,
        with its registered autograd (the same gradients): applying the Function costs about 9
        us more per call on the host, and Dynamo cannot trace an autograd.Function applied
        inside another's backward."""
        if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
            return self.function.apply(*args)
        return self.op(*args)


def register_autograd(name: str, backward: Callable, setup_context: Callable) -> DifferentiableOp:
    """Registers ``backward`` and ``setup_context`` as the autograd of ``torch.ops.baracuda.<name>``
    (as ``torch.library.register_autograd``: ``setup_context(ctx, inputs, output)`` saves what
    ``backward(ctx, *grad_outputs)`` needs, which returns a gradient or None per op input) and
    returns the op with an autograd.Function built from them."""
    torch.library.register_autograd(f"baracuda::{name}", backward, setup_context=setup_context)
    op = getattr(torch.ops.baracuda, name).default

    class Function(torch.autograd.Function):
        # vmap through the op: each op call under vmap, by PyTorch's per-sample fallback for
        # ops without a batching rule (correct; it warns that it is slow).
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

    Function.__name__ = Function.__qualname__ = f"{name}_function"
    return DifferentiableOp(op, Function)
