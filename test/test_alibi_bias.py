"""alibi_bias (the bias/mask builder) and alibi on BLOOM's 3-D [B*H, Q, K] scores, checked
against the float64 formula and against how transformers' BLOOM, MPT and Falcon build it."""

import pytest
import torch
import torch.nn.functional as F

import baracuda_ops
from baracuda_ops.bench.alibi import reference, reference_slope_grad
from helpers import FLOAT_DTYPES, assert_close, check_compile_matches_eager, random


def _reference_bias(slopes, q, k, q_offset, causal):
    """float64 slopes[h] * (j - i - q_offset), -inf where j > i + q_offset when causal."""
    distance = torch.arange(k, dtype=torch.float64) - (torch.arange(q, dtype=torch.float64)[:, None] + q_offset)
    bias = slopes.double().cpu()[:, None, None] * distance
    return bias.masked_fill(distance > 0, float("-inf")) if causal else bias


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads,q,k,q_offset,causal", [(8, 5, 5, 0, True), (6, 1, 9, 8, True), (12, 3, 7, 4, False),
                                                       (3, 4, 2, -1, True), (1, 0, 3, 0, False)])
def test_bias_matches_float64_formula(device, dtype, heads, q, k, q_offset, causal):
    got = baracuda_ops.alibi_bias(heads, q, k, causal=causal, q_offset=q_offset, dtype=dtype, device=device)
    assert got.shape == (1, heads, q, k) and got.dtype == dtype and got.device.type == device.type
    want = _reference_bias(baracuda_ops.alibi_slopes(heads), q, k, q_offset, causal)
    assert_close(got[0], want, dtype)
    flat = baracuda_ops.alibi_bias(heads, q, k, causal=causal, q_offset=q_offset, dtype=dtype, device=device,
                                   layout="bqk")
    assert torch.equal(flat, got[0])


def test_bias_is_alibi_of_zero_scores(device):
    slopes = random((4,), torch.float32, device)
    got = baracuda_ops.alibi_bias(4, 6, 9, slopes=slopes, device=device)
    assert torch.equal(got, baracuda_ops.alibi(torch.zeros(1, 4, 6, 9, device=device), slopes))


def test_causal_bias_in_sdpa_equals_causal_attention_with_bias(device):
    # SDPA with the causal ALiBi mask equals softmax(q k^T / sqrt(d) + bias) @ v over the causal keys,
    # for a decode step's queries sitting at the end of the keys.
    q, k, v = (random((2, 4, n, 8), torch.float64, device) for n in (3, 7, 7))
    mask = baracuda_ops.alibi_bias(4, 3, 7, causal=True, q_offset=4, dtype=torch.float64, device=device)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-1, -2) / 8**0.5 + _reference_bias(baracuda_ops.alibi_slopes(4), 3, 7, 4, True).to(device)
    assert_close(got, torch.softmax(scores, -1) @ v)


def test_slope_gradient_every_form(device):
    # d bias / d slopes[h] = sum over unmasked (i, j) of grad * (j - i - q_offset); bit-identical twice.
    slopes = random((5,), torch.float32, device, requires_grad=True)
    grad = random((1, 5, 4, 6), torch.float32, device)
    for causal in (False, True):
        grads = []
        for _ in range(2):
            bias = baracuda_ops.alibi_bias(5, 4, 6, slopes=slopes, causal=causal, q_offset=2)
            (g,) = torch.autograd.grad(bias, slopes, grad.masked_fill(bias.isinf(), 0))
            grads.append(g)
        assert torch.equal(grads[0], grads[1])
        distance = _reference_bias(torch.ones(5), 4, 6, 2, causal).to(device)
        want = (grad[0].double() * distance).nan_to_num(0, 0, 0).sum(dim=(1, 2))
        assert_close(grads[0], want)
    # alibi on 3-D scores: the slope gradient sums over the batch too, as on the 4-D view
    scores = random((3 * 5, 4, 6), torch.float32, device, requires_grad=True)
    g3 = random((3 * 5, 4, 6), torch.float32, device)
    out = baracuda_ops.alibi(scores, slopes)
    d_scores, d_slopes = torch.autograd.grad(out, (scores, slopes), g3)
    assert torch.equal(d_scores, g3)
    assert_close(d_slopes, reference_slope_grad(g3.view(3, 5, 4, 6)))
    assert torch.equal(d_slopes, torch.autograd.grad(baracuda_ops.alibi(scores, slopes), slopes, g3)[0])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_alibi_on_3d_scores(device, dtype):
    slopes = random((3,), torch.float32, device)
    scores = random((2 * 3, 5, 7), dtype, device)
    got = baracuda_ops.alibi(scores, slopes)
    assert got.shape == scores.shape and got.dtype == dtype
    assert torch.equal(got, baracuda_ops.alibi(scores.view(2, 3, 5, 7), slopes).view(6, 5, 7))
    assert_close(got, reference(scores.view(2, 3, 5, 7), slopes).view(6, 5, 7), dtype)
    strided = random((2 * 3, 7, 5), dtype, device).transpose(1, 2)
    assert torch.equal(baracuda_ops.alibi(strided, slopes), baracuda_ops.alibi(strided.contiguous(), slopes))
    inplace = scores.clone()
    assert baracuda_ops.alibi_(inplace, slopes) is inplace
    assert torch.equal(inplace, got)


