import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

import baracuda_ops
from baracuda_ops.bench.embedding_bag import zipf_indices
from helpers import (FLOAT_DTYPES, assert_close, check_compile_matches_eager, check_vmap_matches_per_sample,
                     outputs_and_grads, poison, require_free_gpu_memory)
from launch_configs import launch_config

MODES = ("sum", "mean", "max")
MODE_ENUM = {"sum": 0, "mean": 1, "max": 2}


def make_bags(device, index_dtype=torch.int64, offset_dtype=None, num_weights=25):
    """40 indices in 7 bags: an empty bag in the middle and at the end, a bag of one, a long bag."""
    idx = torch.randint(0, num_weights, (40,), device=device, dtype=index_dtype)
    off = torch.tensor([0, 5, 5, 6, 20, 33, 40], device=device, dtype=offset_dtype or index_dtype)
    return idx, off


def reference(idx, w, off, mode, psw=None, padding_idx=None, include_last_offset=False):
    """F.embedding_bag on CPU in float64, with leaf inputs for the gradients."""
    w64 = w.detach().cpu().double().requires_grad_()
    psw64 = None if psw is None else psw.detach().cpu().double().requires_grad_()
    out = F.embedding_bag(idx.cpu(), w64, None if off is None else off.cpu(), mode=mode, per_sample_weights=psw64,
                          include_last_offset=include_last_offset, padding_idx=padding_idx)
    return out, w64, psw64


def check_against_reference(idx, w, off, mode, psw=None, padding_idx=None, include_last_offset=False, scale=4.0):
    w = w.detach().requires_grad_()
    psw = None if psw is None else psw.detach().requires_grad_()
    out = baracuda_ops.embedding_bag(idx, w, off, mode=mode, per_sample_weights=psw, padding_idx=padding_idx,
                                     include_last_offset=include_last_offset)
    ref, w64, psw64 = reference(idx, w, off, mode, psw, padding_idx, include_last_offset)
    assert out.dtype == w.dtype and out.shape == ref.shape
    if mode == "max":  # a selection: exact
        torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=0, atol=0)
    else:
        assert_close(out, ref, dtype=w.dtype, scale=scale)
    grad = torch.randn(out.shape, dtype=w.dtype, device=w.device)
    inputs = [w] + ([psw] if psw is not None else [])
    ref_inputs = [w64] + ([psw64] if psw is not None else [])
    grads = torch.autograd.grad(out, inputs, grad)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad.cpu().double())
    for a, b in zip(grads, ref_grads):
        assert a.dtype == w.dtype
        assert_close(a, b, dtype=w.dtype, scale=scale)


def _bags_summed_in_order(weight, indices, offsets, mode, psw, padding_idx):
    """The CPU forward's sum and mean as the kernel defines them: each bag's entries added in
    position order to a zero of the accumulate type (float64 for float64, else float32), a
    weighted entry as the rounded product psw * row, the mean divided in that type, then rounded
    once to weight's dtype."""
    acc_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    begins = offsets.long()
    ends = torch.cat([begins[1:], begins.new_tensor([indices.numel()])])
    acc = torch.zeros(begins.numel(), weight.shape[1], dtype=acc_dtype)
    count = torch.zeros(begins.numel(), dtype=acc_dtype)
    for j in range(int((ends - begins).max())):
        bags = ((begins + j) < ends).nonzero().view(-1)
        pos = begins[bags] + j
        rows = indices[pos].long()
        keep = rows != padding_idx
        bags, pos, rows = bags[keep], pos[keep], rows[keep]
        x = weight[rows].to(acc_dtype)
        acc[bags] += x if psw is None else psw[pos].to(acc_dtype)[:, None] * x
        count[bags] += 1
    if mode == "mean":
        acc = torch.where(count[:, None] > 0, acc / count.clamp(min=1)[:, None], torch.zeros_like(acc))
    return acc.to(weight.dtype)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# Widths that leave every column block of the sums (8 vectors, then 4, 2, 1 of 16, 32 and
# 64 bytes) and a scalar tail, on every vector ISA.
@pytest.mark.parametrize("dim", [1, 3, 4, 7, 8, 12, 15, 16, 24, 31, 33, 40, 56, 64, 72, 100, 128, 136, 200, 257])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_forward_same_bits_as_the_ordered_bag_sum_on_one_and_two_threads(dim, dtype, restore_threads):
    weight = torch.randn(300, dim).to(dtype)
    indices = torch.randint(0, 300, (900,), dtype=torch.int32 if dim % 2 else torch.int64)
    indices[::9] = 5
    offsets = torch.sort(torch.randint(0, 900, (64,)))[0].to(indices.dtype)
    offsets[0] = 0
    psw = torch.randn(900).to(dtype)
    for mode, weights, padding_idx in (("sum", None, -1), ("sum", psw, 5), ("mean", None, 5), ("mean", None, -1)):
        expected = _bags_summed_in_order(weight, indices, offsets, mode, weights, padding_idx)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = torch.ops.baracuda.embedding_bag(weight, indices, offsets, MODE_ENUM[mode], weights, False,
                                                   padding_idx)[0]
            assert torch.equal(out.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8)), (mode, threads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_and_grads_match_F(device, mode, dtype):
    for index_dtype, offset_dtype in ((torch.int64, torch.int64), (torch.int32, torch.int32),
                                      (torch.int32, torch.int64)):
        for padding_idx in (None, 3, -2):
            idx, off = make_bags(device, index_dtype, offset_dtype)
            idx[7] = 3  # make sure the padding row occurs
            w = torch.randn(25, 12, device=device, dtype=dtype)
            check_against_reference(idx, w, off, mode, padding_idx=padding_idx)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_only_is_embedding_bags_output(device, mode, dtype):
    # The same bits as embedding_bag's output: padding or none (the CPU loop without the padding
    # test), per-sample weights, include_last_offset, fixed-size bags, row widths that leave every
    # vector block and a scalar tail, and indices past the last bag.
    ops = torch.ops.baracuda
    for dim in (1, 7, 64, 200):
        idx, off = make_bags(device)
        idx = torch.cat([idx, torch.tensor([3, 4], device=device)])  # in no bag
        w = torch.randn(25, dim, device=device, dtype=dtype)
        psw = torch.randn(42, device=device, dtype=dtype) if mode == "sum" else None
        for pad in (-1, 3):
            for args in ((w, idx, off, MODE_ENUM[mode], psw, False, pad),
                         (w, idx, off, MODE_ENUM[mode], psw, True, pad),
                         (w, idx[:40].view(5, 8), None, MODE_ENUM[mode], None, False, pad)):
                got = ops.embedding_bag_forward_only(*args)
                want = ops.embedding_bag(*args)[0]
                assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)), (dim, pad)


