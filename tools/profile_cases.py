"""Run selected benchmark cases once each inside a cudaProfilerStart/Stop window, for
Nsight Compute: per-kernel duration, DRAM throughput, occupancy and launch shape of
ours and of every peer (eager, torch.compile, Liger) on the same inputs.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        python3 tools/profile_cases.py "rms_norm_backward [8, 4096] bfloat16" "embedding_bag V=1e+05"

Each argument is a substring of a case name (as printed by the benchmark, `--full` set).
"""

import sys

import torch

from case_runs import warmed_runs


def main() -> int:
    runs = list(warmed_runs(sys.argv[1:], torch.device("cuda")))
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
