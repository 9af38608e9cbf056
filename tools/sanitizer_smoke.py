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
    families = [fam for fam in bench.families() if not only or any(name in fam.__name__ for name in only)]
    if not families:  # a filter that selects nothing would report a clean run of no checks
        print(f"sanitizer smoke: no family matches {sys.argv[1]!r}")
        return 2
    device = torch.device("cuda")
    failures = 0
    for fam in families:
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
