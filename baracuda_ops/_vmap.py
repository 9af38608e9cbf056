"""Batching rules (``torch.vmap``) of the ``torch.ops.baracuda.*`` ops: the helpers they share.

Without a rule, vmap runs an op once per sample (PyTorch's fallback, with a performance
warning). A family's rule (``torch.library.register_vmap``, next to the op's fake) instead
folds the vmapped dim into a dim the op already runs over (the rows of rms_norm, the batch of
alibi and fractional_max_pool, the heads of alibi where the slopes differ per sample, a
leading dim of repeat, the bags of embedding_bag and the rows of its stacked tables) and calls
the op once; where no dim can take it (a weight that differs per sample in rms_norm), and for
inputs that are wrong per sample (so that the op's own error names them), the rule calls the
op once per sample itself (:func:`per_sample`).

A rule calls the ops themselves (``torch.ops.baracuda.*``), not their ``DifferentiableOp``:
it runs below the vmap level, where applying an autograd.Function fails (PyTorch's
``custom_function_call`` has no kernel for ``FuncTorchVmapMode``). A transform outside the vmap
(``grad`` of ``vmap``) differentiates the autograd.Function that the public function applied
around the vmapped op, so it never needs the gradient of a rule's op call.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def arg_dims(in_dims: Sequence, count: int) -> tuple:
    """``in_dims`` for an op's ``count`` arguments: PyTorch passes a rule only the arguments
    given (the trailing ones left at their defaults dropped) and, for a list argument, a list;
    here each argument's vmapped dim, None where it has none."""
    dims = [d if isinstance(d, int) else None for d in in_dims]
    return tuple(dims + [None] * (count - len(dims)))


def batch_first(x: torch.Tensor | None, bdim: int | None, size: int) -> torch.Tensor | None:
    """``x`` with its vmapped dim first; an unbatched ``x`` (``bdim`` None) expanded to ``size``
    samples (a view, no copy)."""
    if x is None:
        return None
    return x.expand(size, *x.shape) if bdim is None else x.movedim(bdim, 0)


def sample_meta(x: torch.Tensor | None, bdim: int | None) -> torch.Tensor | None:
    """A meta tensor with the shape and dtype of one sample of ``x``: for checking the
    arguments one sample gives (the ops' fakes run on it) before folding the batch."""
    if x is None:
        return None
    shape = list(x.shape)
    if bdim is not None:
        del shape[bdim]
    return torch.empty(shape, dtype=x.dtype, device="meta")


def per_sample(op: Callable, batch_size: int, in_dims: Sequence[int | None], *args: Any):
    """The op once per sample, its tensor outputs stacked on dim 0 (an output that is None stays
    None, out dim None): for a batch no single call can take, and for arguments that are wrong
    per sample (the first sample's call then raises the op's error)."""

    def sample(k: int, on_meta: bool = False):
        picked = []
        for a, d in zip(args, in_dims):
            if isinstance(a, torch.Tensor) and on_meta:
                a = sample_meta(a, d)
            elif d is not None:  # (arg_dims: only a tensor argument has a vmapped dim)
                a = a.select(d, k)
            picked.append(a)
        return op(*picked)

    if batch_size > 0:
        outs = [sample(k) for k in range(batch_size)]
        first = outs[0]

        def stacked(i):
            return torch.stack([o if i is None else o[i] for o in outs])
    else:  # no sample to run: the output shapes of one, from the op's fake
        first = sample(0, on_meta=True)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))

        def stacked(i):
            o = first if i is None else first[i]
            return torch.empty((0, *o.shape), dtype=o.dtype, device=device)

    if not isinstance(first, tuple):
        return stacked(None), 0
    result = tuple(None if o is None else stacked(i) for i, o in enumerate(first))
    return result, tuple(None if r is None else 0 for r in result)
