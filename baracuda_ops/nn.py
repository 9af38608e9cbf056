"""Drop-in ``torch.nn`` modules backed by baracuda ops, one section per family."""

from __future__ import annotations

import torch

__all__: list[str] = []

# ---------------------------------------------------------------------------- rms_norm

from ._dtensor import replicated_like as _replicated_like  # noqa: E402
from ._errors import BaracudaValueError  # noqa: E402
from .ops.rms_norm import _RMSNorm, _kernel_weight, rms_norm as _rms_norm  # noqa: E402

__all__ += ["RMSNorm"]


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm`` and a subclass of it (same constructor, parameter
    ``weight``, state_dict and repr), computed by ``baracuda::rms_norm`` (eps=None: the
    computation type's machine epsilon). The keyword-only ``weight_offset`` and ``casting`` are
    ``baracuda_ops.rms_norm``'s (``weight_offset=1.0`` with a zero-initialised weight is Gemma's
    ``1 + w``: initialise it with ``torch.nn.init.zeros_`` then); the module then runs
    ``baracuda::rms_norm_fused``."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=None, *, weight_offset: float = 0.0, casting: str = "torch") -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        if casting not in ("torch", "llama", "gemma"):
            raise BaracudaValueError(f'baracuda::rms_norm: casting must be "torch", "llama" or "gemma", got {casting!r}')
        self.weight_offset = float(weight_offset)
        self.casting = casting

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_offset != 0.0 or self.casting != "torch":
            return _rms_norm(x, self.normalized_shape, _replicated_like(x, self.weight), self.eps,
                             weight_offset=self.weight_offset, casting=self.casting)
        weight = self.weight
        if type(x) is not torch.Tensor:  # a DTensor input: a plain weight joins it as Replicate
            weight = _replicated_like(x, weight)
        if weight is not None and weight.dtype != x.dtype:
            weight = _kernel_weight(x, weight)
        return _RMSNorm(x, self.normalized_shape, weight, self.eps)[0]

    def extra_repr(self) -> str:
        options = "" if self.weight_offset == 0.0 else f", weight_offset={self.weight_offset}"
        options += "" if self.casting == "torch" else f", casting={self.casting!r}"
        return super().extra_repr() + options


# (rms_norm modules end)

# ---------------------------------------------------------------------------- embedding_bag

from .ops.embedding_bag import _MODES, _EmbeddingBag, _EmbeddingBagWithOptions  # noqa: E402
from .ops.embedding_bag import embedding_bag as _embedding_bag  # noqa: E402


class EmbeddingBag(torch.nn.EmbeddingBag):
    """Drop-in for ``torch.nn.EmbeddingBag`` (same constructor, ``weight`` parameter,
    ``from_pretrained`` and state_dict, ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` as
    ``torch.nn.functional.embedding_bag`` treats them) computed by ``baracuda_ops.embedding_bag``,
    with a deterministic backward. Without max_norm, forward calls the op itself (sparse or
    scale_grad_by_freq: ``embedding_bag_with_options``; torch.nn.EmbeddingBag has made
    padding_idx non-negative)."""

    def forward(self, input, offsets=None, per_sample_weights=None):
        mode = _MODES.get(self.mode)
        options = self.sparse or self.scale_grad_by_freq
        if self.max_norm is not None or mode is None or (options and mode == 2) or (self.sparse and
                                                                                   self.scale_grad_by_freq):
            return _embedding_bag(
                input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.mode,
                self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx,
            )
        args = (self.weight, input, offsets, mode, per_sample_weights, self.include_last_offset and input.dim() != 2,
                -1 if self.padding_idx is None else self.padding_idx)
        if options:
            return _EmbeddingBagWithOptions(*args, self.scale_grad_by_freq, self.sparse)[0]
        return _EmbeddingBag(*args)[0]


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

# ---------------------------------------------------------------------------- rms_norm_fused

from .ops.rms_norm_fused import _RMSNormFused, _kernel_weight as _fused_kernel_weight  # noqa: E402

__all__ += ["LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "GemmaRMSNorm", "Gemma3RMSNorm"]


class _HFRMSNorm(torch.nn.Module):
    """Common part of the Hugging Face drop-ins: the last dim normalized by
    ``baracuda_ops.rms_norm_fused`` with the class's casting mode and weight offset. ``forward``
    also takes a ``residual``: then ``h = hidden_states + residual`` is normalized in the same
    pass and ``(y, h)`` returned (the pre-norm block's residual stream)."""

    _casting = "llama"
    _weight_offset = 0.0

    def _norm(self, hidden_states: torch.Tensor, eps: float, residual: torch.Tensor | None):
        # baracuda_ops.rms_norm_fused's call, its arguments already in the op's form
        weight = self.weight
        if weight.dtype != hidden_states.dtype:
            weight = _fused_kernel_weight(hidden_states, weight)
        y, h, _ = _RMSNormFused(hidden_states, residual, [weight.shape[-1]], weight, eps, self._weight_offset,
                                self._casting)
        return y if residual is None else (y, h)


class LlamaRMSNorm(_HFRMSNorm):
    """Drop-in for ``transformers``' ``LlamaRMSNorm`` (same constructor, ``weight`` initialised to
    ones, ``variance_epsilon``, state_dict): x-hat in float32 rounded to the input dtype, times
    the weight with PyTorch's type promotion (casting="llama")."""

    def __init__(self, hidden_size, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None):
        return self._norm(hidden_states, self.variance_epsilon, residual)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class Qwen2RMSNorm(LlamaRMSNorm):
    """Drop-in for ``transformers``' ``Qwen2RMSNorm`` (the arithmetic of ``LlamaRMSNorm``)."""


class Qwen3RMSNorm(LlamaRMSNorm):
    """Drop-in for ``transformers``' ``Qwen3RMSNorm`` (the arithmetic of ``LlamaRMSNorm``; also its
    q_norm / k_norm over the head dim)."""


class MistralRMSNorm(LlamaRMSNorm):
    """Drop-in for ``transformers``' ``MistralRMSNorm`` (the arithmetic of ``LlamaRMSNorm``)."""


class GemmaRMSNorm(_HFRMSNorm):
    """Drop-in for ``transformers``' ``GemmaRMSNorm`` (same constructor, ``weight`` initialised to
    zeros, ``eps``, state_dict): ``x_hat * (1 + weight)`` all in float32, cast to the input dtype at
    the end (casting="gemma", weight_offset=1.0)."""

    _casting = "gemma"
    _weight_offset = 1.0

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self._norm(x, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class Gemma3RMSNorm(GemmaRMSNorm):
    """Drop-in for ``transformers``' ``Gemma3RMSNorm`` (the arithmetic of ``GemmaRMSNorm``)."""


# (rms_norm_fused modules end)

# ---------------------------------------------------------------------------- embedding_bag collection

from .nn_collection import EmbeddingBagCollection  # noqa: E402  (its configs and keyed tensors: nn_collection)

__all__ += ["EmbeddingBagCollection"]
