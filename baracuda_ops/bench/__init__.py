"""Benchmark and self-check machinery behind ``python -m baracuda_ops``.

Each module ``baracuda_ops/bench/<family>.py`` belongs to one op family (found by
``families()``, no list to edit) and defines

* ``self_checks() -> list[SelfCheck]``: each runs the op against its reference
  on a device (raises AssertionError on a mismatch);
* ``benchmarks(device, full) -> list[BenchCase]``: timed problems with their
  bytes-moved floor and the peers a user would pick instead;
* ``cpu_thread_cases() -> dict[name, make]``: ``make()`` builds inputs and returns a
  function that runs the family's ops on them and returns every output, whose
  bits must not depend on the thread count or the vector ISA (test/test_cpu_threads.py);
* optionally ``sanitizer_cases() -> list[fn(device)]``: extra inputs for
  compute-sanitizer (tools/sanitizer_smoke.py).

The library (``baracuda_ops/ops``) does not import this package.

Timing: CUDA events (``time.perf_counter`` on CPU), warm-up, median of many
runs, and inputs rotated among several copies so the working set exceeds the
L2 cache; on CPU the implementations take turns over a few rounds, each keeping
its fastest. The device's copy bandwidth is measured in the same run; every result
is reported as a fraction of it.
"""
from __future__ import annotations

import importlib
import json
import math
import pkgutil
import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

L2_BYTES = 50 * 2**20
CPU_ROUNDS = 3  # rounds in which the implementations of a CPU case take turns


@dataclass
class SelfCheck:
    op: str
    dtype: torch.dtype
    run: Callable[[torch.device], None]


@dataclass
class BenchCase:
    family: str
    name: str
    nbytes: int  # the floor: each input read once, each output written once
    make_inputs: Callable[[], tuple]  # fresh inputs; called several times to rotate beyond L2
    ours: Callable[..., Any]
    peers: dict[str, Callable[..., Any]] = field(default_factory=dict)  # name -> fn(*inputs)
    compile_peer: Callable[..., Any] | None = None  # eager formulation to wrap in torch.compile


@dataclass
class BenchResult:
    family: str
    name: str
    impl: str
    ms: float
    gbps: float
    fraction_of_copy: float
    graph: bool  # timed by CUDA-graph replay (GPU time); False: events around each call (host overhead included)


def families() -> list[Any]:
    """The family modules of this package, by name."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _events_ms(fn: Callable, input_sets: Sequence[tuple], runs: int) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(*input_sets[i % len(input_sets)])
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def _graph_ms(fn: Callable, input_sets: Sequence[tuple], calls: int, replays: int) -> list[float]:
    """Per-call GPU time from replays of a CUDA graph of `calls` back-to-back calls,
    so host-side overhead (Python, dispatch) does not leave the GPU idle between them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(*input_sets[i % len(input_sets)])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*input_sets[i % len(input_sets)])
    graph.replay()
    torch.cuda.synchronize()
    return [t / calls for t in _events_ms(lambda: graph.replay(), [()], replays)]


def _reset_rng_after_failed_capture(device: torch.device) -> None:
    """A capture that fails part-way can leave the CUDA generator's in-graph offset
    set ("Offset increment outside graph capture"); a small capture that draws a
    random number starts and ends cleanly and resets it."""
    graph = torch.cuda.CUDAGraph()
    scratch = torch.empty(1, device=device)
    with torch.cuda.graph(graph):
        scratch.uniform_()
    torch.cuda.synchronize()