def test_functional_takes_the_forward_only_op_where_no_gradient_is_wanted(device, monkeypatch):
    # As F.embedding_bag takes _embedding_bag_forward_only: no input requiring grad, or grad
    # mode off. A gradient by autograd, forward-mode AD or a torch.func transform keeps
    # embedding_bag (its offset2bag and bag_size are the backward's).
    from baracuda_ops.ops import embedding_bag as family
    calls = []
    real = family._forward_only
    monkeypatch.setattr(family, "_forward_only", lambda *a: calls.append(1) or real(*a))
    idx, off = make_bags(device)
    w = torch.randn(25, 8, device=device)
    wr = w.clone().requires_grad_()

    def used(fn):
        calls.clear()
        fn()
        return bool(calls)

    bags = baracuda_ops.embedding_bag
    assert used(lambda: bags(idx, w, off, mode="sum"))
    with torch.no_grad():
        assert used(lambda: bags(idx, wr, off, mode="max"))
    with torch.inference_mode():
        assert used(lambda: bags(idx, w, off, mode="mean"))
    assert not used(lambda: bags(idx, wr, off, mode="sum"))
    assert not used(lambda: bags(idx, w, off, mode="sum", per_sample_weights=torch.ones(40, device=device,
                                                                                      requires_grad=True)))
    assert not used(lambda: torch.func.grad(lambda w: bags(idx, w, off, mode="sum").sum())(w))
    assert not used(lambda: torch.func.jvp(lambda w: bags(idx, w, off, mode="sum"), (w,), (w,)))
    assert not used(lambda: torch.vmap(lambda w: bags(idx, w, off, mode="sum"))(w.expand(2, 25, 8)))
    with torch.autograd.forward_ad.dual_level():
        assert not used(lambda: bags(idx, torch.autograd.forward_ad.make_dual(w, w), off, mode="sum"))
    with torch.no_grad():
        torch.testing.assert_close(bags(idx, w, off, mode="mean", padding_idx=3),
                                   F.embedding_bag(idx, w, off, mode="mean", padding_idx=3))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_per_sample_weights(device, dtype):
    idx, off = make_bags(device)
    w = torch.randn(25, 16, device=device, dtype=dtype)
    psw = torch.randn(40, device=device, dtype=dtype)
    check_against_reference(idx, w, off, "sum", psw=psw)
    check_against_reference(idx, w, off, "sum", psw=psw, padding_idx=idx[3].item())
    idx2 = idx.view(5, 8)  # 2-D input: psw has its shape
    check_against_reference(idx2, w, None, "sum", psw=psw.view(5, 8))


@pytest.mark.parametrize("mode", MODES)
def test_include_last_offset_and_2d_input(device, mode):
    idx, off = make_bags(device)
    w = torch.randn(25, 10, device=device)
    check_against_reference(idx, w, off, mode, include_last_offset=True)
    check_against_reference(idx.view(8, 5), w, None, mode, padding_idx=idx[0].item())
    check_against_reference(idx.view(8, 5), w, None, mode)


@pytest.mark.parametrize("mode", MODES)
def test_include_last_offset_short_of_the_end_leaves_the_rest_out(device, mode):
    # With include_last_offset the last offset ends the last bag; the positions after it are in
    # no bag (the CSR reading of the docs; PyTorch's CUDA kernel since pytorch#178546 and the MPS
    # one in pytorch#190062; its CPU kernel, 2.14, still counts them in the mean, pads and takes
    # the max over them). So the result is F.embedding_bag's on the indices up to that offset,
    # and rows named only after it get no gradient (e.g. indices padded for a static shape).
    idx, off = make_bags(device)  # 40 indices, offsets [0, 5, 5, 6, 20, 33, 40]
    idx[:36][idx[:36] == 24] = 0
    idx[38] = 24  # a row named only after the last offset
    short = off.clone()
    short[-1] = 36
    w = torch.randn(25, 10, device=device)
    check_against_reference(idx[:36], w, short, mode, padding_idx=idx[3].item(), include_last_offset=True)
    out, o2b, _, _ = torch.ops.baracuda.embedding_bag(w, idx, short, MODE_ENUM[mode], None, True, -1)
    assert torch.equal(out, torch.ops.baracuda.embedding_bag(w, idx[:36], short, MODE_ENUM[mode], None, True, -1)[0])
    assert o2b[36:].tolist() == [-1] * 4
    wg = w.detach().requires_grad_()
    (dw,) = torch.autograd.grad(baracuda_ops.embedding_bag(idx, wg, short, mode=mode, include_last_offset=True).sum(), wg)
    only_after = sorted(set(idx[36:].tolist()) - set(idx[:36].tolist()))
    assert 24 in only_after and not dw[only_after].any()


@pytest.mark.parametrize("mode", MODES)
def test_padding_excluded_from_bag_and_mean_count(device, mode):
    w = torch.randn(6, 4, device=device)
    idx = torch.tensor([2, 5, 2, 2, 1], device=device)
    off = torch.tensor([0, 3, 4], device=device)  # bag 1 is padding only
    out, _, bag_size, max_positions = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], None, False, 2)
    assert bag_size.tolist() == [1, 0, 1]
    torch.testing.assert_close(out[0], w[5])
    assert torch.equal(out[1], torch.zeros(4, device=device))
    if mode == "max":
        assert max_positions[0].tolist() == [1] * 4 and max_positions[1].tolist() == [-1] * 4


@pytest.mark.parametrize("mode", MODES)
def test_zero_size(device, mode):
    m = MODE_ENUM[mode]
    w = torch.randn(5, 3, device=device, requires_grad=True)
    cases = [
        (torch.empty(0, dtype=torch.long, device=device), torch.zeros(3, dtype=torch.long, device=device), False, 3),
        (torch.tensor([1, 2], device=device), torch.empty(0, dtype=torch.long, device=device), False, 0),
        (torch.tensor([1, 2], device=device), torch.zeros(1, dtype=torch.long, device=device), True, 0),
        (torch.empty(4, 0, dtype=torch.long, device=device), None, False, 4),
    ]
    for idx, off, ilo, num_bags in cases:
        out, o2b, bag_size, _ = torch.ops.baracuda.embedding_bag(w, idx, off, m, None, ilo, -1)
        assert out.shape == (num_bags, 3) and torch.equal(out, torch.zeros_like(out))
        assert torch.equal(o2b, torch.full_like(o2b, -1)) or num_bags > 0
        if num_bags > 0:
            (dw,) = torch.autograd.grad(out, w, torch.randn_like(out))
            assert torch.equal(dw, torch.zeros_like(dw))
    out = baracuda_ops.embedding_bag(torch.tensor([0, 1], device=device), torch.randn(4, 0, device=device),
                                     torch.tensor([0], device=device), mode=mode)
    assert out.shape == (1, 0)
    empty = torch.empty(0, dtype=torch.long, device=device)
    dw = torch.ops.baracuda.embedding_bag_backward(torch.randn(2, 3, device=device), empty, empty,
                                                   torch.zeros(2, dtype=torch.long, device=device),
                                                   torch.full((2, 3), -1, device=device), 0, m, None, -1)
    assert dw.shape == (0, 3)


@pytest.mark.parametrize("mode", MODES)
def test_non_contiguous_inputs(device, mode):
    base = torch.randn(12, 25, device=device)
    w = base.t()  # [25, 12], not contiguous
    idx = torch.randint(0, 25, (80,), device=device)[::2]
    off = torch.tensor([0, 0, 3, 9, 9, 9, 30], device=device)[::1]
    psw = torch.randn(80, device=device)[::2] if mode == "sum" else None
    assert not w.is_contiguous() and not idx.is_contiguous()
    check_against_reference(idx, w, off, mode, psw=psw)
    offset_view = torch.randn(25 * 12 + 1, device=device)[1:].view(25, 12)  # an unaligned view
    check_against_reference(idx, offset_view, off, mode)


