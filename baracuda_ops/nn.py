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

# (alibi modules end)
