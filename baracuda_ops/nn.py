"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

import torch as _torch  # noqa: E402

from .ops.embedding_bag import check_supported as _check_embedding_bag_supported  # noqa: E402
from .ops.embedding_bag import embedding_bag as _embedding_bag  # noqa: E402


class EmbeddingBag(_torch.nn.EmbeddingBag):
    """Drop-in for ``torch.nn.EmbeddingBag`` (same constructor, ``weight`` parameter,
    ``from_pretrained`` and state_dict) computed by ``baracuda_ops.embedding_bag``, with a
    deterministic backward. ``max_norm``, ``scale_grad_by_freq=True`` and ``sparse=True`` raise
    ``baracuda_ops.UnsupportedError``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check_embedding_bag_supported(self.max_norm, self.scale_grad_by_freq, self.sparse)

    def forward(self, input, offsets=None, per_sample_weights=None):
        return _embedding_bag(
            input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.mode,
            self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx,
        )


__all__ += ["EmbeddingBag"]

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

# (alibi modules end)
