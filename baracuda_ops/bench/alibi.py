"""alibi: self-checks against references and benchmark cases."""

from __future__ import annotations

import math

import torch

from . import BenchCase, SelfCheck
from ..ops.alibi import _FLOATS, alibi, alibi_slopes


def _relative_positions(q: int, k: int, device, dtype=torch.float64) -> torch.Tensor:
    """(j - i) as a [Q, K] tensor."""
    return (torch.arange(k, device=device, dtype=dtype) - torch.arange(q, device=device, dtype=dtype)[:, None])


def reference(scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """float64 ``scores + slopes.view(H, 1, 1) * (j - i)``."""
    rel = _relative_positions(scores.shape[2], scores.shape[3], scores.device)
    return scores.double() + slopes.double().view(-1, 1, 1) * rel


def reference_slope_grad(grad: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_{b,i,j} grad * (j - i)`` per head."""
    rel = _relative_positions(grad.shape[2], grad.shape[3], grad.device)
    return (grad.double() * rel).sum(dim=(0, 2, 3))


def self_checks():

    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}

    def forward(dtype):
        def run(device):
            scores = torch.randn(3, 5, 7, 24, device=device, dtype=dtype)
            slopes = alibi_slopes(5, device=device)
            ours = alibi(scores, slopes)
            ref = reference(scores, slopes)
            torch.testing.assert_close(ours.double(), ref.to(dtype).double(), rtol=tol[dtype], atol=tol[dtype])

        return run

    def backward(dtype):
        def run(device):
            grad = torch.randn(3, 5, 7, 24, device=device, dtype=dtype)
            slopes = alibi_slopes(5, device=device)
            _, ours = torch.ops.baracuda.alibi_backward(grad, slopes, [False, True])
            ref = reference_slope_grad(grad)
            torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-3)

        return run

    return [SelfCheck("alibi", d, forward(d)) for d in _FLOATS] + [
        SelfCheck("alibi_backward", d, backward(d)) for d in _FLOATS
    ]


def benchmarks(device: torch.device, full: bool):

    shapes = [(8, 32, 1024, 1024), (2, 32, 4096, 4096), (1, 64, 2048, 2048), (64, 16, 1, 4096)]
    if not full:
        shapes = [shapes[0], shapes[-1]]
    dtypes = (torch.bfloat16, torch.float32)
    if device.type == "cpu":  # keep the CPU run short
        shapes, dtypes = [(2, 8, 256, 256), (16, 8, 1, 1024)], (torch.float32,)
    cases = []
    for shape in shapes:
        b, h, q, k = shape
        for dtype in dtypes:
            numel = math.prod(shape)
            size = torch.tensor([], dtype=dtype).element_size()
            tag = f"{list(shape)} {str(dtype).replace('torch.', '')}"

            # The peers see slopes and (j - i) in the scores dtype, so every
            # implementation produces a result of the scores dtype.
            def fwd_inputs(shape=shape, dtype=dtype):
                scores = torch.randn(shape, device=device, dtype=dtype)
                slopes = alibi_slopes(shape[1], dtype=dtype, device=device)
                return scores, slopes, _relative_positions(shape[2], shape[3], device, dtype)

            def bwd_inputs(shape=shape, dtype=dtype):
                scores, slopes, rel = fwd_inputs(shape, dtype)
                slopes.requires_grad_()
                y = scores + slopes.view(-1, 1, 1) * rel
                return torch.randn_like(y), slopes, y, rel

            def eager_forward(scores, slopes, rel):
                return scores + slopes.view(-1, 1, 1) * rel

            cases.append(BenchCase(
                "alibi", f"alibi {tag}", 2 * numel * size + h * size, fwd_inputs,
                ours=lambda scores, slopes, rel: torch.ops.baracuda.alibi(scores, slopes),
                peers={"eager": eager_forward},
                compile_peer=eager_forward,
            ))
            cases.append(BenchCase(
                "alibi", f"alibi_backward (slopes) {tag}", numel * size + 2 * h * size, bwd_inputs,
                ours=lambda g, slopes, y, rel: torch.ops.baracuda.alibi_backward(g, slopes.detach(), [False, True]),
                peers={"eager": lambda g, slopes, y, rel: torch.autograd.grad(y, slopes, g, retain_graph=True)},
                compile_peer=lambda g, slopes, y, rel: (g * rel).sum(dim=(0, 2, 3)),
            ))
    return cases


def _thread_case():
    scores = torch.randn(4, 8, 128, 256)
    slopes = alibi_slopes(8)
    grad = torch.randn(4, 8, 128, 256)
    return lambda: [torch.ops.baracuda.alibi(scores, slopes), *torch.ops.baracuda.alibi_backward(grad, slopes,
                                                                                                 [True, True])]


def cpu_thread_cases():
    return {"alibi": _thread_case}
