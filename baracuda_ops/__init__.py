"""baracuda_ops: deterministic, bandwidth-bound PyTorch operators.

Importing this package loads the native extension (which registers the
``torch.ops.baracuda.*`` schemas and the CPU, and when built the CUDA, kernels),
then the Python side of each op family (fakes, autograd, Plan classes).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import torch

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)
from ._errors import BaracudaIndexError, BaracudaNotImplementedError, BaracudaTypeError, BaracudaValueError
from ._plan import (
    BaracudaError,
    BufferTooSmallError,
    InvalidProblemError,
    KernelSku,
    PlanPreference,
    PrecisionGuarantee,
    UnsupportedError,
    Workspace,
    WorkspaceTooSmallError,
)
from ._version import __version__
from . import ops as _ops

__all__ = [
    "__version__",
    "build_info",
    "nn",
    "BaracudaError",
    "BaracudaIndexError",
    "BaracudaNotImplementedError",
    "BaracudaTypeError",
    "BaracudaValueError",
    "BufferTooSmallError",
    "InvalidProblemError",
    "KernelSku",
    "PlanPreference",
    "PrecisionGuarantee",
    "UnsupportedError",
    "Workspace",
    "WorkspaceTooSmallError",
]

# Each module in baracuda_ops/ops/ is one op family; its __all__ (functions,
# descriptors, plans) is re-exported here, so a new family needs no edit here.
for _family in sorted(m.name for m in pkgutil.iter_modules(_ops.__path__)):
    _module = importlib.import_module(f"{__name__}.ops.{_family}")
    globals().update({name: getattr(_module, name) for name in _module.__all__})
    __all__ += _module.__all__

from . import nn  # noqa: E402  (after the ops it wraps)


def build_info() -> dict[str, Any]:
    """What this installation was built with and can run."""
    return {
        "version": __version__,
        "torch": torch.__version__,
        "cpu": True,
        # CPU kernels compiled with OpenMP, so that at::parallel_for uses ATen's threads
        "cpu_openmp": bool(_C.with_openmp),
        # vector ISA the vectorized CPU loops run with on this CPU: "avx512", "avx2" or
        # "default" (baseline x86-64), capped by BARACUDA_CPU_CAPABILITY
        "cpu_vector_isa": _C.cpu_vector_isa,
        "cuda": bool(_C.with_cuda),
        "cuda_archs": _C.cuda_archs or None,
        "torch_cuda": torch.version.cuda,
        "cuda_available": bool(_C.with_cuda) and torch.cuda.is_available(),
    }

