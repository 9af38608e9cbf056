"""Run selected benchmark cases once each inside a cudaProfilerStart/Stop window, for
Nsight Compute: per-kernel duration, DRAM throughput, occupancy and launch shape of
ours and of every peer (eager, torch.compile, Liger) on the same inputs.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        python3 tools/profile_cases.py "rms_norm_backward [8, 4096] bfloat16" "embedding_bag V=1e+05"

Each argument is a substring of a case name (as printed by the benchmark, `--full` set).
"""

import sys

import torch

import baracuda_ops  # noqa: F401  (registers the ops)
from baracuda_ops import bench


def main() -> int:
    wanted = sys.argv[1:]
    device = torch.device("cuda")
    cases = [c for fam in bench.families() if hasattr(fam, "benchmarks") for c in fam.benchmarks(device, True)]
    picked = [c for c in cases if any(w in c.name for w in wanted)]
    runs = []
    for case in picked:
        inputs = case.make_inputs()
        impls = {"baracuda": case.ours, **case.peers}
        if case.compile_peer is not None:
            torch._dynamo.reset()
            impls["torch.compile"] = torch.compile(case.compile_peer)
        for name, fn in impls.items():
            try:
                for _ in range(3):  # warm-up: compilation, autotuning, allocator
                    fn(*inputs)
            except Exception as e:
                print(f"skip [{name}] {case.name}: {type(e).__name__}")
                continue
            runs.append((case.name, name, fn, inputs))
    torch.cuda.synchronize()
    for case_name, name, fn, inputs in runs:
        torch.cuda.nvtx.range_push(f"{name} | {case_name}")
        torch.cuda.cudart().cudaProfilerStart()
        fn(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        torch.cuda.nvtx.range_pop()
        print(f"profiled [{name}] {case_name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
