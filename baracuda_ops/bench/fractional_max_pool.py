"""fractional_max_pool: self-checks against references and benchmark cases."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from . import BenchCase, SelfCheck
from ..ops.fractional_max_pool import (
    _FLOATS,
    FractionalMaxPool2dBackwardPlan,
    FractionalMaxPool3dBackwardPlan,
    _functional,
)


def _torch_functional(dims: int):
    return F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d


def self_checks():

    # (shape, kernel, output): each CUDA forward variant (kernel sizes that differ by axis,
    # uniform 2 and 3, 2d planes staged whole or in bands of rows; the last has more
    # output rows + columns than a block has cells: no start table)
    forward_problems = {
        2: [((2, 3, 23, 19), (3, 2), (10, 12)), ((2, 3, 23, 19), (2, 2), (11, 9)),
            ((2, 3, 23, 19), (3, 3), (10, 8)), ((1, 2, 250, 250), (3, 3), (100, 100)),
            ((1, 2, 3, 4200), (2, 2), (2, 4100))],
        3: [((2, 3, 9, 11, 10), (2, 3, 2), (5, 6, 7)), ((2, 3, 9, 11, 10), (2, 2, 2), (4, 5, 6)),
            ((2, 3, 9, 11, 10), (3, 3, 3), (5, 6, 7)), ((1, 2, 3, 4, 4200), (1, 1, 2), (2, 3, 4100))],
    }

    def forward(dims, dtype):
        def run(device):
            for shape, k, out in forward_problems[dims]:
                x = torch.randn(shape, device=device).to(dtype)
                s = torch.rand(shape[0], shape[1], dims, device=device).to(dtype)
                y, i = _functional(dims, x, k, out, None, True, s)
                ry, ri = _torch_functional(dims)(x, k, output_size=out, _random_samples=s, return_indices=True)
                assert torch.equal(i, ri) and torch.equal(y, ry), f"output or indices != PyTorch's at {shape}, k={k}"

        return run

    # (shape, kernel, output): each CUDA backward variant: overlapping windows (counts;
    # 3d: up to 80 candidates per element), a plane split in two tiles, disjoint windows
    # of a stride that is not an integer (tiles), integer strides (owned boxes: 2 = k,
    # pairs along W; 3 > k, scalar stores; planes of 4 and 2 blocks, flagged ones fixed by
    # the second kernel). Each with forward indices, then with one of the first plane's
    # pointing at its last element (a stray), then with all of them at its first
    # (overlapping windows: thousands of contributions in the split plane); float32 also
    # with samples of 1 - 2^-24, which move windows (owned boxes' movers).
    backward_problems = {
        2: [((2, 3, 23, 19), (3, 3), (12, 10)), ((1, 2, 150, 130), (4, 3), (60, 90)),
            ((2, 3, 25, 19), (2, 2), (11, 8)), ((2, 3, 24, 18), (2, 2), (12, 9)), ((1, 3, 23, 23), (2, 2), (8, 8)),
            ((1, 2, 112, 112), (2, 2), (56, 56))],
        3: [((2, 3, 9, 11, 10), (3, 3, 3), (5, 6, 7)), ((2, 3, 9, 11, 10), (2, 2, 2), (4, 5, 4)),
            ((2, 3, 8, 10, 12), (2, 2, 2), (4, 5, 6)), ((1, 2, 8, 32, 64), (2, 2, 2), (4, 16, 32))],
    }

    def backward(dims, dtype):
        def run(device):
            moved = [1 - 2.0**-24] if dtype == torch.float32 else []
            for (shape, k, out), u, stray in itertools.product(backward_problems[dims], [None] + moved, (0, 1, 2)):
                x = torch.randn(shape, device=device).to(dtype)
                s = torch.rand(shape[0], shape[1], dims, device=device).to(dtype) if u is None else (
                    torch.full((shape[0], shape[1], dims), u, device=device, dtype=dtype))
                y, i = _functional(dims, x, k, out, None, True, s)
                if stray == 1:
                    i.view(-1)[0] = math.prod(shape[-dims:]) - 1
                elif stray == 2:
                    i[0, 0] = 0
                g = torch.randn_like(y)
                op = getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d_backward")
                ours = op(g, x, k, out, i)
                ref = torch.zeros(x.shape, dtype=torch.float64, device=device).flatten(-dims)
                ref.scatter_add_(-1, i.flatten(-dims), g.double().flatten(-dims))
                tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6 if stray < 2 else 1e-3)
                torch.testing.assert_close(ours.double(), ref.view(x.shape), rtol=tol, atol=tol)
                if stray == 2:  # thousands of terms in one element: the CPU kernel adds them in the same order
                    assert torch.equal(ours.cpu(), op(g.cpu(), x.cpu(), k, out, i.cpu())), f"!= CPU at {shape}, k={k}"
                if not stray and u is None:  # into a buffer one element off 16-byte alignment
                    plan = FractionalMaxPool2dBackwardPlan if dims == 2 else FractionalMaxPool3dBackwardPlan
                    desc = plan.descriptor(tuple(shape), k, out, dtype, device)
                    ws = torch.empty(plan.select(desc).workspace_size(), dtype=torch.uint8, device=device)
                    dx = torch.empty(x.numel() + 1, dtype=dtype, device=device)[1:].view(x.shape)
                    op.out(g, x, k, out, i, grad_input=dx, workspace=ws)
                    assert torch.equal(dx, ours), f"grad_input at an offset != its result at {shape}, k={k}"

        return run

    return [SelfCheck(f"fractional_max_pool{n}d", d, forward(n, d)) for n in (2, 3) for d in _FLOATS] + [
        SelfCheck(f"fractional_max_pool{n}d_backward", d, backward(n, d)) for n in (2, 3) for d in _FLOATS
    ]


def benchmarks(device: torch.device, full: bool):

    # (input shape, output size, kernel size)
    shapes = [((64, 64, 112, 112), (56, 56), 3), ((8, 32, 32, 64, 64), (16, 32, 32), 2)]
    if full:
        shapes = [((64, 64, 112, 112), (56, 56), 2), ((64, 64, 112, 112), (56, 56), 3),
                  ((32, 128, 56, 56), (40, 40), 3), ((8, 32, 32, 64, 64), (16, 32, 32), 2)]
    if device.type == "cpu":  # keep the CPU run short
        shapes = [((2, 16, 56, 56), (28, 28), 3), ((1, 8, 16, 32, 32), (8, 16, 16), 2)]
    cases = []
    for shape, out, k in shapes:
        dims = len(out)
        kernel = [k] * dims
        torch_fn = _torch_functional(dims)
        ours_fw = getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d")
        ours_bw = getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d_backward")
        aten_bw = getattr(torch.ops.aten, f"fractional_max_pool{dims}d_backward")
        for dtype in (torch.float32, torch.bfloat16):
            size = torch.tensor([], dtype=dtype).element_size()
            in_numel = math.prod(shape)
            out_numel = math.prod(shape[:-dims]) * math.prod(out)
            tag = f"{list(shape)}->{tuple(out)} k={k} {str(dtype).replace('torch.', '')}"

            def fwd_inputs(shape=shape, dims=dims, dtype=dtype):
                x = torch.randn(shape, device=device, dtype=dtype)
                return x, torch.rand(shape[0], shape[1], dims, device=device, dtype=dtype)

            def bwd_inputs(shape=shape, dims=dims, dtype=dtype, out=out, kernel=kernel, torch_fn=torch_fn):
                x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
                s = torch.rand(shape[0], shape[1], dims, device=device, dtype=dtype)
                y, i = torch_fn(x, kernel, output_size=out, _random_samples=s, return_indices=True)
                return torch.randn_like(y), x, y, i, x.detach()

            def torch_forward(x, s, torch_fn=torch_fn, kernel=kernel, out=out):
                return torch_fn(x, kernel, output_size=out, _random_samples=s, return_indices=True)

            cases.append(BenchCase(
                "fractional_max_pool", f"fractional_max_pool{dims}d {tag}",
                (in_numel + out_numel) * size + out_numel * 8, fwd_inputs,
                ours=lambda x, s, f=ours_fw, kernel=kernel, out=out: f(x, kernel, list(out), s),
                peers={"eager": torch_forward},
                compile_peer=torch_forward,
            ))
            cases.append(BenchCase(
                "fractional_max_pool", f"fractional_max_pool{dims}d_backward {tag}",
                (in_numel + out_numel) * size + out_numel * 8, bwd_inputs,
                ours=lambda g, x, y, i, xd, f=ours_bw, kernel=kernel, out=out: f(g, xd, kernel, list(out), i),
                peers={"eager": lambda g, x, y, i, xd: torch.autograd.grad(y, x, g, retain_graph=True)},
                compile_peer=lambda g, x, y, i, xd, f=aten_bw, kernel=kernel, out=out: f(g, xd, kernel, list(out), i),
            ))
    return cases


def _thread_case(dims, shape, k, out):
    x = torch.randn(shape)
    samples = torch.rand(shape[0], shape[1], dims)
    forward = getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d")
    backward = getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d_backward")

    def run():
        y, idx = forward(x, k, out, samples)
        return [y, idx, backward(torch.ones_like(y), x, k, out, idx)]

    return run


def cpu_thread_cases():
    return {
        "fractional_max_pool2d": lambda: _thread_case(2, (8, 16, 64, 64), [2, 2], [32, 32]),
        "fractional_max_pool3d": lambda: _thread_case(3, (4, 8, 16, 16, 16), [3, 3, 3], [8, 8, 8]),
    }
