"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

import numbers  # noqa: E402

import torch  # noqa: E402

from .ops.rms_norm import rms_norm as _rms_norm  # noqa: E402

__all__ += ["RMSNorm"]


class RMSNorm(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm``: same constructor, parameter ``weight`` and state_dict,
    computed by ``baracuda::rms_norm`` (eps=None: the computation type's machine epsilon)."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: tuple[int, ...]
    eps: float | None
    elementwise_affine: bool

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

# (alibi modules end)
