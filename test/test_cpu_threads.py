"""The CPU kernels spread their loops over ATen's threads (at::parallel_for, built with
OpenMP) and fix every summation order by the data alone, so each op gives the same bits
on one thread and on several, and with every vector ISA the CPU runs
(BARACUDA_CPU_CAPABILITY caps it, read once per process)."""

import os
import subprocess
import sys
from pathlib import Path

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


def _embedding_bag_widths_case():
    """Row widths that leave every block size and a scalar tail, every dtype, per-sample
    weights and padding: the vectorized sums' edges."""
    cases = []
    for dim in (1, 7, 37, 200, 515):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            weight = torch.randn(300, dim).to(dtype)
            indices = torch.randint(0, 300, (600,))
            offsets = torch.arange(0, 600, 6)
            offsets[5] = offsets[4]  # an empty bag
            cases.append((weight, indices, offsets, torch.randn(600).to(dtype)))

    def run():
        results = []
        for weight, indices, offsets, psw in cases:
            for mode, weights in ((0, psw), (0, None), (1, None), (2, None)):
                out, o2b, bag_size, max_pos = ops.embedding_bag(weight, indices, offsets, mode, weights, False, 5)
                grad = torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype)
                grad_weight = ops.embedding_bag_backward(grad, indices, o2b, bag_size, max_pos, 300, mode, weights, 5)
                results += [out, grad_weight]
        return results

    return run


CASES = {
    "embedding_bag_widths": _embedding_bag_widths_case,
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


_RUN_CASES_IN_SUBPROCESS = """
import sys
import torch
import baracuda_ops
sys.path.insert(0, sys.argv[2])
import test_cpu_threads
results = {}
for name, case in sorted(test_cpu_threads.CASES.items()):
    torch.manual_seed(0)
    results[name] = case()()
torch.save({"isa": baracuda_ops.build_info()["cpu_vector_isa"], "results": results}, sys.argv[1])
"""


def test_same_bits_on_every_vector_isa(tmp_path):
    runs = {}
    for cap in ("default", "avx2", "avx512"):
        path = tmp_path / f"{cap}.pt"
        env = {**os.environ, "BARACUDA_CPU_CAPABILITY": cap}
        subprocess.run(
            [sys.executable, "-c", _RUN_CASES_IN_SUBPROCESS, str(path), str(Path(__file__).parent)], env=env, check=True
        )
        run = torch.load(path)
        runs[run["isa"]] = run["results"]
    # "default" always runs the baseline loops; the others run this CPU's best ISA up to their cap
    assert "default" in runs and baracuda_ops.build_info()["cpu_vector_isa"] in runs
    base = runs["default"]
    for isa, results in runs.items():
        for name in base:
            assert len(results[name]) == len(base[name])
            for a, b in zip(base[name], results[name]):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), (isa, name)


def test_build_reports_vector_isa():
    assert baracuda_ops.build_info()["cpu_vector_isa"] in ("default", "avx2", "avx512")