@pytest.mark.parametrize("mode", MODES)
def test_vmap_bad_sample_raises_or_flags(device, mode):
    # A sample's bad index or offsets: the op's error on CPU; on CUDA its flags (NaN row,
    # bag_size -1), bag by bag as the op flags them per sample.
    n, num_weights = 3, 25
    weight, weights = torch.randn(num_weights, 6, device=device), torch.randn(n, num_weights, 6, device=device)
    idx = torch.stack([make_bags(device)[0] for _ in range(n)])
    off = torch.stack([make_bags(device)[1], torch.tensor([0, 0, 1, 9, 9, 30, 39], device=device),
                       torch.tensor([0, 2, 4, 8, 16, 32, 40], device=device)])
    bad_idx, bad_off = idx.clone(), off.clone()
    bad_idx[1, 7] = num_weights + 4
    bad_off[2, 0], bad_off[1, 6] = 2, 45  # (no decreasing offsets: overlapping bags race on offset2bag)
    if device.type == "cpu":
        with pytest.raises(IndexError, match=r"indices\[7\] = 29 is out of range for 25 embeddings"):
            torch.func.vmap(lambda i: baracuda_ops.embedding_bag(i, weight, off[0], mode=mode))(bad_idx)
        with pytest.raises(ValueError, match=r"offsets\[6\] = 45 is past the end of indices \(40 indices\)"):
            torch.func.vmap(lambda o: baracuda_ops.embedding_bag(idx[0], weight, o, mode=mode))(bad_off)
    else:
        check_vmap_matches_per_sample(
            lambda w, i, o: torch.ops.baracuda.embedding_bag(w, i, o, MODE_ENUM[mode], None, False, -1),
            [weights, bad_idx, bad_off], [0, 0, 0], exact=False)


def skewed_indices(n, num_weights, device):
    """Zipf(1.05) indices with 60% of the positions on one row: long runs across many chunks."""
    idx = zipf_indices(n, num_weights, 1.05, device)
    hot = torch.rand(n, device=device) < 0.6
    return torch.where(hot, torch.full_like(idx, 7), idx)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_backward_skewed_bit_identical_and_correct(device, mode, dtype):
    n, num_weights, dim = 30000, 300, 16
    idx = skewed_indices(n, num_weights, device)
    off = torch.arange(0, n, 6, device=device)
    w = torch.randn(num_weights, dim, device=device, dtype=dtype)
    psw = torch.randn(n, device=device, dtype=dtype) if mode == "sum" else None
    out, o2b, bag_size, max_positions = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], psw, False, 5)
    grad = torch.randn_like(out)
    args = (grad, idx, o2b, bag_size, max_positions, num_weights, MODE_ENUM[mode], psw, 5)
    a = torch.ops.baracuda.embedding_bag_backward(*args)
    b = torch.ops.baracuda.embedding_bag_backward(*args)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if dtype == torch.float64:
        ref, w64, _ = reference(idx, w, off, mode, psw, padding_idx=5)
        (ref_dw,) = torch.autograd.grad(ref, w64, grad.cpu())
        torch.testing.assert_close(a.cpu(), ref_dw, rtol=1e-9, atol=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [3, 40, 128])
def test_cuda_backward_rows_of_few_positions_match_cpu_bit_for_bit(mode, dtype, dim):
    # A row that at most two used positions name is a sum of at most two terms from zero,
    # the same in any order, so the CUDA and CPU kernels agree on it bit for bit; rows of
    # more positions agree within rounding only (the CUDA sweep adds the partial sums of
    # a run that crosses its chunks; the CPU kernel sums each row in position order). Row
    # r is named r % 6 times (padding_idx 5 five times), some rows twice or three times in
    # one bag; dims 3 (scalar kernels), 40 (not a multiple of 32) and 128.
    num_weights = 3000
    gen = torch.Generator().manual_seed(dim)
    idx = torch.repeat_interleave(torch.arange(num_weights), torch.arange(num_weights) % 6)
    idx = idx[torch.randperm(idx.numel(), generator=gen)]
    idx[0:2] = 1      # twice in bag 0
    idx[8:10] = 2     # twice in bag 2
    idx[12:15] = 3    # three times in bag 3
    off = torch.arange(0, idx.numel(), 4)
    w = torch.randn(num_weights, dim, dtype=dtype, generator=gen)
    out, o2b, bag_size, mp = torch.ops.baracuda.embedding_bag(w.cuda(), idx.cuda(), off.cuda(), MODE_ENUM[mode],
                                                              None, False, 5)
    grad = torch.randn(out.shape, dtype=dtype, generator=gen)
    args = [grad, idx, o2b.cpu(), bag_size.cpu(), mp.cpu()]
    want = torch.ops.baracuda.embedding_bag_backward(*args, num_weights, MODE_ENUM[mode], None, 5)
    got = torch.ops.baracuda.embedding_bag_backward(*[a.cuda() for a in args], num_weights, MODE_ENUM[mode], None,
                                                    5).cpu()
    few = torch.bincount(idx[idx != 5], minlength=num_weights) <= 2
    assert few.sum() > num_weights // 3 and (~few).sum() > num_weights // 3
    assert torch.equal(got[few].view(torch.uint8), want[few].view(torch.uint8))
    assert_close(got, want, dtype=dtype, scale=4)


