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
from baracuda_ops import bench

# Every family's cases (baracuda_ops/bench/<family>.py, cpu_thread_cases): name -> make, where
# make() builds the inputs and returns a function that runs the ops and returns every output.
CASES = {name: make for fam in bench.families() for name, make in fam.cpu_thread_cases().items()}


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
