"""The package around the ops: build facts, the Plan vocabulary, the main job and its tables."""

import importlib
import json
import os
import pkgutil

import pytest
import torch

import baracuda_ops
import baracuda_ops.ops
from baracuda_ops import _plan, bench
from baracuda_ops.__main__ import main


def test_version_build_info_and_typing_marker():
    info = baracuda_ops.build_info()
    assert info["version"] == baracuda_ops.__version__
    assert info["cpu"] is True and info["torch"] == torch.__version__
    assert isinstance(info["cuda"], bool)
    assert info["cuda_archs"] is None or isinstance(info["cuda_archs"], str)
    assert os.path.exists(os.path.join(os.path.dirname(baracuda_ops.__file__), "py.typed"))


def _library_families() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(baracuda_ops.ops.__path__))


def test_every_family_is_exported():
    # Each module of baracuda_ops/ops is a family; its __all__ is the package's.
    assert _library_families()
    for family in _library_families():
        module = importlib.import_module(f"baracuda_ops.ops.{family}")
        assert module.__all__, family
        for name in module.__all__:
            assert name in baracuda_ops.__all__ and getattr(baracuda_ops, name) is getattr(module, name), name
    for name in baracuda_ops.nn.__all__:
        assert issubclass(getattr(baracuda_ops.nn, name), torch.nn.Module), name


def test_every_family_has_its_bench_module():
    # baracuda_ops/bench/<family>.py beside each baracuda_ops/ops/<family>.py, found without a list.
    found = {fam.__name__.rsplit(".", 1)[1]: fam for fam in bench.families()}
    assert sorted(found) == _library_families()
    for family, fam in found.items():
        assert fam.self_checks(), family
        assert {c.family for c in fam.benchmarks(torch.device("cpu"), False)} == {family}
        assert fam.cpu_thread_cases(), family


def test_drop_ins_take_torchs_argument_names_and_defaults():
    # Keyword calls written for torch.nn.functional / torch.nn work unchanged.
    import inspect

    # The drop-ins are found by name: a public function named as one of torch.nn.functional's
    # (its *_with_indices form where F's own is a boolean dispatch), a module subclassing torch.nn's.
    F = torch.nn.functional
    pairs = [(getattr(baracuda_ops, name), getattr(F, f"{name}_with_indices", None) or getattr(F, name))
             for name in baracuda_ops.__all__ if callable(getattr(F, name, None))]
    for name in baracuda_ops.nn.__all__:
        ours, theirs = getattr(baracuda_ops.nn, name), getattr(torch.nn, name, None)
        if isinstance(theirs, type) and issubclass(ours, theirs):
            pairs += [(ours.__init__, theirs.__init__), (ours.forward, theirs.forward)]
    assert pairs, "no drop-in found"
    for ours, theirs in pairs:
        # our keyword-only extensions (rms_norm's residual, weight_offset, casting) come after torch's arguments
        a = {k: p for k, p in inspect.signature(ours).parameters.items() if p.kind != p.KEYWORD_ONLY}
        b = inspect.signature(theirs).parameters
        assert list(a) == list(b), (ours, list(a), list(b))
        assert [p.default for p in a.values()] == [p.default for p in b.values()], ours


def test_error_kinds():
    assert issubclass(baracuda_ops.InvalidProblemError, (baracuda_ops.BaracudaError, ValueError))
    assert issubclass(baracuda_ops.UnsupportedError, (baracuda_ops.BaracudaError, NotImplementedError))
    assert issubclass(baracuda_ops.BufferTooSmallError, baracuda_ops.BaracudaError)
    assert issubclass(baracuda_ops.WorkspaceTooSmallError, baracuda_ops.BaracudaError)
    with pytest.raises(baracuda_ops.InvalidProblemError, match="boom"):
        with _plan.plan_errors():
            raise IndexError("boom")
    with pytest.raises(baracuda_ops.UnsupportedError):
        with _plan.plan_errors():
            raise NotImplementedError("no kernel")


def test_kernel_choice_for_an_unknown_op_is_unsupported():
    with pytest.raises(baracuda_ops.UnsupportedError, match="no cpu kernel is registered for nope"):
        _plan.kernel_choice("nope", torch.device("cpu"), [1], torch.float32)


def test_workspace_allocate():
    ws = baracuda_ops.Workspace.allocate(100, "cpu")
    assert ws.nbytes == 100 and ws.buffer.dtype == torch.uint8
    assert baracuda_ops.Workspace.allocate(0, "cpu").nbytes == 0


def test_main_job_self_check_passes_on_cpu(capsys):
    assert main(["--device", "cpu", "--no-bench"]) == 0
    out = capsys.readouterr().out
    assert "self-check: all passed" in out and "FAIL" not in out
    for fam in bench.families():
        for check in fam.self_checks():
            assert check.op in out, check.op


def test_benchmark_table_and_json(tmp_path):
    results = [
        bench.BenchResult("repeat", "case a", "baracuda", 1.0, 10.0, 0.5, True),
        bench.BenchResult("repeat", "case a", "eager", 2.0, 5.0, 0.25, False),
    ]
    table = bench.format_table(20.0, results)
    assert "| case a | 1.0000 | 10 | 0.50 | 2.0000* | 2.00 |" in table
    path = tmp_path / "b.json"
    bench.write_json(str(path), torch.device("cpu"), 20.0, results)
    data = json.loads(path.read_text())
    assert data["copy_gbps"] == 20.0 and len(data["results"]) == 2 and data["device"] == "cpu"


def test_timing_on_cpu_is_positive():
    ms, graph = bench.time_ms(lambda a: a.clone(), [(torch.randn(1000),)], torch.device("cpu"), budget_s=0.01)
    assert ms > 0 and graph is False


def test_benchmark_case_filter_on_cpu():
    # --only picks families, --cases picks case names by substring ('|'-separated).
    _, results = bench.run_benchmarks(torch.device("cpu"), peers=False, only="rms_norm", cases="[8, 4096]|[512, 1024]")
    names = {r.name for r in results}
    assert names == {"rms_norm [8, 4096] bfloat16", "rms_norm_backward [8, 4096] bfloat16", "rms_norm [512, 1024] float32",
                     "rms_norm_backward [512, 1024] float32"}
    assert all(r.impl == "baracuda" for r in results)


def test_benchmark_inputs_depend_on_the_case_alone():
    # Each case's inputs are seeded from its name: the same in every run, whichever
    # cases ran before (a data-dependent slow path shows up in every run or in none).
    cases = bench.families()
    case = next(c for fam in cases for c in fam.benchmarks(torch.device("cpu"), False)
                if c.name.startswith("fractional_max_pool2d_backward"))
    first = bench._input_sets(case, torch.device("cpu"))
    torch.randn(1000)  # another case's draws in between
    again = bench._input_sets(case, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(first[0], again[0]) if isinstance(a, torch.Tensor))
    other = next(c for fam in cases for c in fam.benchmarks(torch.device("cpu"), False) if c.name != case.name)
    bench.seed_inputs(other)
    x = torch.randn(8)
    bench.seed_inputs(case)
    assert not torch.equal(x, torch.randn(8))
