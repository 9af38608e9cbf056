"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

import torch

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

from .ops.rms_norm import rms_norm as _rms_norm  # noqa: E402

__all__ += ["RMSNorm"]


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm`` and a subclass of it (same constructor, parameter
    ``weight``, state_dict and repr), computed by ``baracuda::rms_norm`` (eps=None: the
    computation type's machine epsilon)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.normalized_shape, self.weight, self.eps)


# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

from .ops.embedding_bag import embedding_bag as _embedding_bag  # noqa: E402


class EmbeddingBag(torch.nn.EmbeddingBag):
    """Drop-in for ``torch.nn.EmbeddingBag`` (same constructor, ``weight`` parameter,
    ``from_pretrained`` and state_dict, ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` as
    ``torch.nn.functional.embedding_bag`` treats them) computed by ``baracuda_ops.embedding_bag``,
    with a deterministic backward."""

    def forward(self, input, offsets=None, per_sample_weights=None):
        return _embedding_bag(
            input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.mode,
            self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx,
        )


__all__ += ["EmbeddingBag"]

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

from .ops.fractional_max_pool import fractional_max_pool2d as _fmp2d  # noqa: E402
from .ops.fractional_max_pool import fractional_max_pool3d as _fmp3d  # noqa: E402

__all__ += ["FractionalMaxPool2d", "FractionalMaxPool3d"]


class FractionalMaxPool2d(torch.nn.FractionalMaxPool2d):
    """Drop-in for ``torch.nn.FractionalMaxPool2d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fmp2d(input, self.kernel_size, self.output_size, self.output_ratio, self.return_indices,
                      _random_samples=self._random_samples)


class FractionalMaxPool3d(torch.nn.FractionalMaxPool3d):
    """Drop-in for ``torch.nn.FractionalMaxPool3d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fmp3d(input, self.kernel_size, self.output_size, self.output_ratio, self.return_indices,
                      _random_samples=self._random_samples)


# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

from .ops.alibi import alibi as _alibi, alibi_slopes as _alibi_slopes  # noqa: E402

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
        return _alibi(scores, self.slopes)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, learnable={self.learnable}"


# (alibi modules end)
