"""Drop-in ``torch.nn`` modules backed by baracuda ops (one section per family)."""

from __future__ import annotations

__all__: list[str] = []
