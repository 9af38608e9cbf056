"""A/B timing of our implementation under several environment settings, in one process,
with the peers timed once beside them: how a kernel variant behind a temporary
environment switch (read by the host code at each call) is compared on one machine.

    python3 tools/ab_cases.py rms_norm "rms_norm_backward [1, 8192]|rms_norm [1, 4096]" \
        '{"base": {}, "cap256": {"AB_FEW_CAP": "256"}}' [--rounds 3] [--no-peers] [--json OUT.json]

Arguments: families (comma-separated), '|'-separated substrings of the `--full` case names,
and a JSON object naming each setting's environment variables (each setting starts from
the environment this script was started with). Every case is timed with `bench.time_ms`
(CUDA-graph replay on CUDA) over the benchmark's input sets; each setting `--rounds` times,
interleaved, keeping the fastest; peers (eager, Liger, torch.compile) twice, the fastest.
Prints microseconds per call and, for each setting, the fraction of copy bandwidth.
A compile-time variant needs a rebuild instead: run this once per build, on one machine.
"""

import argparse
import json
import os
import sys

import torch

import baracuda_ops  # noqa: F401  (registers the ops)
from baracuda_ops import bench


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("families")
    ap.add_argument("cases")
    ap.add_argument("settings")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    settings: dict[str, dict[str, str]] = json.loads(args.settings)
    started_with = dict(os.environ)
    switched = {k for env in settings.values() for k in env}

    def use(env: dict[str, str]) -> None:
        for k in switched:
            if k in started_with:
                os.environ[k] = started_with[k]
            else:
                os.environ.pop(k, None)
        os.environ.update(env)

    copy = bench.copy_bandwidth_gbps(device)
    print(f"copy bandwidth {copy:.0f} GB/s")
    wanted = args.cases.split("|")
    cases = [c for fam in bench.families() for c in fam.benchmarks(device, True)
             if c.family in args.families.split(",") and any(w in c.name for w in wanted)]
    rows = []
    for case in cases:
        sets = bench._input_sets(case, device)
        ms: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, env in settings.items():
                use(env)
                ms[name] = min(ms.get(name, float("inf")), bench.time_ms(case.ours, sets, device)[0])
        use({})
        if not args.no_peers:
            peers = dict(case.peers)
            if case.compile_peer is not None:
                torch._dynamo.reset()
                peers["torch.compile"] = torch.compile(case.compile_peer)
            for name, fn in peers.items():
                try:
                    ms["peer:" + name] = min(bench.time_ms(fn, sets, device)[0] for _ in range(2))
                except Exception as e:  # a peer that cannot run this case is reported, not fatal
                    print(f"  [{name}] {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        fractions = {k: case.nbytes / (v * 1e-3) / 1e9 / copy for k, v in ms.items() if k in settings}
        print(f"{case.name}\n  " + "  ".join(f"{k}={v * 1e3:.2f}us" for k, v in ms.items())
              + "\n  of copy: " + "  ".join(f"{k}={v:.3f}" for k, v in fractions.items()), flush=True)
        rows.append({"case": case.name, "nbytes": case.nbytes, "ms": ms})
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "copy_gbps": copy, "settings": settings, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
