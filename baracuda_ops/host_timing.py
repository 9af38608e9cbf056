"""Eager per-call time of every op and module, host included, beside PyTorch's equivalent.

``python -m baracuda_ops --host`` (or ``python -m baracuda_ops.host_timing``) times each call as
a user makes it in eager mode: no CUDA graph, wall clock around ``iters`` back-to-back calls
(synchronized before and after on CUDA), so the time per call is the host's dispatch and autograd
work plus whatever the device cannot hide. Each case runs forward alone (under ``no_grad``) and
forward plus backward (``torch.autograd.grad`` of the output with a fixed upstream gradient, so no
``.grad`` accumulates), at a small size and a decode-like size, for ours and for PyTorch's
equivalent on the same inputs. The median of ``repeats`` timed loops is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

import baracuda_ops

__all__ = ["HostCase", "host_cases", "time_per_call", "run", "format_table", "main"]


@dataclass
class HostCase:
    """One call and PyTorch's equivalent. ``make()`` builds fresh inputs and returns
    ``((ours, ours_inputs), (theirs, theirs_inputs))``: zero-argument callables returning the
    output, each with the tensors its output is differentiated with respect to."""

    name: str
    size: str
    make: Callable[[], tuple[tuple[Callable[[], torch.Tensor], Sequence[torch.Tensor]], ...]]


def host_cases(device: torch.device) -> list[HostCase]:
    """Every op and module at a small size and a decode-like size."""
    cuda = device.type == "cuda"
    half = torch.bfloat16 if cuda else torch.float32

    def leaf(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()

    def rms_norm(m, n, dtype):
        def make():
            x, w = leaf(m, n, dtype=dtype), leaf(n, dtype=dtype)
            return (lambda: baracuda_ops.rms_norm(x, (n,), w), (x, w)), (lambda: F.rms_norm(x, (n,), w), (x, w))
        return make

    def rms_norm_module(m, n, dtype):
        def make():
            ours = baracuda_ops.nn.RMSNorm(n, device=device, dtype=dtype)
            theirs = torch.nn.RMSNorm(n, device=device, dtype=dtype)
            x = leaf(m, n, dtype=dtype)
            return (lambda: ours(x), (x, ours.weight)), (lambda: theirs(x), (x, theirs.weight))
        return make

    def llama_module(m, n, dtype):
        def make():
            ours = baracuda_ops.nn.LlamaRMSNorm(n).to(device=device, dtype=dtype)
            theirs = torch.nn.RMSNorm(n, eps=1e-6, device=device, dtype=dtype)
            x = leaf(m, n, dtype=dtype)
            return (lambda: ours(x), (x, ours.weight)), (lambda: theirs(x), (x, theirs.weight))
        return make

    def repeat(shape, reps):
        def make():
            x = leaf(*shape)
            return (lambda: baracuda_ops.repeat(x, reps), (x,)), (lambda: x.repeat(*reps), (x,))
        return make

    def bags(num_embeddings, dim, num_bags, bag, module, sparse=False):
        def make():
            idx = torch.randint(0, num_embeddings, (num_bags * bag,), device=device)
            off = torch.arange(0, num_bags * bag, bag, device=device)
            if module:
                ours = baracuda_ops.nn.EmbeddingBag(num_embeddings, dim, mode="sum", sparse=sparse, device=device)
                theirs = torch.nn.EmbeddingBag(num_embeddings, dim, mode="sum", sparse=sparse, device=device)
                return (lambda: ours(idx, off), (ours.weight,)), (lambda: theirs(idx, off), (theirs.weight,))
            w = leaf(num_embeddings, dim)
            return ((lambda: baracuda_ops.embedding_bag(idx, w, off, mode="sum"), (w,)),
                    (lambda: F.embedding_bag(idx, w, off, mode="sum"), (w,)))
        return make

    def pool(n, c, hw, out):
        def make():
            x = leaf(n, c, hw, hw)
            samples = torch.rand(n, c, 2, device=device)
            return ((lambda: baracuda_ops.fractional_max_pool2d(x, 2, output_size=out, _random_samples=samples), (x,)),
                    (lambda: F.fractional_max_pool2d(x, 2, output_size=out, _random_samples=samples), (x,)))
        return make

    def alibi(b, h, q, k):
        def make():
            scores, slopes = leaf(b, h, q, k), baracuda_ops.alibi_slopes(h, device=device).requires_grad_()
            distance = (torch.arange(k, device=device) - torch.arange(q, device=device).unsqueeze(1)).float()
            return ((lambda: baracuda_ops.alibi(scores, slopes), (scores, slopes)),
                    (lambda: scores + slopes.view(h, 1, 1) * distance, (scores, slopes)))
        return make

    small, decode = "small", "decode"
    return [
        HostCase("rms_norm", f"{small} [4, 64]", rms_norm(4, 64, torch.float32)),
        HostCase("rms_norm", f"{decode} [8, 4096]", rms_norm(8, 4096, half)),
        HostCase("nn.RMSNorm", f"{small} [4, 64]", rms_norm_module(4, 64, torch.float32)),
        HostCase("nn.RMSNorm", f"{decode} [8, 4096]", rms_norm_module(8, 4096, half)),
        HostCase("nn.LlamaRMSNorm", f"{small} [4, 64]", llama_module(4, 64, torch.float32)),
        HostCase("nn.LlamaRMSNorm", f"{decode} [8, 4096]", llama_module(8, 4096, half)),
        HostCase("repeat", f"{small} [4, 64] x (2, 3)", repeat((4, 64), (2, 3))),
        HostCase("repeat", f"{decode} [8, 1, 128] x (1, 4, 1)", repeat((8, 1, 128), (1, 4, 1))),
        HostCase("embedding_bag", f"{small} 100x64, 4 bags of 4", bags(100, 64, 4, 4, False)),
        HostCase("embedding_bag", f"{decode} 1e5x128, 8 bags of 20", bags(100_000, 128, 8, 20, False)),
        HostCase("nn.EmbeddingBag", f"{small} 100x64, 4 bags of 4", bags(100, 64, 4, 4, True)),
        HostCase("nn.EmbeddingBag", f"{decode} 1e5x128, 8 bags of 20", bags(100_000, 128, 8, 20, True)),
        HostCase("nn.EmbeddingBag sparse", f"{small} 100x64, 4 bags of 4", bags(100, 64, 4, 4, True, True)),
        HostCase("nn.EmbeddingBag sparse", f"{decode} 1e5x128, 8 bags of 20",
                 bags(100_000, 128, 8, 20, True, True)),
        HostCase("fractional_max_pool2d", f"{small} [2, 4, 8, 8] -> 4", pool(2, 4, 8, 4)),
        HostCase("fractional_max_pool2d", f"{decode} [8, 32, 32, 32] -> 16", pool(8, 32, 32, 16)),
        HostCase("alibi", f"{small} [1, 4, 8, 8]", alibi(1, 4, 8, 8)),
        HostCase("alibi", f"{decode} [4, 32, 1, 1024]", alibi(4, 32, 1, 1024)),
    ]


def time_per_call(fn: Callable[[], object], device: torch.device, iters: int, repeats: int) -> float:
    """Median over ``repeats`` loops of the wall time per call, in microseconds (after a warm-up
    loop; CUDA synchronized around each loop)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(max(iters // 10, 10)):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples)


def run(device: torch.device, iters: int = 2000, repeats: int = 5) -> list[dict]:
    """Times every case; a row per case and pass (forward, forward+backward)."""
    rows = []
    for case in host_cases(device):
        torch.manual_seed(0)
        sides = case.make()
        grad = torch.randn_like(sides[0][0]())
        timings = {}
        for side, (fn, inputs) in zip(("ours", "torch"), sides):

            def forward(fn=fn):
                with torch.no_grad():
                    return fn()

            def forward_backward(fn=fn, inputs=inputs):
                return torch.autograd.grad(fn(), inputs, grad)

            timings[side] = (time_per_call(forward, device, iters, repeats),
                             time_per_call(forward_backward, device, iters, repeats))
        for k, pass_name in enumerate(("forward", "forward+backward")):
            rows.append({"op": case.name, "size": case.size, "pass": pass_name, "ours_us": timings["ours"][k],
                         "torch_us": timings["torch"][k]})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'op':<24} {'size':<34} {'pass':<17} {'ours us':>9} {'torch us':>9} {'extra us':>9}"]
    for r in rows:
        lines.append(f"{r['op']:<24} {r['size']:<34} {r['pass']:<17} {r['ours_us']:>9.2f} {r['torch_us']:>9.2f} "
                     f"{r['ours_us'] - r['torch_us']:>+9.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baracuda_ops.host_timing", description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=2000, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per measurement (the median is kept)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = run(device, args.iters, args.repeats)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
