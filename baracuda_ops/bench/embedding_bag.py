"""embedding_bag: self-checks against references and benchmark cases."""

from __future__ import annotations


import torch
import torch.nn.functional as F

from . import BenchCase, SelfCheck
from ..ops.embedding_bag import _FLOATS, _MODES, embedding_bag


def zipf_indices(n: int, num_embeddings: int, s: float, device, generator=None) -> torch.Tensor:
    """n draws of Zipf(s) ranks over num_embeddings rows (inverse CDF), mapped to rows by a random permutation.
    Drawn on the CPU (with `generator`, a CPU generator, when given) and moved to `device`."""
    ranks = torch.arange(1, num_embeddings + 1, dtype=torch.float64)
    cdf = torch.cumsum(ranks.pow(-s), 0)
    cdf /= cdf[-1].clone()
    u = torch.rand(n, dtype=torch.float64, generator=generator)
    rank = torch.searchsorted(cdf, u).clamp_(max=num_embeddings - 1)
    return torch.randperm(num_embeddings, generator=generator)[rank].to(device)


def random_bags(num_bags: int, mean_bag: int, device) -> torch.Tensor:
    """int64 offsets of bags whose sizes are uniform in [1, 2 mean - 1] (mean `mean_bag`)."""
    sizes = torch.randint(1, 2 * mean_bag, (num_bags,))
    return torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]]).to(device)


def sanitizer_cases():
    """Bad inputs for compute-sanitizer (tools/sanitizer_smoke.py): out-of-range and negative
    indices and broken offsets, forward and both backwards, every mode. The kernels must flag
    the bags (NaN row, bag_size -1) without reading or writing out of bounds. Then a
    backward whose sort keys take 17 bits (sorted in 9-bit digits on CUDA) and whose
    fill of unused rows starts early (grad_weight large for the number of indices)."""

    def run(device):
        for mode in (0, 1, 2):
            for dtype in (torch.float32, torch.bfloat16):
                w = torch.randn(10, 8, device=device, dtype=dtype)
                idx = torch.tensor([1, 2, 3, 12, 4, 5, -1, 6, 7, 1 << 40], device=device)
                psw = torch.rand(idx.shape, device=device, dtype=dtype) if mode == 0 else None
                for off in ([0, 3, 6, 7], [0, 5, 3, 7], [0, 3, 6, 20], [2, 3, 6, 7]):
                    offsets = torch.tensor(off, device=device)
                    out, o2b, size, maxpos = torch.ops.baracuda.embedding_bag(w, idx, offsets, mode, psw, False, -1)
                    assert torch.isnan(out).any() and (size < 0).any(), "bad bags are not flagged"
                    g = torch.randn_like(out)
                    torch.ops.baracuda.embedding_bag_backward(g, idx, o2b, size, maxpos, 10, mode, psw, -1)
                    if mode == 0:
                        torch.ops.baracuda.embedding_bag_per_sample_weights_backward(g, w, idx, o2b, mode, -1)
        for mode in (0, 1, 2):
            w = torch.randn(70000, 64, device=device)
            idx = torch.randint(0, 70000, (5000,), device=device)
            out, o2b, size, maxpos = torch.ops.baracuda.embedding_bag(
                w, idx, torch.arange(0, 5000, 10, device=device), mode, None, False, -1)
            torch.ops.baracuda.embedding_bag_backward(torch.randn_like(out), idx, o2b, size, maxpos, 70000, mode, None,
                                                      -1)
        torch.cuda.synchronize()

    return [run]


def self_checks():

    def check(dtype, mode):
        def run(device):
            w = torch.randn(50, 24, device=device, dtype=dtype, requires_grad=True)
            idx = torch.randint(0, 50, (40,), device=device)
            off = torch.tensor([0, 3, 3, 17, 30], device=device)
            ours = embedding_bag(idx, w, off, mode=mode, padding_idx=4)
            ref_w = w.detach().double().requires_grad_()
            ref = F.embedding_bag(idx, ref_w, off, mode=mode, padding_idx=4)
            tol = {torch.float16: 2e-2, torch.bfloat16: 1e-1}.get(dtype, 1e-5)
            torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)
            g = torch.randn_like(ref)
            (dw,) = torch.autograd.grad(ours, w, g.to(dtype))
            (ref_dw,) = torch.autograd.grad(ref, ref_w, g)
            torch.testing.assert_close(dw.double(), ref_dw, rtol=tol, atol=tol)

        return run

    return [SelfCheck(f"embedding_bag[{m}]", d, check(d, m)) for m in _MODES for d in _FLOATS]


