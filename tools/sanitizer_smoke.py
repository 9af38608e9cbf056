"""Compact run of every CUDA kernel for compute-sanitizer: each family's self-checks
(all dtypes, odd, vector-width and empty sizes, split paths) on the GPU.

    compute-sanitizer --tool memcheck python3 tools/sanitizer_smoke.py [family,family,...]
"""

import sys

import torch

import baracuda_ops
from baracuda_ops import bench


def main() -> int:
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else None  # comma-separated family names
    device = torch.device("cuda")
    failures = 0
    for fam in bench.families():
        if only and not any(name in fam.__name__ for name in only):
            continue
        for check in fam.self_checks():
            try:
                check.run(device)
            except Exception as e:
                failures += 1
                print(f"FAIL {check.op} {check.dtype}: {type(e).__name__}: {e}")
        for extra in getattr(fam, "sanitizer_cases", lambda: [])():
            extra(device)
    torch.cuda.synchronize()
    print(f"sanitizer smoke: {failures} failures, build {baracuda_ops.build_info()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
