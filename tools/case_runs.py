"""Benchmark cases picked by name, ours and every peer warmed up: what
profile_cases.py (Nsight Compute) and timeline_cases.py (torch.profiler) run."""

from collections.abc import Callable, Iterator, Sequence

import torch

import baracuda_ops  # noqa: F401  (registers the ops)
from baracuda_ops import bench


def warmed_runs(wanted: Sequence[str], device: torch.device) -> Iterator[tuple[str, str, Callable, tuple]]:
    """(case name, implementation, fn, inputs) for every `--full` benchmark case whose name
    contains one of `wanted`: ours, each peer and torch.compile, each called three times
    first (compilation, autotuning, allocator). A peer that cannot run a case is reported
    and left out."""
    cases = [c for fam in bench.families() for c in fam.benchmarks(device, True)]
    for case in (c for c in cases if any(w in c.name for w in wanted)):
        bench.seed_inputs(case)  # the benchmark's inputs (its first copy)
        inputs = case.make_inputs()
        impls = {"baracuda": case.ours, **case.peers}
        if case.compile_peer is not None:
            torch._dynamo.reset()
            impls["torch.compile"] = torch.compile(case.compile_peer)
        for name, fn in impls.items():
            try:
                for _ in range(3):
                    fn(*inputs)
            except Exception as e:
                print(f"skip [{name}] {case.name}: {type(e).__name__}")
                continue
            yield case.name, name, fn, inputs