@pytest.mark.parametrize("dim", [8, 40, 64])
def test_backward_max_positions_outside_their_bag_add_nothing(device, dim):
    # max mode adds grad[bag, d] to row indices[p] where p = max_positions[bag, d] is a
    # position of that bag; entries naming another bag's position, or -1, add nothing.
    # (A position past the indices raises on CPU; CUDA cannot raise, it skips it.) dim
    # 40 is not a multiple of 32 (the CUDA kernel's won-column words).
    idx, off = make_bags(device)
    w = torch.randn(25, dim, device=device, dtype=torch.float64)
    _, o2b, bag_size, max_positions = torch.ops.baracuda.embedding_bag(w, idx, off, 2, None, False, -1)
    mp = max_positions.clone()
    mp[0, 0] = 30         # a position of bag 4
    mp[3, 1::3] = -1
    mp[5, :5] = mp[4, :5]  # bag 4's argmax positions
    grad = torch.randn(mp.shape, device=device, dtype=torch.float64)
    got = torch.ops.baracuda.embedding_bag_backward(grad, idx, o2b, bag_size, mp, 25, 2, None, -1)
    want = torch.zeros(25, dim, dtype=torch.float64)
    o2b_c, idx_c = o2b.cpu(), idx.cpu()
    for b, d in [(b, d) for b in range(mp.shape[0]) for d in range(dim)]:
        p = int(mp[b, d])
        if 0 <= p < idx.numel() and int(o2b_c[p]) == b:
            want[int(idx_c[p]), d] += float(grad[b, d])
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_cpu_backward_max_bags_out_of_order_sums_in_position_order():
    # A caller's offset2bag need not ascend (the forward's always does, and then the CPU kernel
    # adds the bags' winners in bag order); the max-mode gradient still adds each row's terms
    # in position order, bit for bit.
    gen = torch.Generator().manual_seed(0)
    n, bags, dim, rows = 400, 40, 5, 2  # ~20 terms a row and column, 1e-3 to 1e3: their order shows
    idx = torch.randint(0, rows, (n,), generator=gen)
    o2b = torch.arange(n) % bags  # a bag's positions interleaved with the others'
    mp = torch.stack([b + bags * torch.randint(0, n // bags, (dim,), generator=gen) for b in range(bags)])
    grad = torch.randn(bags, dim, generator=gen) * 10 ** (6 * torch.rand(bags, dim, generator=gen) - 3)
    got = torch.ops.baracuda.embedding_bag_backward(grad, idx, o2b, torch.full((bags,), n // bags), mp, rows, 2,
                                                    None, -1)
    want = torch.zeros(rows, dim)
    for p in range(n):
        b = int(o2b[p])
        for d in range(dim):
            if int(mp[b, d]) == p:
                want[int(idx[p]), d] += grad[b, d]
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("mode", MODES)
def test_use_deterministic_algorithms(device, mode):
    idx = skewed_indices(2000, 50, device)
    off = torch.arange(0, 2000, 7, device=device)
    w = torch.randn(50, 32, device=device, requires_grad=True)
    psw = torch.randn(2000, device=device, requires_grad=True) if mode == "sum" else None
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    options = [{}, {"max_norm": 3.0}] + ([] if mode == "max" else [{"scale_grad_by_freq": True}, {"sparse": True}])
    try:
        results = []
        for _ in range(2):
            for kwargs in options:
                wk = w.detach().clone().requires_grad_()  # max_norm changes it in place
                out = baracuda_ops.embedding_bag(idx, wk, off, mode=mode, per_sample_weights=psw, **kwargs)
                grads = torch.autograd.grad(out.square().sum(), [wk] + ([psw] if psw is not None else []))
                results.append([out] + [g.to_dense() for g in grads])
    finally:
        torch.use_deterministic_algorithms(before)
    half = len(results) // 2
    for first, second in zip(results[:half], results[half:]):
        for x, y in zip(first, second):
            assert torch.equal(x.view(torch.int32), y.view(torch.int32))


# ---------------------------------------------------------------------------- max_norm, scale_grad_by_freq, sparse


def _run(fn, idx, w0, off, per_sample_weights=None, **kwargs):
    """fn (F.embedding_bag or ours) on a copy of w0 (max_norm changes it in place): the output, the
    weight after the call, and the gradients of a fixed function of the output w.r.t. the weight
    (and per_sample_weights when given)."""
    w = w0.detach().clone().requires_grad_()
    psw = [] if per_sample_weights is None else [per_sample_weights.detach().clone().requires_grad_()]
    out, *grads = outputs_and_grads(lambda w, p=None: fn(idx, w, off, per_sample_weights=p, **kwargs), [w] + psw)
    return out, w.detach(), grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_max_norm_renormalises_like_F(device, mode, norm_type):
    # The rows the indices name (the padding row too, as PyTorch) are scaled to max_norm in place
    # by torch.embedding_renorm_ first; the output and gradients then follow from the new rows.
    idx, off = make_bags(device)
    w0 = torch.randn(25, 12, device=device) * 2
    kwargs = dict(mode=mode, max_norm=1.5, norm_type=norm_type, padding_idx=idx[7].item())
    (ref, ref_w, ref_g), (out, w, g) = (_run(fn, idx, w0, off, **kwargs) for fn in (F.embedding_bag, baracuda_ops.embedding_bag))
    torch.testing.assert_close(w, ref_w, rtol=0, atol=0)
    # (PyTorch's CUDA renorm computes an infinity norm as 1 and leaves the rows: so do we.)
    assert not torch.equal(w, w0) or (device.type == "cuda" and norm_type == float("inf"))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g[0], ref_g[0], rtol=1e-5, atol=1e-5)


def _divided_by_counts(grad_weight, indices):
    """Row r of a dense gradient divided by the number of times r occurs in indices (at least 1)."""
    counts = torch.bincount(indices.reshape(-1).cpu(), minlength=grad_weight.shape[0]).clamp(min=1)
    return grad_weight / counts.to(grad_weight.device, grad_weight.dtype).unsqueeze(1)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scale_grad_by_freq_divides_each_row_by_its_count(device, mode, dtype):
    # Row r's gradient divided by how often r occurs in the indices (all of them, padding
    # included, as PyTorch counts), on skewed indices so that counts reach the hundreds; against
    # F.embedding_bag's unscaled float64 gradient divided so (PyTorch's CPU kernel divided by
    # wrong counts before 2.14, pytorch#190063; since then it agrees, which the local CI checks).
    idx = skewed_indices(1500, 40, device)
    off = torch.arange(0, 1500, 11, device=device)
    w0 = torch.randn(40, 16, device=device, dtype=dtype)
    psw = torch.randn(1500, device=device, dtype=dtype) if mode == "sum" else None
    for padding_idx in (None, 7):
        kwargs = dict(mode=mode, padding_idx=padding_idx, per_sample_weights=psw)
        _, _, ref_g = _run(F.embedding_bag, idx.cpu(), w0.cpu().double(), off.cpu(),
                           **{**kwargs, "per_sample_weights": None if psw is None else psw.cpu().double()})
        _, _, g = _run(baracuda_ops.embedding_bag, idx, w0, off, scale_grad_by_freq=True, **kwargs)
        expected = [_divided_by_counts(ref_g[0], idx)] + list(ref_g[1:])  # per_sample_weights' is not scaled
        for a, b in zip(g, expected, strict=True):
            assert a.dtype == dtype and a.layout == torch.strided
            assert_close(a, b, dtype=dtype, scale=16)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_sparse_grad_matches_F(device, mode, dtype):
    # A sparse COO gradient with an entry per position, in position order, not coalesced:
    # F.embedding_bag's entries and values at the non-padding positions, value 0 at the padding
    # ones (which F leaves out: no host sync counts the entries); per_sample_weights' gradient
    # stays dense.
    cases = [(make_bags(device), {}), (make_bags(device), {"include_last_offset": True}),
             ((torch.randint(0, 25, (6, 4), device=device), None), {})]
    for (idx, off), extra in cases:
        idx[..., 1] = 3  # the padding row occurs
        w0 = torch.randn(25, 12, device=device, dtype=dtype)
        psw = torch.randn(idx.shape, device=device, dtype=dtype) if mode == "sum" else None
        for padding_idx in (None, 3):
            kwargs = dict(mode=mode, sparse=True, padding_idx=padding_idx, **extra)
            # The reference: F.embedding_bag in float64 on CPU (its CUDA per_sample_weights
            # backward has no bfloat16 in PyTorch 2.11).
            ref, _, ref_g = _run(F.embedding_bag, idx.cpu(), w0.cpu().double(), None if off is None else off.cpu(),
                                 per_sample_weights=None if psw is None else psw.cpu().double(), **kwargs)
            out, _, g = _run(baracuda_ops.embedding_bag, idx, w0, off, per_sample_weights=psw, **kwargs)
            assert_close(out, ref, dtype=dtype, scale=4)
            assert g[0].layout == ref_g[0].layout == torch.sparse_coo and not g[0].is_coalesced()
            kept = (idx.reshape(-1) != (-1 if padding_idx is None else padding_idx)).cpu()
            assert torch.equal(g[0]._indices().cpu()[:, kept], ref_g[0]._indices())
            assert_close(g[0]._values().cpu()[kept], ref_g[0]._values(), dtype=dtype)
            assert (g[0]._values().cpu()[~kept] == 0).all()
            for a, b in zip(g[1:], ref_g[1:], strict=True):
                assert a.layout == torch.strided
                assert_close(a, b, dtype=dtype, scale=4)


def test_sparse_with_scale_grad_by_freq_raises_in_backward(device):
    # As F.embedding_bag: the forward runs, the backward refuses.
    idx, off = make_bags(device)
    w = torch.randn(25, 4, device=device, requires_grad=True)
    out = baracuda_ops.embedding_bag(idx, w, off, mode="sum", sparse=True, scale_grad_by_freq=True)
    assert_close(out, F.embedding_bag(idx, w, off, mode="sum"), dtype=torch.float32, scale=4)
    with pytest.raises(baracuda_ops.UnsupportedError, match="scale_grad_by_freq is not supported with sparse"):
        out.sum().backward()


def test_gradient_options_compile(device):
    # max_norm and scale_grad_by_freq: fullgraph, dynamic. sparse=True: Dynamo cannot hold the
    # sparse gradient of our autograd.Function (F.embedding_bag's comes from ATen), so it breaks
    # the graph there: compiled without fullgraph, the same values as eager.
    idx, off = make_bags(device)
    for kwargs in ({"max_norm": 1.0, "mode": "mean"}, {"scale_grad_by_freq": True, "mode": "sum", "padding_idx": 3}):
        def fn(w, i, o):
            return baracuda_ops.embedding_bag(i, w * 2, o, **kwargs).sin()

        check_compile_matches_eager(fn, [torch.randn(25, 8, device=device, requires_grad=True), idx, off])

    def sparse_fn(w, i, o):
        return baracuda_ops.embedding_bag(i, w, o, mode="mean", sparse=True, padding_idx=3).sin()

    w = torch.randn(25, 8, device=device, requires_grad=True)
    torch._dynamo.reset()
    (compiled,) = torch.autograd.grad(torch.compile(sparse_fn, dynamic=True)(w, idx, off).sum(), w)
    (eager,) = torch.autograd.grad(sparse_fn(w, idx, off).sum(), w)
    assert torch.equal(compiled._indices(), eager._indices())
    torch.testing.assert_close(compiled._values(), eager._values(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- Plan API


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_run_writes_every_element(device, mode, dtype):
    idx, off = make_bags(device, torch.int32)
    desc = baracuda_ops.EmbeddingBagDescriptor(25, 24, (40,), 7, mode, dtype, torch.int32, device=device)
    plan = baracuda_ops.EmbeddingBagPlan.select(desc)
    w = torch.randn(25, 24, device=device, dtype=dtype)
    args = baracuda_ops.EmbeddingBagArgs(
        w, idx, off, poison(torch.empty(7, 24, device=device, dtype=dtype)),
        poison(torch.empty(40, dtype=torch.long, device=device)), poison(torch.empty(7, dtype=torch.long, device=device)),
        poison(torch.empty((7, 24) if mode == "max" else (0,), dtype=torch.long, device=device)))
    plan.run(args)
    expected = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], None, False, -1)
    for got, want in zip((args.output, args.offset2bag, args.bag_size, args.max_positions), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_close(args.output, F.embedding_bag(idx.long().cpu(), w.cpu().double(), off.long().cpu(), mode=mode),
                 dtype=dtype, scale=4)
    sku = plan.sku()
    assert sku.op == "embedding_bag" and sku.device_type == device.type and sku.index_dtype == torch.int32
    # D = 24: 6 float32 or 3 bfloat16 16-byte vectors per row, so teams of 8 or 4 threads.
    team = 8 if dtype == torch.float32 else 4
    isa = baracuda_ops.build_info()["cpu_vector_isa"]
    if device.type == "cpu":
        assert sku.variant == f"cpu_bag_loop<{isa}>"
    config = launch_config("embedding_bag", desc.problem(), dtype)
    assert (config.kind, config["team"], config["vec_bytes"]) == ("bag_gather", team, 16)
    assert plan.workspace_size() == 0 and plan.precision_guarantee().deterministic


@pytest.mark.parametrize("mode", MODES)
def test_backward_plan_with_caller_workspace(device, mode):
    idx = skewed_indices(20000, 100, device)
    off = torch.arange(0, 20000, 10, device=device)
    w = torch.randn(100, 32, device=device, requires_grad=True)
    psw = torch.randn(20000, device=device) if mode == "sum" else None
    out, o2b, bag_size, max_positions = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], psw, False, -1)
    grad = torch.randn_like(out)
    desc = baracuda_ops.EmbeddingBagBackwardDescriptor(100, 32, (20000,), 2000, mode, device=device,
                                                       per_sample_weights=psw is not None)
    plan = baracuda_ops.EmbeddingBagBackwardPlan.select(desc)
    assert plan.workspace_size() > 0
    if device.type == "cpu":  # float32 max mode adds the bags' winners in bag order
        isa = baracuda_ops.build_info()["cpu_vector_isa"]
        assert plan.sku().variant == ("cpu_max_winners_by_bag" if mode == "max" else f"cpu_counting_sort_rows<{isa}>")
    problem = [100, 32, 20000, 2000, MODE_ENUM[mode], int(psw is not None)]
    assert launch_config("embedding_bag_backward", problem, torch.float32).kind == "sort_segment"
    gw = poison(torch.empty(100, 32, device=device))
    gpsw = poison(torch.empty(20000, device=device)) if psw is not None else None
    args = baracuda_ops.EmbeddingBagBackwardArgs(grad, idx, o2b, bag_size, max_positions, gw, psw,
                                                 w.detach() if psw is not None else None, gpsw)
    plan.run(args, baracuda_ops.Workspace.allocate(plan.workspace_size(), device))
    expected = torch.ops.baracuda.embedding_bag_backward(grad, idx, o2b, bag_size, max_positions, 100,
                                                         MODE_ENUM[mode], psw, -1)
    torch.testing.assert_close(gw, expected, rtol=0, atol=0)
    if gpsw is not None:
        torch.testing.assert_close(
            gpsw, torch.ops.baracuda.embedding_bag_per_sample_weights_backward(grad, w.detach(), idx, o2b, 0, -1),
            rtol=0, atol=0)
    with pytest.raises(baracuda_ops.WorkspaceTooSmallError):
        plan.run(args, baracuda_ops.Workspace.allocate(plan.workspace_size() - 1, device))
    with pytest.raises(baracuda_ops.UnsupportedError):
        baracuda_ops.EmbeddingBagBackwardPlan.select(desc, baracuda_ops.PlanPreference(max_workspace_bytes=0))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_weights,n,dim", [(1003, 300, 3), (1003, 300, 8), (1003, 300, 64), (1003, 300, 200),
                                               (200_000, 20_000, 64)])
