"""The CPU kernels spread their loops over ATen's threads (at::parallel_for, built with
OpenMP) and fix every summation order by the data alone, so each op gives the same bits
on one thread and on several."""

import pytest
import torch

import baracuda_ops

ops = torch.ops.baracuda


def _embedding_bag_case(mode):
    weight = torch.randn(5000, 64)
    indices = torch.randint(0, 5000, (20000,))
    indices[::7] = 11  # a hot row: long runs in the backward
    offsets = torch.arange(0, 20000, 10)
    psw = torch.randn(20000) if mode == 0 else None

    def run():
        out, o2b, bag_size, max_pos = ops.embedding_bag(weight, indices, offsets, mode, psw, False, 3)
        grad = torch.linspace(-1, 1, out.numel()).view_as(out)
        results = [out, o2b, bag_size, max_pos]
        results.append(ops.embedding_bag_backward(grad, indices, o2b, bag_size, max_pos, 5000, mode, psw, 3))
        if mode == 0:
            results.append(ops.embedding_bag_per_sample_weights_backward(grad, weight, indices, o2b, mode, 3))
        return results

    return run


def _rms_norm_case():
    x = torch.randn(512, 1024).bfloat16()
    weight = torch.randn(1024)
    dy = torch.randn(512, 1024).bfloat16()

    def run():
        out, rstd = ops.rms_norm(x, [1024], weight, None)
        return [out, rstd, *ops.rms_norm_backward(dy, x, [1024], rstd, weight, [True, True])]

    return run


def _repeat_case():
    x = torch.randn(37, 129, 5)
    grad = torch.randn(4 * 37, 3 * 129, 2 * 5)
    return lambda: [ops.repeat(x, [4, 3, 2]), ops.repeat_backward(grad, [4, 3, 2], [37, 129, 5])]


def _fmp2d_case():
    x = torch.randn(8, 16, 64, 64)
    samples = torch.rand(8, 16, 2)

    def run():
        out, idx = ops.fractional_max_pool2d(x, [2, 2], [32, 32], samples)
        return [out, idx, ops.fractional_max_pool2d_backward(torch.ones_like(out), x, [2, 2], [32, 32], idx)]

    return run


def _fmp3d_case():
    x = torch.randn(4, 8, 16, 16, 16)
    samples = torch.rand(4, 8, 3)

    def run():
        out, idx = ops.fractional_max_pool3d(x, [3, 3, 3], [8, 8, 8], samples)
        return [out, idx, ops.fractional_max_pool3d_backward(torch.ones_like(out), x, [3, 3, 3], [8, 8, 8], idx)]

    return run


def _alibi_case():
    scores = torch.randn(4, 8, 128, 256)
    slopes = baracuda_ops.alibi_slopes(8)
    grad = torch.randn(4, 8, 128, 256)
    return lambda: [ops.alibi(scores, slopes), *ops.alibi_backward(grad, slopes, [True, True])]


CASES = {
    "embedding_bag_sum": lambda: _embedding_bag_case(0),
    "embedding_bag_mean": lambda: _embedding_bag_case(1),
    "embedding_bag_max": lambda: _embedding_bag_case(2),
    "rms_norm": _rms_norm_case,
    "repeat": _repeat_case,
    "fractional_max_pool2d": _fmp2d_case,
    "fractional_max_pool3d": _fmp3d_case,
    "alibi": _alibi_case,
}


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_build_reports_openmp():
    assert isinstance(baracuda_ops.build_info()["cpu_openmp"], bool)


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bits_on_one_and_several_threads(case, restore_threads):
    run = CASES[case]()
    torch.set_num_threads(1)
    one = run()
    torch.set_num_threads(4)
    several = run()
    assert len(one) == len(several)
    for a, b in zip(one, several):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
