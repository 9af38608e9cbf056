"""Kernel timeline of selected benchmark cases, ours and peers, with overlap visible
(there is no Nsight Systems on the device machines; Nsight Compute serialises kernels).

    python3 tools/timeline_cases.py "embedding_bag_backward V=1e+06 D=128 bag=20 uniform float32 max"

Each argument is a substring of a case name (as printed by the benchmark, `--full` set).
Each implementation is warmed up, then run three times under torch.profiler; for the
last call every kernel is printed with its stream, start (µs from the call's first
kernel) and duration, then the call's span from first start to last end.
"""

import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import baracuda_ops  # noqa: F401  (registers the ops)
from baracuda_ops import bench


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
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]
                and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
               and e.get("args", {}).get("correlation") in launches]
    return sorted(kernels, key=lambda e: e["ts"])


def main() -> int:
    wanted = sys.argv[1:]
    device = torch.device("cuda")
    cases = [c for fam in bench.families() if hasattr(fam, "benchmarks") for c in fam.benchmarks(device, True)]
    for case in (c for c in cases if any(w in c.name for w in wanted)):
        inputs = case.make_inputs()
        impls = {"baracuda": case.ours, **case.peers}
        if case.compile_peer is not None:
            torch._dynamo.reset()
            impls["torch.compile"] = torch.compile(case.compile_peer)
        for name, fn in impls.items():
            try:
                for _ in range(3):  # warm-up: compilation, autotuning, allocator
                    fn(*inputs)
                torch.cuda.synchronize()
                kernels = kernels_of_last_call(fn, inputs)
            except Exception as e:  # a peer that cannot run this case
                print(f"skip [{name}] {case.name}: {type(e).__name__}")
                continue
            print(f"== [{name}] {case.name}")
            if not kernels:
                continue
            t0 = kernels[0]["ts"]
            for k in kernels:
                stream = k.get("args", {}).get("stream", "?")
                print(f"  s{stream:<3} {k['ts'] - t0:9.1f} {k['dur']:9.1f}  {k['name'][:110]}")
            span = max(k["ts"] + k["dur"] for k in kernels) - t0
            print(f"  span {span:.1f} us, kernel time {sum(k['dur'] for k in kernels):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