def test_backward_out_writes_every_row_over_dirty_buffers(device, mode, num_weights, n, dim):
    # Most of the 1003 rows (not a multiple of 32) have no position and must come out
    # zero; the last row, in the CUDA fill's last partial group of 32 rows, has many.
    # grad_weight starts as NaN and the workspace as 0xff bytes. dim 3 takes the scalar
    # kernels; dims 3 and 8 take the late fill on CUDA, 64 and 200 the early one. With
    # 200000 rows the early fill's grid (a share of the SMs) walks the rows many times.
    idx = torch.randint(0, num_weights, (n,), device=device)
    idx[::7] = num_weights - 1
    off = torch.arange(0, n, 5, device=device)
    w = torch.randn(num_weights, dim, device=device)
    out, o2b, bag_size, mp = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], None, False, -1)
    grad = torch.randn_like(out)
    desc = baracuda_ops.EmbeddingBagBackwardDescriptor(num_weights, dim, (n,), off.numel(), mode, device=device)
    plan = baracuda_ops.EmbeddingBagBackwardPlan.select(desc)
    # On CUDA the fill of unused rows starts early from 512 bytes of grad_weight per index.
    config = launch_config("embedding_bag_backward", [num_weights, dim, n, off.numel(), MODE_ENUM[mode], 0],
                           torch.float32)
    assert config["early_fill"] == (num_weights * dim * 4 >= 512 * n)
    ws = baracuda_ops.Workspace.allocate(plan.workspace_size(), device)
    ws.buffer.fill_(255)
    gw = poison(torch.empty(num_weights, dim, device=device))
    plan.run(baracuda_ops.EmbeddingBagBackwardArgs(grad, idx, o2b, bag_size, mp, gw), ws)
    ref, w64, _ = reference(idx, w, off, mode)
    (ref_dw,) = torch.autograd.grad(ref, w64, grad.cpu().double())
    assert_close(gw, ref_dw, dtype=torch.float32, scale=4)
    unused = torch.ones(num_weights, dtype=torch.bool)
    unused[idx.cpu()] = False
    assert unused.sum() > num_weights // 2 and torch.equal(gw.cpu()[unused], torch.zeros(int(unused.sum()), dim))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_weights", [65535, 65536, 262143, 262144])