def time_ms(fn: Callable, input_sets: Sequence[tuple], device: torch.device, budget_s: float = 0.3,
            graph: bool = True) -> tuple[float, bool]:
    """(median milliseconds per call of fn(*inputs) rotating through input_sets, whether a CUDA graph was used).

    On CUDA the calls are captured in a graph and timed by replay with CUDA events;
    implementations that cannot be captured (e.g. an autograd backward on another
    stream) fall back to CUDA events around each call."""
    for i in range(3):
        fn(*input_sets[i % len(input_sets)])
    _sync(device)
    t0 = time.perf_counter()
    fn(*input_sets[0])
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-6)
    runs = int(min(max(20, budget_s / one), 2000))
    if device.type == "cuda" and not graph:
        return statistics.median(_events_ms(fn, input_sets, runs)), False
    if device.type == "cuda":
        calls = max(len(input_sets), min(64, runs // 4) // len(input_sets) * len(input_sets))
        try:
            return statistics.median(_graph_ms(fn, input_sets, calls, replays=max(5, runs // calls))), True
        except Exception:
            torch.cuda.synchronize()
            _reset_rng_after_failed_capture(device)
            return statistics.median(_events_ms(fn, input_sets, runs)), False
    times = []
    for i in range(runs):
        args = input_sets[i % len(input_sets)]
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), False


def copy_bandwidth_gbps(device: torch.device) -> float:
    """Measured device copy bandwidth, counting bytes read plus bytes written."""
    n = (512 if device.type == "cuda" else 64) * 2**20
    src = [torch.empty(n, dtype=torch.uint8, device=device).random_() for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    sets = [(d, s) for d, s in zip(dst, src)]
    # Events, not a graph: a device-to-device memcpy captured in a graph may run on the
    # copy engines, slower (2.4 TB/s here) than the SM copy it is meant to measure.
    ms, _ = time_ms(lambda d, s: d.copy_(s), sets, device, graph=False)
    return 2 * n / (ms * 1e-3) / 1e9


def seed_inputs(case: BenchCase) -> None:
    """Seeds the generators from the case's name: a case gets the same inputs in every run,
    whichever cases ran before it (a data-dependent slow path shows up in every run or none)."""
    torch.manual_seed(zlib.crc32(case.name.encode()))


def _input_sets(case: BenchCase, device: torch.device) -> list[tuple]:
    """Enough independent copies of the inputs that cycling through them exceeds L2."""
    copies = 1 if device.type == "cpu" else max(1, min(8, math.ceil(2 * L2_BYTES / max(case.nbytes, 1))))
    seed_inputs(case)
    return [case.make_inputs() for _ in range(copies)]


def run_benchmarks(device: torch.device, full: bool = False, peers: bool = True, only: str | None = None,
                   cases: str | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> tuple[float, list[BenchResult]]:
    """Times every case of the families in `only` (comma-separated; all when None) whose
    name contains one of the '|'-separated substrings in `cases` (all when None)."""
    copy_gbps = copy_bandwidth_gbps(device)
    cases_to_run: list[BenchCase] = []
    for fam in families():
        cases_to_run += [c for c in fam.benchmarks(device, full)
                         if (only is None or c.family in only.split(","))
                         and (cases is None or any(part in c.name for part in cases.split("|")))]
    results: list[BenchResult] = []
    for i, case in enumerate(cases_to_run):
        if progress:
            progress(i, len(cases_to_run), case.name)
        sets = _input_sets(case, device)
        impls = {"baracuda": case.ours}
        if peers:
            impls.update(case.peers)
            if case.compile_peer is not None:
                torch._dynamo.reset()
                impls["torch.compile"] = torch.compile(case.compile_peer)
        # On CPU the implementations take turns over CPU_ROUNDS rounds and each keeps its fastest
        # round: the first to run a new size pays the allocator's and the page faults' warm-up,
        # which a single pass in a fixed order would always charge to the same implementation.
        rounds = CPU_ROUNDS if device.type == "cpu" else 1
        best: dict[str, tuple[float, bool]] = {}
        failed: set[str] = set()
        for _ in range(rounds):
            for impl, fn in impls.items():
                if impl in failed:
                    continue
                try:
                    ms, graph = time_ms(fn, sets, device, budget_s=0.3 / rounds)
                except Exception as e:  # a peer that cannot run this case is reported, not fatal
                    print(f"  [{impl}] {case.name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    failed.add(impl)
                    continue
                if impl not in best or ms < best[impl][0]:
                    best[impl] = (ms, graph)
        for impl, (ms, graph) in best.items():
            gbps = case.nbytes / (ms * 1e-3) / 1e9
            results.append(BenchResult(case.family, case.name, impl, ms, gbps, gbps / copy_gbps, graph))
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if progress:
        progress(len(cases_to_run), len(cases_to_run), "done")
    return copy_gbps, results


def format_table(copy_gbps: float, results: list[BenchResult], cuda: bool = True) -> str:
    """Markdown table: one row per case, our time and fraction, and our speed-up over each peer."""
    by_case: dict[tuple[str, str], dict[str, BenchResult]] = {}
    for r in results:
        by_case.setdefault((r.family, r.name), {})[r.impl] = r
    peer_names = sorted({r.impl for r in results if r.impl != "baracuda"})
    head = ["case", "baracuda ms", "GB/s", "of copy"] + [f"{p} ms" for p in peer_names] + [f"× {p}" for p in peer_names]
    lines = [f"copy bandwidth: {copy_gbps:.0f} GB/s (read + write); * = timed without a CUDA graph (host overhead included)",
             "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for (family, name), impls in by_case.items():
        ours = impls.get("baracuda")
        if ours is None:
            continue
        mark = lambda r: "*" if cuda and not r.graph else ""
        row = [name, f"{ours.ms:.4f}{mark(ours)}", f"{ours.gbps:.0f}", f"{ours.fraction_of_copy:.2f}"]
        row += [f"{impls[p].ms:.4f}{mark(impls[p])}" if p in impls else "—" for p in peer_names]
        row += [f"{impls[p].ms / ours.ms:.2f}" if p in impls else "—" for p in peer_names]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_json(path: str, device: torch.device, copy_gbps: float, results: list[BenchResult]) -> None:
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "copy_gbps": copy_gbps,
        "results": [r.__dict__ for r in results],
    }
    with open(path, "w") as f:
        json.dump(info, f, indent=1)


def write_plot(path: str, copy_gbps: float, results: list[BenchResult]) -> None:
    """Bar chart of achieved fraction of copy bandwidth per case and implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in results))
    impls = list(dict.fromkeys(r.impl for r in results))
    frac = {(r.name, r.impl): r.fraction_of_copy for r in results}
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names) * max(len(impls), 1)), 5))
    for j, impl in enumerate(impls):
        xs = [i + j * width for i in range(len(names))]
        ax.bar(xs, [frac.get((n, impl), 0.0) for n in names], width, label=impl)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel(f"fraction of copy bandwidth ({copy_gbps:.0f} GB/s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