def test_alibi_3d_compiles(device):
    slopes = random((4,), torch.float32, device, requires_grad=True)
    scores = random((2 * 4, 3, 5), torch.float32, device, requires_grad=True)
    check_compile_matches_eager(baracuda_ops.alibi, [scores, slopes])
    check_compile_matches_eager(
        lambda s: baracuda_ops.alibi_bias(4, 3, 5, slopes=s, causal=True, q_offset=2), [slopes]
    )


def test_errors():
    with pytest.raises(ValueError, match=r"baracuda::alibi: 3-D scores \[B\*H, Q, K\] \[7, 2, 2\] need 1-D slopes "
                                         r"whose length H divides B\*H, got slopes shape \[3\]"):
        baracuda_ops.alibi(torch.zeros(7, 2, 2), torch.ones(3))
    with pytest.raises(ValueError, match=r"baracuda.alibi_bias: num_heads must be an int >= 1, got 0"):
        baracuda_ops.alibi_bias(0, 1, 1)
    with pytest.raises(ValueError, match=r"baracuda.alibi_bias: q_len must be an int >= 0, got -1"):
        baracuda_ops.alibi_bias(2, -1, 1)
    with pytest.raises(ValueError, match=r"baracuda.alibi_bias: layout must be one of \('bhqk', 'bqk'\), got 'bhkq'"):
        baracuda_ops.alibi_bias(2, 1, 1, layout="bhkq")
    with pytest.raises(ValueError, match=r"baracuda.alibi_bias: slopes must be a float tensor of shape \[2\], "
                                         r"got torch.float32 \[3\]"):
        baracuda_ops.alibi_bias(2, 1, 1, slopes=torch.ones(3))
    with pytest.raises(TypeError, match=r"baracuda.alibi_bias: dtype must be a floating type, got torch.int64"):
        baracuda_ops.alibi_bias(2, 1, 1, dtype=torch.int64)


# ---------------------------------------------------------------------------- transformers' builders

@pytest.mark.parametrize("heads", [8, 12, 16, 5])
def test_matches_bloom_and_falcon_build_alibi_tensor(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi

    batch, k = 3, 11
    ours = baracuda_ops.alibi_bias(heads, 1, k, layout="bqk").repeat(batch, 1, 1)
    mask = torch.ones(batch, k, dtype=torch.long)
    # BLOOM: slopes from torch.pow in float32, products in float32
    torch.testing.assert_close(bloom_alibi(mask, heads, torch.float32), ours, rtol=1e-6, atol=0)
    # Falcon rounds the slopes and the products to bfloat16
    falcon = baracuda_ops.alibi_bias(heads, 1, k, slopes=baracuda_ops.alibi_slopes(heads).bfloat16().float(),
                                     layout="bqk", dtype=torch.bfloat16).repeat(batch, 1, 1)
    torch.testing.assert_close(falcon_alibi(mask, heads, torch.bfloat16), falcon, rtol=0, atol=0)


@pytest.mark.parametrize("heads", [8, 16, 6])
def test_matches_mpt_build_alibi_tensor(heads):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    k = 13
    ours = baracuda_ops.alibi_bias(heads, 1, k, q_offset=k - 1, layout="bqk")
    torch.testing.assert_close(build_mpt_alibi_tensor(heads, k), ours, rtol=1e-6, atol=0)


def test_full_bias_gives_bloom_attention_weights_with_left_padding():
    # BLOOM's bias counts positions from each row's first unpadded key; the full [Q, K] bias
    # differs by a constant per query row, so the attention weights over unmasked keys agree.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi

    heads, k = 4, 6
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    scores = torch.randn(2, heads, k, k, dtype=torch.float64)
    causal = torch.ones(k, k, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    masked = lambda s: s.masked_fill(~causal, float("-inf"))  # noqa: E731
    theirs = torch.softmax(masked(scores + bloom_alibi(mask, heads, torch.float64).view(2, heads, 1, k)), -1)
    ours = torch.softmax(masked(scores + baracuda_ops.alibi_bias(heads, k, k, dtype=torch.float64)), -1)
    rows = mask.bool()[:, None, :, None].expand_as(ours)  # padded queries attend to nothing
    torch.testing.assert_close(ours[rows], theirs[rows])
