"""The ALiBi bias as a tensor, for attention code that adds a bias or takes a mask
(``scaled_dot_product_attention``'s ``attn_mask``, FlexAttention's ``score_mod`` reading
it, Hugging Face's BLOOM/MPT/Falcon attention).

``alibi_bias(H, Q, K)[h, i, j] = slopes[h] * (j - (i + q_offset))``: query ``i`` sits at
position ``i + q_offset`` of the keys (``q_offset = K - Q`` for the new queries of a decode
step with a KV cache), and ``causal=True`` sets ``-inf`` where the key comes after the
query (``j > i + q_offset``). With ``q_offset = 0`` it is the bias :func:`alibi` adds.

How Hugging Face builds the same bias (transformers' ``modeling_bloom.py``,
``modeling_mpt.py``, ``modeling_falcon.py``); the slopes are the same sequence
(:func:`alibi_slopes`: BLOOM and Falcon compute it by ``torch.pow`` in float32, MPT
with ``alibi_bias_max=8``, the default, as ``1 / 2^(8 k / n)``; another
``alibi_bias_max`` needs its own ``slopes``):

- BLOOM and Falcon (``build_alibi_tensor``) add ``slopes[h] * j`` as ``[B*H, 1, K]``,
  where ``j`` counts the unpadded keys of each row (``cumsum`` of the attention mask).
  Without padding that is ``alibi_bias(H, 1, K, layout="bqk").repeat(B, 1, 1)``.
- MPT (``build_mpt_alibi_bias``) adds ``slopes[h] * (j - (K - 1))`` as ``[H, 1, K]``:
  ``alibi_bias(H, 1, K, q_offset=K - 1, layout="bqk")``.
- The full ``[H, Q, K]`` bias differs from each of those by ``slopes[h]`` times a number
  that depends on the query row alone (``i + q_offset``, or ``i + q_offset - (K - 1)``),
  which softmax removes: the attention weights are the same up to rounding (the scores
  are smaller in magnitude here, so a low-precision dtype rounds them less). With left
  padding BLOOM's positions shift per batch row by the row's padding, again a constant
  per row over the keys it attends to.

Gradients reach ``slopes`` when it requires them: ``sum_{i,j} grad[h, i, j] * (j - i - q_offset)``
over the unmasked entries, a PyTorch broadcast-and-reduce (deterministic; a bias of
``[H, Q, K]`` is small next to the scores it is added to).
"""

from __future__ import annotations

import torch

from .._errors import BaracudaTypeError, BaracudaValueError
from .alibi import alibi_slopes

__all__ = ["alibi_bias"]

_LAYOUTS = ("bhqk", "bqk")


def alibi_bias(
    num_heads: int,
    q_len: int,
    k_len: int,
    *,
    slopes: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device=None,
    layout: str = "bhqk",
) -> torch.Tensor:
    """The ALiBi bias ``slopes[h] * (j - i - q_offset)``, ``-inf`` above the shifted diagonal
    when ``causal``.

    Args:
        num_heads: H.
        q_len, k_len: Q queries and K keys.
        slopes: ``[H]`` slopes (float tensor; may require grad); default ``alibi_slopes(H)``.
        causal: mask keys after each query (``j > i + q_offset``) with ``-inf``.
        q_offset: position of query 0 among the keys (``K - Q`` when decoding with a KV cache).
        dtype, device: of the result (default float32; the slopes' device when given).
        layout: ``"bhqk"``, ``[1, H, Q, K]`` (broadcasts against ``[B, H, Q, K]`` scores, e.g.
            SDPA's ``attn_mask``); ``"bqk"``, ``[H, Q, K]`` (``.repeat(B, 1, 1)`` gives BLOOM's
            ``[B*H, Q, K]`` batch of heads).

    Computed in float32 (float64 for a float64 result), rounded once to ``dtype``.
    """
    op = "baracuda.alibi_bias"
    for name, value, low in (("num_heads", num_heads, 1), ("q_len", q_len, 0), ("k_len", k_len, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BaracudaValueError(f"{op}: {name} must be an int >= {low}, got {value!r}")
    if isinstance(q_offset, bool) or not isinstance(q_offset, int):
        raise BaracudaValueError(f"{op}: q_offset must be an int, got {q_offset!r}")
    if layout not in _LAYOUTS:
        raise BaracudaValueError(f"{op}: layout must be one of {_LAYOUTS}, got {layout!r}")
    if not dtype.is_floating_point:
        raise BaracudaTypeError(f"{op}: dtype must be a floating type, got {dtype}")
    if slopes is None:
        slopes = alibi_slopes(num_heads, device=device)
    else:
        if slopes.shape != (num_heads,) or not slopes.dtype.is_floating_point:
            raise BaracudaValueError(
                f"{op}: slopes must be a float tensor of shape [{num_heads}], got {slopes.dtype} {list(slopes.shape)}"
            )
        if device is not None and slopes.device != torch.device(device):
            raise BaracudaValueError(f"{op}: slopes are on {slopes.device}, expected {device}")
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    device = slopes.device
    query_pos = torch.arange(q_len, device=device, dtype=math_dtype) + q_offset
    distance = torch.arange(k_len, device=device, dtype=math_dtype) - query_pos[:, None]  # [Q, K]: j - i - q_offset
    bias = slopes.to(math_dtype)[:, None, None] * distance
    if causal:
        bias = bias.masked_fill(distance > 0, float("-inf"))
    bias = bias.to(dtype)
    return bias.unsqueeze(0) if layout == "bhqk" else bias
