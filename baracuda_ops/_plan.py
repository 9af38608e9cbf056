"""Plan vocabulary shared by every op family, mirroring the seed crate's Rust surface.

A family defines a frozen ``XDescriptor`` and an ``XPlan(Plan)``:
``XPlan.select(desc, pref)`` validates the problem and records the kernel that
will run (asked from the same C++ selection code the op's launcher uses);
``can_implement(args)`` checks caller tensors; ``workspace_size()`` gives the
scratch bytes; ``run(args, workspace)`` writes into ``args``' output tensors via
the op's out-variant.
"""

from __future__ import annotations

import contextlib
import operator
import platform
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import torch

from ._errors import BaracudaNotImplementedError, BaracudaValueError


class BaracudaError(Exception):
    """Base class of every error the Plan API raises."""


class InvalidProblemError(BaracudaError, BaracudaValueError):
    """The problem or the tensors given do not describe a valid instance of the op."""


class UnsupportedError(BaracudaError, BaracudaNotImplementedError):
    """The problem is valid but no kernel here implements it (or not within the preference)."""


class BufferTooSmallError(BaracudaError, BaracudaValueError):
    """An output buffer has fewer elements than the problem writes."""


class WorkspaceTooSmallError(BaracudaError, BaracudaValueError):
    """The caller's workspace is smaller than ``workspace_size()``."""


@contextlib.contextmanager
def plan_errors() -> Iterator[None]:
    """Re-raise the ops' typed errors as the Plan API's error kinds."""
    try:
        yield
    except BaracudaError:
        raise
    except (ValueError, TypeError, IndexError) as e:  # before NotImplementedError: a dtype error is both
        raise InvalidProblemError(str(e)) from e
    except NotImplementedError as e:
        raise UnsupportedError(str(e)) from e


@dataclass(frozen=True)
class PlanPreference:
    """What the caller will accept from ``select``."""

    deterministic_only: bool = True
    max_workspace_bytes: int | None = None


@dataclass(frozen=True)
class PrecisionGuarantee:
    math_dtype: torch.dtype
    accumulator_dtype: torch.dtype
    deterministic: bool
    bit_stable_on_same_hardware: bool


@dataclass(frozen=True)
class KernelSku:
    op: str
    dtype: torch.dtype
    index_dtype: torch.dtype | None
    device_type: str
    arch: str
    backend: str
    variant: str
    precision_guarantee: PrecisionGuarantee


@dataclass(frozen=True)
class Workspace:
    """Caller-owned scratch memory: a contiguous uint8 tensor."""

    buffer: torch.Tensor

    @classmethod
    def allocate(cls, nbytes: int, device: torch.device | str) -> "Workspace":
        return cls(torch.empty(max(int(nbytes), 0), dtype=torch.uint8, device=device))

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def device_arch(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    return platform.machine()


def plan_device(op: str, device: torch.device | str) -> torch.device:
    """A descriptor's device, resolved (a bare "cuda" is the current CUDA device); a device
    this machine cannot run on is an UnsupportedError."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidProblemError(f"baracuda::{op}: device {device!r} is not a device: {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedError(f"baracuda::{op}: device {device} was asked for but CUDA is not available here")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def problem_ints(op: str, problem: Sequence[Any]) -> list[int]:
    """The problem as int64 values: every entry of every family's encoding is a size, a count or
    an enum, so an integer in [0, 2^63); a fractional, negative or oversized entry (a
    descriptor field with such a value) is an InvalidProblemError."""
    values = []
    for p in problem:
        try:
            v = operator.index(p)
        except TypeError as e:
            raise InvalidProblemError(f"baracuda::{op}: sizes must be integers, got {p!r} in {list(problem)}") from e
        if not 0 <= v < 2**63:
            raise InvalidProblemError(f"baracuda::{op}: sizes must be in [0, 2^63), got {v} in {list(problem)}")
        values.append(v)
    return values


def kernel_choice(op: str, device: torch.device, problem: Sequence[int], dtype: torch.dtype) -> tuple[str, int]:
    """(variant, workspace bytes) that op's launcher picks for this problem on this device."""
    with plan_errors():
        variant, workspace = torch.ops.baracuda._kernel_choice(op, device, problem_ints(op, problem), dtype)
    return variant, int(workspace)


class Plan:
    """Common part of every family's plan: the chosen kernel and its scratch."""

    op: ClassVar[str]
    index_dtype: ClassVar[torch.dtype | None] = None

    def __init__(self, desc: Any, pref: PlanPreference, problem: Sequence[int]) -> None:
        self.desc = desc
        self.pref = pref
        device = plan_device(self.op, desc.device)
        self._device = device
        self._variant, self._workspace_bytes = kernel_choice(self.op, device, problem, desc.dtype)
        if pref.max_workspace_bytes is not None and self._workspace_bytes > pref.max_workspace_bytes:
            raise UnsupportedError(
                f"baracuda::{self.op}: kernel {self._variant} needs {self._workspace_bytes} workspace bytes, "
                f"more than max_workspace_bytes={pref.max_workspace_bytes}"
            )

    def workspace_size(self) -> int:
        return self._workspace_bytes

    def precision_guarantee(self) -> PrecisionGuarantee:
        acc = accumulator_dtype(self.desc.dtype)
        return PrecisionGuarantee(self.desc.dtype, acc, True, True)

    def sku(self) -> KernelSku:
        return KernelSku(
            op=self.op,
            dtype=self.desc.dtype,
            index_dtype=self.index_dtype,
            device_type=self._device.type,
            arch=device_arch(self._device),
            backend=self._device.type,
            variant=self._variant,
            precision_guarantee=self.precision_guarantee(),
        )

    def _workspace(self, workspace: Workspace | None) -> torch.Tensor:
        """The caller's workspace buffer, or a fresh one when None."""
        if workspace is None:
            return Workspace.allocate(self._workspace_bytes, self._device).buffer
        if workspace.nbytes < self._workspace_bytes:
            raise WorkspaceTooSmallError(
                f"baracuda::{self.op}: workspace has {workspace.nbytes} bytes, needs {self._workspace_bytes}"
            )
        if workspace.buffer.device != self._device and self._workspace_bytes > 0:
            raise InvalidProblemError(
                f"baracuda::{self.op}: workspace is on {workspace.buffer.device}, expected {self._device}"
            )
        return workspace.buffer

    def _check_tensor(self, name: str, t: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> None:
        """An input or output tensor of the problem: device, dtype, shape (too few elements: BufferTooSmall)."""
        if t.device != self._device:
            raise InvalidProblemError(f"baracuda::{self.op}: {name} is on {t.device}, expected {self._device}")
        if t.dtype != dtype:
            raise InvalidProblemError(f"baracuda::{self.op}: {name} dtype {t.dtype} != expected {dtype}")
        if tuple(t.shape) != tuple(shape):
            need = 1
            for s in shape:
                need *= int(s)
            kind = BufferTooSmallError if t.numel() < need else InvalidProblemError
            raise kind(f"baracuda::{self.op}: {name} shape {list(t.shape)} != expected {list(shape)}")
