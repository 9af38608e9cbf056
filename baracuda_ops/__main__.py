"""The main job: ``python -m baracuda_ops [--device cuda] [--full] [--host] [--plot F.png] [--json F.json]``.

Prints what was built, checks every op against its reference on the device
(pass/fail per op and dtype), then benchmarks each op against PyTorch on that
device and prints a table; with ``--host``, also the eager per-call times, host included, of every
op and module beside PyTorch's (baracuda_ops.host_timing).
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

import baracuda_ops
from baracuda_ops import bench


def _progress(i: int, n: int, name: str) -> None:
    width = 30
    done = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {name[:60]:<60}")
    if i == n:
        sys.stderr.write("\n")
    sys.stderr.flush()


def self_check(device: torch.device) -> bool:
    ok = True
    for fam in bench.families():
        for check in fam.self_checks():
            try:
                check.run(device)
                status = "pass"
            except Exception as e:  # report every failure, keep going
                ok = False
                status = f"FAIL ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
                if not isinstance(e, AssertionError):
                    traceback.print_exc()
            print(f"  {check.op:<32} {str(check.dtype).replace('torch.', ''):<10} {status}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baracuda_ops", description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--full", action="store_true", help="every benchmark shape (the issue lists), not the short set")
    p.add_argument("--only", help="benchmark only these families (comma-separated, e.g. rms_norm,alibi)")
    p.add_argument("--cases", help="benchmark only cases whose name contains one of these ('|'-separated) substrings")
    p.add_argument("--no-peers", action="store_true", help="time baracuda alone")
    p.add_argument("--no-bench", action="store_true", help="self-check only")
    p.add_argument("--json", help="write raw benchmark numbers to this file")
    p.add_argument("--plot", help="write a PNG chart of achieved bandwidth to this file")
    p.add_argument("--host", action="store_true", help="also time eager calls per call, host included")
    p.add_argument("--host-json", help="write the per-call times to this file")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    info = baracuda_ops.build_info()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"baracuda_ops {info['version']} | torch {info['torch']} | device {device} ({name})")
    cpu_threads = torch.get_num_threads() if info["cpu_openmp"] else 1
    print(
        f"built: CPU kernels ({cpu_threads} thread{'s' if cpu_threads > 1 else ''}, "
        f"vector ISA {info['cpu_vector_isa']}), "
        f"CUDA kernels: {'yes, archs ' + str(info['cuda_archs']) if info['cuda'] else 'no'}"
    )
    if device.type == "cuda" and not info["cuda"]:
        print("error: this build has no CUDA kernels")
        return 2

    print("\nself-check against references:")
    ok = self_check(device)
    print("self-check:", "all passed" if ok else "FAILURES")

    if not args.no_bench:
        print("\nbenchmark:")
        copy_gbps, results = bench.run_benchmarks(device, full=args.full, peers=not args.no_peers, only=args.only, cases=args.cases,
                                                  progress=_progress)
        print(bench.format_table(copy_gbps, results, cuda=device.type == "cuda"))
        if args.json:
            bench.write_json(args.json, device, copy_gbps, results)
        if args.plot:
            bench.write_plot(args.plot, copy_gbps, results)
    if args.host:
        from baracuda_ops import host_timing

        print("\neager per call, host included (no CUDA graph):")
        host_timing.main(["--device", str(device)] + (["--json", args.host_json] if args.host_json else []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