def test_backward_sort_key_widths(device, mode, num_weights):
    # The sort keys lie in [0, num_weights]: 16, 17, 18 and 19 bits. CUDA sorts 17- and
    # 18-bit keys in 9-bit digits (two passes), the others in 8-bit ones. Hot rows at
    # both ends of the range, so that both digits of the top pass carry long runs.
    n, dim = 40000, 8
    idx = torch.randint(0, num_weights, (n,), device=device)
    idx[::97] = num_weights - 1
    idx[1::89] = 0
    idx[2::83] = num_weights // 2 + 1
    off = torch.arange(0, n, 8, device=device)
    w = torch.randn(num_weights, dim, device=device)
    out, o2b, bag_size, mp = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], None, False, -1)
    grad = torch.randn_like(out)
    wide = num_weights in (65536, 262143)
    problem = [num_weights, dim, n, off.numel(), MODE_ENUM[mode], 0]
    assert launch_config("embedding_bag_backward", problem, torch.float32)["radix_bits"] == (9 if wide else 8)
    gw = torch.ops.baracuda.embedding_bag_backward(grad, idx, o2b, bag_size, mp, num_weights, MODE_ENUM[mode], None,
                                                   -1)
    ref, w64, _ = reference(idx, w, off, mode)
    (ref_dw,) = torch.autograd.grad(ref, w64, grad.cpu().double())
    assert_close(gw, ref_dw, dtype=torch.float32, scale=4)
    again = torch.ops.baracuda.embedding_bag_backward(grad, idx, o2b, bag_size, mp, num_weights, MODE_ENUM[mode],
                                                      None, -1)
    assert torch.equal(gw, again)


