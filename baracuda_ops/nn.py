"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

import torch as _torch  # noqa: E402

from .ops.alibi import alibi as _alibi, alibi_slopes as _alibi_slopes  # noqa: E402

__all__ += ["ALiBi"]


class ALiBi(_torch.nn.Module):
    """Adds the ALiBi bias ``slopes[h] * (j - i)`` to attention scores ``[B, H, Q, K]``.

    ``slopes`` starts as ``alibi_slopes(num_heads)``; a buffer, or a Parameter
    trained with the scores when ``learnable``.
    """

    def __init__(self, num_heads: int, learnable: bool = False, device=None, dtype=_torch.float32) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.learnable = learnable
        slopes = _alibi_slopes(num_heads, dtype=dtype, device=device)
        if learnable:
            self.slopes = _torch.nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes)

    def forward(self, scores: _torch.Tensor) -> _torch.Tensor:
        return _alibi(scores, self.slopes)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, learnable={self.learnable}"


# (alibi modules end)
