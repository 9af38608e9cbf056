"""Kernel timeline of selected benchmark cases, ours and peers, with overlap visible
(there is no Nsight Systems on the device machines; Nsight Compute serialises kernels).

    python3 tools/timeline_cases.py "embedding_bag_backward V=1e+06 D=128 bag=20 uniform float32 max"

Each argument is a substring of a case name (as printed by the benchmark, `--full` set).
Each implementation is warmed up, then run three times under torch.profiler; for the
last call every kernel is printed with its stream, start (µs from the call's first
kernel), duration and the host time its launch call began (same time base; a kernel that
starts long after its launch waited on the GPU, one launched late waited on the host), then
the call's span from first start to last end.
"""

import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from case_runs import warmed_runs


def kernels_of_last_call(fn, inputs, calls=3):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for c in range(calls):
            with torch.profiler.record_function(f"call{c}"):
                fn(*inputs)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    last = next(e for e in events if e.get("name") == f"call{calls - 1}" and e.get("ph") == "X")
    # Kernels launched inside the last call's CPU range (their correlation ids).
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]
                and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
               and e.get("args", {}).get("correlation") in launches]
    return sorted(kernels, key=lambda e: e["ts"]), launches


def main() -> int:
    for case_name, name, fn, inputs in warmed_runs(sys.argv[1:], torch.device("cuda")):
        torch.cuda.synchronize()
        kernels, launches = kernels_of_last_call(fn, inputs)
        print(f"== [{name}] {case_name}")
        if not kernels:
            continue
        t0 = kernels[0]["ts"]
        for k in kernels:
            stream = k.get("args", {}).get("stream", "?")
            launched = launches[k["args"]["correlation"]] - t0
            print(f"  s{stream:<3} {k['ts'] - t0:9.1f} {k['dur']:9.1f} {launched:9.1f}  {k['name'][:100]}")
        span = max(k["ts"] + k["dur"] for k in kernels) - t0
        print(f"  span {span:.1f} us, kernel time {sum(k['dur'] for k in kernels):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