def test_plan_errors(device):
    desc = baracuda_ops.EmbeddingBagDescriptor(25, 8, (40,), 7, "sum", device=device)
    plan = baracuda_ops.EmbeddingBagPlan.select(desc)
    idx, off = make_bags(device)
    w = torch.randn(25, 8, device=device)
    outs = [torch.empty(7, 8, device=device), torch.empty(40, dtype=torch.long, device=device),
            torch.empty(7, dtype=torch.long, device=device), torch.empty(0, dtype=torch.long, device=device)]
    with pytest.raises(baracuda_ops.BufferTooSmallError):
        plan.run(baracuda_ops.EmbeddingBagArgs(w, idx, off, torch.empty(6, 8, device=device), *outs[1:]))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.EmbeddingBagArgs(w.double(), idx, off, *outs))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.EmbeddingBagArgs(w, idx, None, *outs))
    if device.type == "cpu":
        bad = idx.clone()
        bad[0] = 25
        with pytest.raises(baracuda_ops.InvalidProblemError, match="out of range"):
            plan.run(baracuda_ops.EmbeddingBagArgs(w, bad, off, *outs))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="per_sample_weights is only supported"):
        baracuda_ops.EmbeddingBagPlan.select(baracuda_ops.EmbeddingBagDescriptor(
            25, 8, (40,), 7, "max", per_sample_weights=True, device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="mode has to be one of"):
        baracuda_ops.EmbeddingBagPlan.select(baracuda_ops.EmbeddingBagDescriptor(25, 8, (40,), 7, "min", device=device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="int32 or int64"):
        baracuda_ops.EmbeddingBagPlan.select(baracuda_ops.EmbeddingBagDescriptor(
            25, 8, (40,), 7, index_dtype=torch.int16, device=device))


# ---------------------------------------------------------------------------- nn module


def test_module_is_drop_in(device):
    ref = torch.nn.EmbeddingBag(30, 6, mode="max", padding_idx=2).to(device)
    ours = baracuda_ops.nn.EmbeddingBag(30, 6, mode="max", padding_idx=2).to(device)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]
    idx, off = make_bags(device, num_weights=30)
    torch.testing.assert_close(ours(idx, off), ref(idx, off), rtol=0, atol=0)
    pre = torch.randn(30, 6, device=device)
    m = baracuda_ops.nn.EmbeddingBag.from_pretrained(pre, freeze=False, mode="sum", include_last_offset=True)
    assert isinstance(m, baracuda_ops.nn.EmbeddingBag) and m.weight.requires_grad
    r = torch.nn.EmbeddingBag.from_pretrained(pre, freeze=False, mode="sum", include_last_offset=True)
    psw = torch.randn(40, device=device)
    torch.testing.assert_close(m(idx, off, psw), r(idx, off, psw), rtol=1e-5, atol=1e-5)
    m(idx, off, psw).sum().backward()
    r(idx, off, psw).sum().backward()
    torch.testing.assert_close(m.weight.grad, r.weight.grad, rtol=1e-5, atol=1e-5)
    # max_norm, scale_grad_by_freq and sparse reach the functional (tested there).
    # (scale_grad_by_freq against the torch module's unscaled gradient divided by the counts:
    # PyTorch's CPU kernel divided by wrong counts before 2.14, pytorch#190063.)
    for kwargs in ({"sparse": True}, {"scale_grad_by_freq": True}, {"max_norm": 0.5, "norm_type": 1.0}):
        torch.manual_seed(1)
        ref = torch.nn.EmbeddingBag(30, 6, mode="sum", padding_idx=2, sparse=kwargs.get("sparse", False),
                                    max_norm=kwargs.get("max_norm"), norm_type=kwargs.get("norm_type", 2.0)).to(device)
        ours = baracuda_ops.nn.EmbeddingBag(30, 6, mode="sum", padding_idx=2, **kwargs).to(device)
        ours.load_state_dict(ref.state_dict())
        ours(idx, off).square().sum().backward()
        ref(idx, off).square().sum().backward()
        torch.testing.assert_close(ours.weight, ref.weight, rtol=0, atol=0)  # max_norm renormalised in place alike
        assert ours.weight.grad.layout == ref.weight.grad.layout
        expected = ref.weight.grad.to_dense()
        if kwargs.get("scale_grad_by_freq"):
            expected = _divided_by_counts(expected, idx)
        torch.testing.assert_close(ours.weight.grad.to_dense(), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- past 2^31 elements


@pytest.mark.big_memory
@pytest.mark.parametrize("mode", MODES)
def test_cuda_weight_past_2_31_elements_matches_F(mode):
    # A [2^24 + 5, 128] bfloat16 table: rows 2^24 on lie wholly past element 2^31, and the
    # first bags use them (each several times, so max mode has ties to resolve). Forward
    # and grad_weight against PyTorch's CUDA kernels (in max mode, which has no bfloat16
    # backward on CUDA, a float64 sum over its forward's max_indices); the rows no index
    # names keep a zero gradient.
    require_free_gpu_memory(16)
    v, d, dtype = (1 << 24) + 5, 128, torch.bfloat16
    w = torch.randn(v, d, dtype=dtype, device="cuda", requires_grad=True)
    idx = torch.randint(0, v, (32768,), device="cuda")
    idx[:64] = v - 1 - torch.arange(64, device="cuda") % 5
    off = torch.arange(0, 32768, 8, device="cuda")
    out = baracuda_ops.embedding_bag(idx, w, off, mode=mode)
    ref = F.embedding_bag(idx, w, off, mode=mode)
    if mode == "max":
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2)
    grad = torch.randn_like(out)
    (dw,) = torch.autograd.grad(out, [w], grad)
    used = idx.unique()
    if mode == "max":
        max_indices = torch.ops.aten._embedding_bag(w.detach(), idx, off, False, MODE_ENUM[mode])[3]
        ref_used = torch.zeros(len(used), d, dtype=torch.float64, device="cuda")
        ref_used.scatter_add_(0, torch.searchsorted(used, max_indices), grad.double())
    else:
        ref_used = torch.autograd.grad(ref, [w], grad)[0][used]
    torch.testing.assert_close(dw[used], ref_used.to(dtype), rtol=1.6e-2, atol=1.6e-2)
    assert not dw.index_fill_(0, used, 0).any()


@pytest.mark.big_memory
def test_cuda_output_past_2_31_elements_matches_float64():
    # 2^24 + 64 bags of two (2-D int32 input, mean mode) of 128 bfloat16 columns: the last
    # 64 bags' outputs lie past element 2^31. Forward against PyTorch's CUDA kernel; the
    # gradient (about 33,000 terms a row) against a float64 sum, the last bags' grad scaled
    # up so that a bag lost or read from the wrong place shows.
    require_free_gpu_memory(16)
    b, d, v, dtype = (1 << 24) + 64, 128, 1000, torch.bfloat16
    w = torch.randn(v, d, dtype=dtype, device="cuda", requires_grad=True)
    idx = torch.randint(0, v, (b, 2), device="cuda", dtype=torch.int32)
    out = baracuda_ops.embedding_bag(idx, w, mode="mean")
    ref = F.embedding_bag(idx, w.detach(), mode="mean")
    chunk = 1 << 20
    for r in range(0, b, chunk):
        torch.testing.assert_close(out[r:r + chunk], ref[r:r + chunk], rtol=1.6e-2, atol=1.6e-2)
    del ref
    grad = torch.randn_like(out)
    grad[-64:] *= 1000
    (dw,) = torch.autograd.grad(out, [w], grad)
    ref_dw = torch.zeros(v, d, dtype=torch.float64, device="cuda")
    magnitude = torch.zeros_like(ref_dw)
    for r in range(0, b, chunk):
        terms = grad[r:r + chunk].double().repeat_interleave(2, 0) / 2  # a bag's two positions, in order
        ref_dw.index_add_(0, idx[r:r + chunk].reshape(-1).long(), terms)
        magnitude.index_add_(0, idx[r:r + chunk].reshape(-1).long(), terms.abs())
    # A float32 sum per row, rounded once to bfloat16.
    bound = 1.6e-2 * ref_dw.abs() + 4 * 2.0**-23 * magnitude
    assert bool(((dw.double() - ref_dw).abs() <= bound).all()), ((dw.double() - ref_dw).abs().max(), bound.min())


# ---------------------------------------------------------------------------- CUDA bad-index reporting


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_flags_bad_bags_without_raising(mode):
    w = torch.randn(10, 8, device="cuda", requires_grad=True)
    idx = torch.tensor([1, 2, 3, 12, 4, 5, -1, 6, 7], device="cuda")
    off = torch.tensor([0, 3, 6, 7], device="cuda")  # bag 1 has 12, bag 2 has -1
    out = baracuda_ops.embedding_bag(idx, w, off, mode=mode)
    _, _, bag_size, _ = torch.ops.baracuda.embedding_bag(w, idx, off, MODE_ENUM[mode], None, False, -1)
    assert bag_size.tolist()[1:3] == [-1, -1]
    assert torch.isnan(out[1:3]).all() and not torch.isnan(out[[0, 3]]).any()
    good = F.embedding_bag(idx.cpu()[[0, 1, 2, 7, 8]], w.detach().cpu(), torch.tensor([0, 3]), mode=mode)
    torch.testing.assert_close(out[[0, 3]].detach().cpu(), good)
    (dw,) = torch.autograd.grad(out[[0, 3]].sum(), w)  # backward skips the bad entries
    torch.cuda.synchronize()
    assert torch.isfinite(dw).all()
    if mode != "max":  # the gradient options skip them too (no index out of range reaches an op)
        for kwargs in ({"scale_grad_by_freq": True}, {"sparse": True}):
            o = baracuda_ops.embedding_bag(idx, w, off, mode=mode, **kwargs)
            (g,) = torch.autograd.grad(o[[0, 3]].sum(), w)
            torch.cuda.synchronize()
            assert torch.isfinite(g.to_dense()).all()
    # Offsets that decrease, pass N or do not start at 0: the bags involved are flagged.
    for bad_off in ([0, 5, 3, 7], [0, 3, 6, 20], [2, 3, 6, 7]):
        o = baracuda_ops.embedding_bag(idx.clamp(0, 9), w, torch.tensor(bad_off, device="cuda"), mode=mode)
        assert torch.isnan(o).any()
    torch.cuda.synchronize()  # the context is still healthy
    assert torch.ones(3, device="cuda").sum().item() == 3


# ---------------------------------------------------------------------------- schemas and errors


class TestEmbeddingBagMessages(TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.w = torch.randn(10, 4)
        self.idx = torch.tensor([1, 2, 3, 4, 5])
        self.off = torch.tensor([0, 2])

    def test_schemas(self):
        ops = torch.ops.baracuda
        self.assertExpectedInline(
            "\n".join(str(op._schema) for op in (
                ops.embedding_bag.default, ops.embedding_bag.out, ops.embedding_bag_backward.default,
                ops.embedding_bag_backward.out, ops.embedding_bag_per_sample_weights_backward.default,
                ops.embedding_bag_per_sample_weights_backward.out)),
            """\
baracuda::embedding_bag(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode=0, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> (Tensor output, Tensor offset2bag, Tensor bag_size, Tensor max_positions)
baracuda::embedding_bag.out(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode=0, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1, *, Tensor(a!) output, Tensor(b!) offset2bag, Tensor(c!) bag_size, Tensor(d!) max_positions) -> ()
baracuda::embedding_bag_backward(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size, Tensor max_positions, SymInt num_weights, int bag_mode, Tensor? per_sample_weights=None, int padding_idx=-1) -> Tensor
baracuda::embedding_bag_backward.out(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size, Tensor max_positions, SymInt num_weights, int bag_mode, Tensor? per_sample_weights=None, int padding_idx=-1, *, Tensor(a!) grad_weight, Tensor(b!) workspace) -> ()
baracuda::embedding_bag_per_sample_weights_backward(Tensor grad, Tensor weight, Tensor indices, Tensor offset2bag, int bag_mode, int padding_idx=-1) -> Tensor
baracuda::embedding_bag_per_sample_weights_backward.out(Tensor grad, Tensor weight, Tensor indices, Tensor offset2bag, int bag_mode, int padding_idx=-1, *, Tensor(a!) grad_per_sample_weights) -> ()""",
        )

    def test_index_out_of_range(self):
        idx = torch.tensor([1, 2, 10])
        self.assertExpectedRaisesInline(
            IndexError, lambda: baracuda_ops.embedding_bag(idx, self.w, self.off), """baracuda::embedding_bag: indices[2] = 10 is out of range for 10 embeddings (expected 0 <= index < 10)""")

    def test_index_out_of_range_in_no_bag(self):
        # the positions after the last bag (include_last_offset) are summed by no bag, and checked all the same
        idx = torch.tensor([1, 2, 10])
        self.assertExpectedRaisesInline(
            IndexError, lambda: baracuda_ops.embedding_bag(idx, self.w, torch.tensor([0, 2]), include_last_offset=True), """baracuda::embedding_bag: indices[2] = 10 is out of range for 10 embeddings (expected 0 <= index < 10)""")

    def test_negative_index(self):
        idx = torch.tensor([1, -1, 3])
        self.assertExpectedRaisesInline(
            IndexError, lambda: baracuda_ops.embedding_bag(idx, self.w, self.off, padding_idx=-1), """baracuda::embedding_bag: indices[1] = -1 is out of range for 10 embeddings (expected 0 <= index < 10)""")

    def test_first_offset_not_zero(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, torch.tensor([1, 2])), """baracuda::embedding_bag: offsets[0] must be 0, got 1""")

    def test_decreasing_offsets(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, torch.tensor([0, 3, 2])), """baracuda::embedding_bag: offsets must be non-decreasing, got offsets[2] = 2 after offsets[1] = 3""")

    def test_offsets_past_end(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, torch.tensor([0, 6])), """baracuda::embedding_bag: offsets[1] = 6 is past the end of indices (5 indices)""")

    def test_wrong_dims(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx.view(1, 1, 5), self.w), """baracuda::embedding_bag: indices must be 1-D (with offsets) or 2-D (fixed-size bags), got shape [1, 1, 5]""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w.view(-1), self.off), """baracuda::embedding_bag: weight must be 2-D [num_embeddings, embedding_dim], got shape [40]""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx.view(5, 1), self.w, self.off), """baracuda::embedding_bag: offsets must be None when indices is 2-D (fixed-size bags), got offsets of shape [2]""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w), """baracuda::embedding_bag: offsets are required when indices is 1-D""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off.view(2, 1)), """baracuda::embedding_bag: offsets must be 1-D, got shape [2, 1]""")

    def test_per_sample_weights(self):
        psw = torch.randn(5)
        self.assertExpectedRaisesInline(
            NotImplementedError,
            lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="mean", per_sample_weights=psw),
            """baracuda::embedding_bag: per_sample_weights is only supported with mode 0 (sum), got mode 1 (mean)""")
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="sum", per_sample_weights=psw[:4]),
            """baracuda::embedding_bag: per_sample_weights shape [4] != indices shape [5]""")
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="sum", per_sample_weights=psw.double()),
            """baracuda::embedding_bag: per_sample_weights dtype Double != weight dtype Float""")

    def test_bad_arguments(self):
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, padding_idx=10), """baracuda::embedding_bag: padding_idx must be within the number of embeddings, -10 through 9, but got 10""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="min"), """baracuda::embedding_bag: mode has to be one of sum, mean or max, got 'min'""")
        self.assertExpectedRaisesInline(
            TypeError, lambda: baracuda_ops.embedding_bag(self.idx.float(), self.w, self.off), """baracuda::embedding_bag: indices must be int32 or int64, got Float""")
        self.assertExpectedRaisesInline(
            TypeError, lambda: baracuda_ops.embedding_bag(self.idx, self.w.int(), self.off), """baracuda::embedding_bag: weight must be float16, bfloat16, float32 or float64, got Int""")
        self.assertExpectedRaisesInline(
            ValueError, lambda: torch.ops.baracuda.embedding_bag(self.w, self.idx, self.off, 3), """baracuda::embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max), got 3""")

    def test_options_max_mode_refuses(self):
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="max", sparse=True), """baracuda::embedding_bag: max mode does not support sparse weights""")
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: baracuda_ops.embedding_bag(self.idx, self.w, self.off, mode="max", scale_grad_by_freq=True), """baracuda::embedding_bag: max mode does not support scaling the gradient by the frequency""")

    def test_backward_errors(self):
        _, o2b, bag_size, mp = torch.ops.baracuda.embedding_bag(self.w, self.idx, self.off, 2, None, False, -1)
        g = torch.randn(2, 4)
        self.assertExpectedRaisesInline(
            IndexError,
            lambda: torch.ops.baracuda.embedding_bag_backward(g, self.idx, o2b, bag_size, mp, 5, 2, None, -1),
            """baracuda::embedding_bag_backward: indices[4] = 5 is out of range for 5 embeddings (expected 0 <= index < 5)""")
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.embedding_bag_backward(g, self.idx, o2b + 1, bag_size, mp, 10, 2, None, -1),
            """baracuda::embedding_bag_backward: offset2bag[2] = 2 is not a bag (expected -1 <= bag < 2)""")
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.embedding_bag_backward(g[:, :3], self.idx, o2b, bag_size, mp, 10, 2, None, -1),
            """baracuda::embedding_bag_backward: max_positions shape [2, 4] != expected [2, 3]""")
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.embedding_bag_per_sample_weights_backward(g, self.w, self.idx, o2b, 1, -1),
            """baracuda::embedding_bag_per_sample_weights_backward: per_sample_weights only have a gradient in mode 0 (sum), got mode 1 (mean)""")

    def test_forward_only_refuses_a_gradient(self):
        idx, off = make_bags("cpu")
        w = torch.randn(25, 8, requires_grad=True)
        with self.assertRaisesRegex(NotImplementedError, r"^baracuda::embedding_bag_forward_only: no gradient flows "
                                    r"through it, but weight or per_sample_weights requires grad \(baracuda::"
                                    r"embedding_bag gives one\)"):
            torch.ops.baracuda.embedding_bag_forward_only(w, idx, off, 0, None, False, -1)
        with torch.no_grad():
            torch.ops.baracuda.embedding_bag_forward_only(w, idx, off, 0, None, False, -1)

    def test_double_backward_raises(self):
        w = self.w.clone().requires_grad_()
        out = baracuda_ops.embedding_bag(self.idx, w, self.off, mode="sum")
        (dw,) = torch.autograd.grad(out.square().sum(), w, create_graph=True)
        self.assertExpectedRaisesInline(NotImplementedError, lambda: dw.sum().backward(), """baracuda::embedding_bag_backward: double backward of embedding_bag is not supported""")
