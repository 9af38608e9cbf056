"""repeat: self-checks against references and benchmark cases."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from . import BenchCase, SelfCheck
from ..ops.repeat import _output_shape, repeat


def _reference_backward(grad: torch.Tensor, repeats: Sequence[int], input_shape: Sequence[int]) -> torch.Tensor:
    """What PyTorch's autograd does for Tensor.repeat: view grad as [r0, s0, r1, s1, ...] and sum the r's."""
    shape = [1] * (len(repeats) - len(input_shape)) + list(input_shape)
    split = [d for r, s in zip(repeats, shape) for d in (r, s)]
    return grad.reshape(split).sum(dim=tuple(range(0, 2 * len(repeats), 2))).reshape(input_shape)


def self_checks():

    # Odd rows (scalar path), 16-byte rows (vector path), many tiles (split path), empty.
    cases = [((5, 7), (3, 2, 3)), ((4, 64), (2, 3)), ((64,), (300, 1)), ((0, 3), (2, 2)), ((3,), (0,))]

    def forward(dtype):
        def run(device):
            for shape, reps in cases:
                x = torch.randn(shape, device=device).to(dtype)
                assert torch.equal(repeat(x, reps), x.repeat(*reps)), f"repeat != Tensor.repeat at {shape} x {reps}"

        return run

    def backward(dtype):
        def run(device):
            for shape, reps in cases:
                g = torch.randn(_output_shape("repeat", shape, reps), device=device, dtype=dtype)
                ours = torch.ops.baracuda.repeat_backward(g, list(reps), list(shape))
                ref = _reference_backward(g.double(), reps, shape)
                tol = {torch.float16: 3e-2, torch.bfloat16: 2e-1}.get(dtype, 1e-4)
                torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)

        return run

    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return [SelfCheck("repeat", d, forward(d)) for d in floats + (torch.int64, torch.bool)] + [
        SelfCheck("repeat_backward", d, backward(d)) for d in floats
    ]


def benchmarks(device: torch.device, full: bool):

    shapes = [
        ((4096,), (8192, 1), "bias"),
        ((8192, 1024), (4, 1), "rows"),
        ((8192, 256), (1, 16), "cols"),
        ((32, 64, 56, 56), (1, 1, 2, 2), "image"),
        ((1024, 1024), (16, 1, 1), "leading"),
    ]
    if full:
        shapes.append(((16384, 4096), (2, 1), "large"))
    dtypes = (torch.float32, torch.bfloat16)
    if device.type == "cpu":  # keep the CPU run short: 1/16 of the work
        shapes = [((4096,), (512, 1), "bias"), ((512, 1024), (4, 1), "rows"), ((512, 256), (1, 16), "cols"),
                  ((2, 64, 56, 56), (1, 1, 2, 2), "image"), ((64, 1024), (16, 1, 1), "leading")]
    cases = []
    for shape, reps, label in shapes:
        for dtype in dtypes:
            numel = math.prod(shape)
            out_numel = numel * math.prod(reps)
            size = torch.tensor([], dtype=dtype).element_size()
            tag = f"{label} {list(shape)}x{tuple(reps)} {str(dtype).replace('torch.', '')}"

            def fwd_inputs(shape=shape, dtype=dtype):
                return (torch.randn(shape, device=device, dtype=dtype),)

            def bwd_inputs(shape=shape, reps=reps, dtype=dtype):
                return (torch.randn(_output_shape("repeat", shape, reps), device=device, dtype=dtype),)

            cases.append(BenchCase(
                "repeat", f"repeat {tag}", (numel + out_numel) * size, fwd_inputs,
                ours=lambda x, reps=reps: torch.ops.baracuda.repeat(x, list(reps)),
                peers={"eager": lambda x, reps=reps: x.repeat(*reps)},
                compile_peer=lambda x, reps=reps: x.repeat(*reps),
            ))
            cases.append(BenchCase(
                "repeat", f"repeat_backward {tag}", (numel + out_numel) * size, bwd_inputs,
                ours=lambda g, reps=reps, shape=shape: torch.ops.baracuda.repeat_backward(g, list(reps), list(shape)),
                # The ops PyTorch's autograd runs for Tensor.repeat's backward (view + sum).
                peers={"eager": lambda g, reps=reps, shape=shape: _reference_backward(g, reps, shape)},
                compile_peer=lambda g, reps=reps, shape=shape: _reference_backward(g, reps, shape),
            ))
    return cases


def _thread_case():
    x = torch.randn(37, 129, 5)
    grad = torch.randn(4 * 37, 3 * 129, 2 * 5)
    return lambda: [torch.ops.baracuda.repeat(x, [4, 3, 2]), torch.ops.baracuda.repeat_backward(grad, [4, 3, 2],
                                                                                                [37, 129, 5])]


def cpu_thread_cases():
    return {"repeat": _thread_case}
