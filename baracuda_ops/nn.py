"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

import numbers

import torch

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

from .ops.rms_norm import _RMSNorm, _kernel_weight  # noqa: E402

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
        weight = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = _kernel_weight(x, weight)
        return _RMSNorm(x, self.normalized_shape, weight, self.eps)[0]

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

from .ops.embedding_bag import _MODES, _EmbeddingBag, embedding_bag as _embedding_bag  # noqa: E402


class EmbeddingBag(torch.nn.EmbeddingBag):
    """Drop-in for ``torch.nn.EmbeddingBag`` (same constructor, ``weight`` parameter,
    ``from_pretrained`` and state_dict, ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` as
    ``torch.nn.functional.embedding_bag`` treats them) computed by ``baracuda_ops.embedding_bag``,
    with a deterministic backward. Without max_norm, sparse and scale_grad_by_freq, forward calls
    the op itself (torch.nn.EmbeddingBag has made padding_idx non-negative)."""

    def forward(self, input, offsets=None, per_sample_weights=None):
        mode = _MODES.get(self.mode)
        if self.max_norm is not None or self.sparse or self.scale_grad_by_freq or mode is None:
            return _embedding_bag(
                input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.mode,
                self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx,
            )
        return _EmbeddingBag(self.weight, input, offsets, mode, per_sample_weights,
                             self.include_last_offset and input.dim() != 2,
                             -1 if self.padding_idx is None else self.padding_idx)[0]


__all__ += ["EmbeddingBag"]

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

from .ops.fractional_max_pool import _functional as _fractional_max_pool  # noqa: E402

__all__ += ["FractionalMaxPool2d", "FractionalMaxPool3d"]


class FractionalMaxPool2d(torch.nn.FractionalMaxPool2d):
    """Drop-in for ``torch.nn.FractionalMaxPool2d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fractional_max_pool(2, input, self.kernel_size, self.output_size, self.output_ratio,
                                    self.return_indices, self._random_samples)


class FractionalMaxPool3d(torch.nn.FractionalMaxPool3d):
    """Drop-in for ``torch.nn.FractionalMaxPool3d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fractional_max_pool(3, input, self.kernel_size, self.output_size, self.output_ratio,
                                    self.return_indices, self._random_samples)


# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

from .ops.alibi import _Alibi, alibi_slopes as _alibi_slopes  # noqa: E402

__all__ += ["ALiBi"]


class ALiBi(torch.nn.Module):
    """Adds the ALiBi bias ``slopes[h] * (j - i)`` to attention scores ``[B, H, Q, K]``.

    ``slopes`` starts as ``alibi_slopes(num_heads)``; a buffer, or a Parameter
    trained with the scores when ``learnable``.
    """

    def __init__(self, num_heads: int, learnable: bool = False, device=None, dtype=torch.float32) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.learnable = learnable
        slopes = _alibi_slopes(num_heads, dtype=dtype, device=device)
        if learnable:
            self.slopes = torch.nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return _Alibi(scores, self.slopes)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, learnable={self.learnable}"


# (alibi modules end)
