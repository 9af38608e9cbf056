"""Per-sample gradients (``torch.func.vmap`` of ``torch.func.grad``) through the ops with a
batching rule, against the same gradients from a loop over the samples (what PyTorch's
per-sample fallback runs for an op without a rule), timed in one process (CUDA events around
each call, host time included: both run many small launches).

    python3 tools/vmap_timing.py [--device cuda] [--samples 64]
"""

import argparse

import torch

import baracuda_ops
from baracuda_ops import bench


def cases(device: torch.device, n: int):
    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, dtype=dtype)

    w = rand(4096)
    yield ("rms_norm [16, 4096] float32, grad w.r.t. input and weight",
           lambda x, w: baracuda_ops.rms_norm(x, 4096, w).square().sum(), (rand(n, 16, 4096), w), (0, 1))
    slopes = baracuda_ops.alibi_slopes(8, device=device)
    yield ("alibi [1, 8, 128, 128] float32, grad w.r.t. scores and slopes",
           lambda x, s: baracuda_ops.alibi(x, s).square().sum(), (rand(n, 1, 8, 128, 128), slopes), (0, 1))
    yield ("repeat [64, 256] x (4, 2) float32", lambda x: baracuda_ops.repeat(x, (4, 2)).square().sum(),
           (rand(n, 64, 256),), (0,))
    bags = torch.randint(0, 1000, (32, 8), device=device)
    yield ("embedding_bag [1000, 64] (a table per sample), 32 bags of 8, sum, grad w.r.t. weight",
           lambda w, i: baracuda_ops.embedding_bag(i, w, mode="sum").square().sum(), (rand(n, 1000, 64), bags), (0,))
    samples = torch.rand(2, 16, 2, device=device)
    yield ("fractional_max_pool2d [2, 16, 32, 32] k=2 -> 16 float32",
           lambda x: baracuda_ops.fractional_max_pool2d(x, 2, output_size=16, _random_samples=samples).square().sum(),
           (rand(n, 2, 16, 32, 32),), (0,))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--samples", type=int, default=64)
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"{args.samples} samples, {device}")
    for name, loss, inputs, argnums in cases(device, args.samples):
        grad = torch.func.grad(loss, argnums=argnums)
        in_dims = (0,) + (None,) * (len(inputs) - 1)
        batched = torch.func.vmap(grad, in_dims=in_dims)

        def looped(*a):
            return [grad(a[0][k], *a[1:]) for k in range(a[0].shape[0])]

        got, want = batched(*inputs), looped(*inputs)
        for i, g in enumerate(got):
            torch.testing.assert_close(g, torch.stack([w[i] for w in want]))
        t_vmap, _ = bench.time_ms(batched, [inputs], device, graph=False)
        t_loop, _ = bench.time_ms(looped, [inputs], device, graph=False)
        print(f"{name}: vmap {t_vmap:.3f} ms, per-sample loop {t_loop:.3f} ms, {t_loop / t_vmap:.1f}x")


if __name__ == "__main__":
    main()
