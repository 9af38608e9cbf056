"""The exception classes the ops raise, compatible with PyTorch's.

PyTorch raises ``RuntimeError`` for most misuse of these ops (a bad offset, an
out-of-range index, a shape mismatch), ``TypeError`` for an argument of the
wrong Python type and ``NotImplementedError`` for an unsupported combination.
Our errors keep their more precise type and are also what PyTorch raises, so
code and tests written around PyTorch keep catching them:

- ``BaracudaValueError(ValueError, RuntimeError)``: a bad value or shape;
- ``BaracudaIndexError(IndexError, RuntimeError)``: an index out of range;
- ``BaracudaTypeError(TypeError, NotImplementedError)``: a wrong dtype or argument type
  (PyTorch raises NotImplementedError, a RuntimeError, for a dtype a kernel does not take);
- ``BaracudaNotImplementedError(NotImplementedError)``: a valid call no kernel
  implements (NotImplementedError is a RuntimeError already).

The C++ checks raise the same classes (``_C._set_error_types`` below hands
them to the extension once), whether the op is called directly, from the
autograd engine or from a compiled graph; the fakes and the Python wrappers
raise them too. Every message starts with ``baracuda::<op>:``.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from . import _C


class BaracudaValueError(ValueError, RuntimeError):
    """A bad value, shape or size (PyTorch: RuntimeError)."""


class BaracudaIndexError(IndexError, RuntimeError):
    """An index out of range (PyTorch: RuntimeError on CPU)."""


class BaracudaTypeError(TypeError, NotImplementedError):
    """A dtype the op does not take (PyTorch: NotImplementedError "not implemented for", or a
    RuntimeError for mismatched dtypes), or an argument of the wrong Python type (TypeError).
    NotImplementedError is a RuntimeError."""


class BaracudaNotImplementedError(NotImplementedError):
    """A valid call that no kernel implements."""


_C._set_error_types(BaracudaValueError, BaracudaIndexError, BaracudaTypeError, BaracudaNotImplementedError)


def check_same_device(op: str, arguments: dict) -> None:
    """The fakes' device check (``check_same_device(op, locals())`` first in a
    fake): every tensor argument on the first one's device, as the C++ checks
    require of real tensors. A ``meta`` argument next to CPU tensors dispatches
    the call to the fake, so this is where that mix is rejected."""
    first_name, first = None, None
    for name, t in arguments.items():
        if not isinstance(t, torch.Tensor):
            continue
        if first is None:
            first_name, first = name, t
        elif t.device != first.device:
            raise BaracudaValueError(
                f"baracuda::{op}: {name} is on {t.device} but {first_name} is on {first.device}"
            )


def check_numel(op: str, name: str, shape) -> None:
    """The fakes' counterpart of the C++ checked_numel: sizes >= 0 whose
    product fits in int64 (symbolic sizes are left to the kernel's check)."""
    if not all(isinstance(s, int) for s in shape):
        return
    n = 1
    for s in shape:
        if s < 0:
            raise BaracudaValueError(f"baracuda::{op}: {name} must be >= 0, got {list(shape)}")
        n *= s
    if n >= 2**63:
        raise BaracudaValueError(f"baracuda::{op}: the number of elements of {name} {list(shape)} overflows int64")


def check_index_range(op: str, indices: torch.Tensor, num_weights: int) -> None:
    """Every index in [0, num_weights) (the op's own check, for a caller that uses the
    indices before the op does: embedding_bag's max_norm renorm). Skipped while torch.compile
    traces (a data-dependent branch): a compiled graph reports the op's own check instead."""
    if torch.compiler.is_compiling():
        return
    if indices.numel() > 0 and not bool(((indices >= 0) & (indices < num_weights)).all()):
        bad = indices[(indices < 0) | (indices >= num_weights)][0].item()
        raise BaracudaIndexError(
            f"baracuda::{op}: index {bad} is out of range for a weight of {num_weights} rows"
        )


def _is_int(value) -> bool:
    return not isinstance(value, bool) and hasattr(type(value), "__index__") or isinstance(value, torch.SymInt)


def _is_int_sequence(value) -> bool:
    return isinstance(value, (list, tuple, torch.Size)) and all(_is_int(v) for v in value)


def raise_typed_error(op: str, error: Exception, arguments: dict, sequences: tuple = (),
                              tensors: tuple = ()) -> NoReturn:
    """Called from an ``except`` around a wrapper's body (free when the call succeeds): an
    argument of the wrong Python type becomes a BaracudaTypeError naming the op and the
    argument; a NotImplementedError or IndexError from PyTorch code the wrapper runs first (the
    random samples of an integer input, a dim of a too-small input) becomes ours, of the same
    type, naming the op; our own errors and any other are re-raised as they are. ``sequences`` names the
    arguments that must be int sequences (the wrapper converts them before the op's schema
    sees them), ``tensors`` those that must be tensors or None (the wrapper reads their
    attributes first); the others are named by the schema parser's message ("... for argument 'eps'")."""
    if isinstance(error, (BaracudaValueError, BaracudaIndexError, BaracudaTypeError, BaracudaNotImplementedError)):
        raise error
    message = str(error)
    for name in sequences:
        value = arguments.get(name)
        if not (_is_int(value) or _is_int_sequence(value)):
            raise BaracudaTypeError(
                f"baracuda::{op}: {name} must be an int or a sequence of ints, got {type(value).__name__} {value!r}"
            ) from error
    for name in tensors:
        value = arguments.get(name)
        if value is not None and not isinstance(value, torch.Tensor):
            raise BaracudaTypeError(
                f"baracuda::{op}: {name} must be a Tensor, got {type(value).__name__} {value!r}"
            ) from error
    for name, value in arguments.items():
        if f"argument '{name}'" in message:
            raise BaracudaTypeError(
                f"baracuda::{op}: argument {name} has the wrong type: {type(value).__name__} {value!r} ({message})"
            ) from error
    if isinstance(error, NotImplementedError):
        raise BaracudaNotImplementedError(f"baracuda::{op}: {message}") from error
    if isinstance(error, IndexError):
        raise BaracudaIndexError(f"baracuda::{op}: {message}") from error
    raise error


__all__ = [
    "BaracudaValueError",
    "BaracudaIndexError",
    "BaracudaTypeError",
    "BaracudaNotImplementedError",
]
