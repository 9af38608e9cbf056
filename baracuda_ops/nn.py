"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

# (embedding_bag modules end)

# ---------------------------------------------------------------------------- fractional_max_pool

import torch as _torch  # noqa: E402

from .ops.fractional_max_pool import fractional_max_pool2d as _fmp2d  # noqa: E402
from .ops.fractional_max_pool import fractional_max_pool3d as _fmp3d  # noqa: E402

__all__ += ["FractionalMaxPool2d", "FractionalMaxPool3d"]


class FractionalMaxPool2d(_torch.nn.FractionalMaxPool2d):
    """Drop-in for ``torch.nn.FractionalMaxPool2d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fmp2d(input, self.kernel_size, self.output_size, self.output_ratio, self.return_indices,
                      _random_samples=self._random_samples)


class FractionalMaxPool3d(_torch.nn.FractionalMaxPool3d):
    """Drop-in for ``torch.nn.FractionalMaxPool3d`` (same arguments, checks and buffer):
    samples are drawn with ``torch.rand`` as PyTorch does, so under the same seed the
    output is bit-identical to the torch module's."""

    def forward(self, input):
        return _fmp3d(input, self.kernel_size, self.output_size, self.output_ratio, self.return_indices,
                      _random_samples=self._random_samples)


# (fractional_max_pool modules end)

# ---------------------------------------------------------------------------- alibi

# (alibi modules end)