def benchmarks(device: torch.device, full: bool):

    # (num_embeddings, dim, mean bag, distribution, dtype, mode)
    if device.type == "cpu":
        configs = [(10_000, 64, 20, "uniform", torch.float32, "sum"), (10_000, 64, 20, "zipf", torch.float32, "mean"),
                   (10_000, 64, 20, "uniform", torch.float32, "max")]
        num_bags = 512
    else:
        num_bags = 16384
        configs = [(1_000_000, 128, 20, dist, dt, m) for dist in ("uniform", "zipf")
                   for dt in (torch.float32, torch.bfloat16) for m in ("sum", "mean")]
        configs.append((1_000_000, 128, 20, "uniform", torch.float32, "max"))
        if full:
            configs = [
                (1_000_000, 128, 20, "uniform", torch.float32, "sum"),
                (1_000_000, 128, 20, "zipf", torch.float32, "mean"),
                (1_000_000, 128, 100, "uniform", torch.float32, "mean"),
                (1_000_000, 128, 100, "zipf", torch.bfloat16, "sum"),
                (100_000, 64, 20, "uniform", torch.bfloat16, "sum"),
                (100_000, 256, 100, "zipf", torch.float32, "mean"),
                (100_000, 128, 20, "zipf", torch.float32, "sum"),
                (4_000_000, 64, 20, "zipf", torch.bfloat16, "mean"),
                (4_000_000, 64, 100, "zipf", torch.bfloat16, "sum"),
                (4_000_000, 128, 100, "uniform", torch.bfloat16, "mean"),
                (1_000_000, 256, 20, "uniform", torch.bfloat16, "sum"),
                (1_000_000, 128, 20, "uniform", torch.float32, "max"),
            ]
    cases = []
    for V, D, mean_bag, dist, dtype, mode in configs:
        mode_enum = _MODES[mode]
        elem = torch.tensor([], dtype=dtype).element_size()
        n_est = num_bags * mean_bag
        tag = f"V={V:.0e} D={D} bag={mean_bag} {dist} {str(dtype).replace('torch.', '')} {mode}"

        def make(V=V, D=D, mean_bag=mean_bag, dist=dist, dtype=dtype, mode=mode):
            off = random_bags(num_bags, mean_bag, device)
            n = int(off[-1]) + mean_bag  # the last bag has mean_bag entries
            idx = zipf_indices(n, V, 1.05, device) if dist == "zipf" else torch.randint(0, V, (n,), device=device)
            w = torch.randn(V, D, device=device, dtype=dtype)
            return idx, w, off

        def fwd_inputs(make=make):
            return make()

        def bwd_inputs(make=make, mode=mode, mode_enum=mode_enum):
            idx, w, off = make()
            _, o2b, bag_size, max_pos = torch.ops.baracuda.embedding_bag(w, idx, off, mode_enum, None, False, -1)
            wr = w.detach().requires_grad_()
            y = F.embedding_bag(idx, wr, off, mode=mode)
            return torch.randn_like(y), idx, o2b, bag_size, max_pos, wr, y

        fwd_bytes = n_est * (8 + D * elem) + num_bags * (8 + D * elem)
        bwd_bytes = V * D * elem + num_bags * D * elem + n_est * 8
        cases.append(BenchCase(
            "embedding_bag", f"embedding_bag {tag}", fwd_bytes, fwd_inputs,
            # No input requires grad: F.embedding_bag takes _embedding_bag_forward_only, and
            # baracuda_ops.embedding_bag the forward-only op.
            ours=lambda idx, w, off, m=mode_enum: torch.ops.baracuda.embedding_bag_forward_only(w, idx, off, m, None,
                                                                                              False, -1),
            peers={"eager": lambda idx, w, off, mode=mode: F.embedding_bag(idx, w, off, mode=mode)},
            compile_peer=lambda idx, w, off, mode=mode: F.embedding_bag(idx, w, off, mode=mode),
        ))
        cases.append(BenchCase(
            "embedding_bag", f"embedding_bag_backward {tag}", bwd_bytes, bwd_inputs,
            ours=lambda g, idx, o2b, bs, mp, wr, y, V=V, m=mode_enum: torch.ops.baracuda.embedding_bag_backward(
                g, idx, o2b, bs, mp, V, m, None, -1),
            peers={"eager": lambda g, idx, o2b, bs, mp, wr, y: torch.autograd.grad(y, wr, g, retain_graph=True)},
        ))
    return cases


def _thread_case(mode):
    weight = torch.randn(5000, 64)
    indices = torch.randint(0, 5000, (20000,))
    indices[::7] = 11  # a hot row: long runs in the backward
    offsets = torch.arange(0, 20000, 10)
    psw = torch.randn(20000) if mode == 0 else None

    def run():
        out, o2b, bag_size, max_pos = torch.ops.baracuda.embedding_bag(weight, indices, offsets, mode, psw, False, 3)
        grad = torch.linspace(-1, 1, out.numel()).view_as(out)
        results = [out, o2b, bag_size, max_pos]
        results.append(torch.ops.baracuda.embedding_bag_backward(grad, indices, o2b, bag_size, max_pos, 5000, mode,
                                                                 psw, 3))
        if mode == 0:
            results.append(torch.ops.baracuda.embedding_bag_per_sample_weights_backward(grad, weight, indices, o2b,
                                                                                        mode, 3))
        return results

    return run


def _thread_widths_case():
    """Row widths that leave every block size and a scalar tail, every dtype, per-sample
    weights and padding: the vectorized sums' edges."""
    cases = []
    for dim in (1, 7, 37, 200, 515):
        for dtype in _FLOATS:
            weight = torch.randn(300, dim).to(dtype)
            indices = torch.randint(0, 300, (600,))
            offsets = torch.arange(0, 600, 6)
            offsets[5] = offsets[4]  # an empty bag
            cases.append((weight, indices, offsets, torch.randn(600).to(dtype)))

    def run():
        results = []
        for weight, indices, offsets, psw in cases:
            for mode, weights in ((0, psw), (0, None), (1, None), (2, None)):
                out, o2b, bag_size, max_pos = torch.ops.baracuda.embedding_bag(weight, indices, offsets, mode, weights,
                                                                               False, 5)
                grad = torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype)
                grad_weight = torch.ops.baracuda.embedding_bag_backward(grad, indices, o2b, bag_size, max_pos, 300,
                                                                        mode, weights, 5)
                results += [out, grad_weight]
        return results

    return run


def cpu_thread_cases():
    return {
        "embedding_bag_widths": _thread_widths_case,
        "embedding_bag_sum": lambda: _thread_case(0),
        "embedding_bag_mean": lambda: _thread_case(1),
        "embedding_bag_max": lambda: _thread_case(2),
    }
