"""rms_norm: self-checks against references and benchmark cases."""

from __future__ import annotations

import itertools
from typing import Sequence

import torch

from . import BenchCase, SelfCheck
from ..ops.rms_norm import _FLOATS, _acc_dtype, rms_norm


def _reference(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None,
               eps: float | None) -> torch.Tensor:
    """float64 rms_norm from plain ops (eps default: the computation type's epsilon)."""
    if eps is None:
        eps = torch.finfo(_acc_dtype(x.dtype)).eps
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + eps)
    return y * weight.double() if weight is not None else y


def self_checks():

    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}

    def weight_dtypes(dtype):  # a float32 weight with a half input: 32-byte weight vectors, partly staged
        return (dtype, torch.float32) if dtype in (torch.float16, torch.bfloat16) else (dtype,)

    def forward(dtype):
        def run(device):
            # Decode rows, then (more rows than SMs) rows of clusters (CUDA, on an H200 at
            # 65536 and 130000 16-bit, 65536 float32: of four or eight 512-thread CTAs staged
            # by bulk copies, at 130000 the last CTA's last chunk partly past the row).
            shapes = ((6, 7), (6, 1024), (6, 3000), (6, 4096), (6, 65536), (140, 65536), (140, 65000), (140, 130000))
            for (m, n), wdt in itertools.product(shapes, weight_dtypes(dtype)):
                x = torch.randn(m, n, device=device, dtype=dtype)
                w = torch.randn(n, device=device, dtype=wdt)
                y = rms_norm(x, (n,), w)
                assert y.dtype == torch.nn.functional.rms_norm(x, (n,), w).dtype
                torch.testing.assert_close(y.double(), _reference(x, (n,), w, None), rtol=tol[dtype], atol=tol[dtype])

        return run

    def backward(dtype):
        def run(device):
            # Decode rows (CUDA: a CTA each at 1 or 2 vectors a thread; dW written
            # directly for one row; a single 16-bit row of 32768 spread over a
            # cluster), then more rows than SMs: short rows sharing a CTA, a row per
            # CTA (CUDA: 16-bit rows of 4096 on an H200 staged by bulk copies; with
            # more than 256 threads, float32 at 5120 and 16-bit elements at 16384,
            # grouped dW slots; 16-bit rows of a warp, 776 and 1024, on an H200 a 32-thread
            # CTA each, staged; at 1100 x 2048 and 600 x 4096 a full wave of 8 and 4 an
            # SM, whose CTAs fold dW in launch clusters; at 600 x 1024 600 partial rows, which the
            # dW sum spreads over every SM), a row per cluster (CUDA: weight
            # staged in shared memory, wholly or partly; half-input rows with x and dy
            # staged by bulk copies: with a float32 weight, and on an H200 the 150
            # rows of 32768 with a 16-bit one too; at 40000 in part).
            shapes = ((1, 4096), (1, 16384), (1, 32768), (6, 7), (6, 1024), (6, 3000), (6, 65536), (200, 40),
                      (200, 776), (300, 1024), (600, 1024), (1100, 2048), (200, 4096), (600, 4096), (100, 5120), (48, 16384),
                      (150, 32768), (20, 40000))
            for (m, n), wdt in itertools.product(shapes, weight_dtypes(dtype)):
                x = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True)
                w = torch.randn(n, device=device, dtype=wdt, requires_grad=True)
                g = torch.randn(m, n, device=device, dtype=dtype)
                dx, dw = torch.autograd.grad(rms_norm(x, (n,), w), (x, w), g)
                x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
                rx, rw = torch.autograd.grad(_reference(x64, (n,), w64, torch.finfo(_acc_dtype(dtype)).eps), (x64, w64),
                                             g.double())
                t = 4 * tol[dtype]
                torch.testing.assert_close(dx.double(), rx, rtol=t, atol=t)
                torch.testing.assert_close(dw.double(), rw, rtol=t, atol=t * 6)

        return run

    return [SelfCheck("rms_norm", d, forward(d)) for d in _FLOATS] + [
        SelfCheck("rms_norm_backward", d, backward(d)) for d in _FLOATS
    ]


def _liger():
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return LigerRMSNormFunction


def _quack():
    """quack's ``rmsnorm_fwd`` / ``rmsnorm_bwd`` (CuTe-DSL kernels), or None where it does not import."""
    try:
        from quack.rmsnorm import rmsnorm_bwd, rmsnorm_fwd
    except Exception:  # not installed, or its CUDA library is missing
        return None
    return rmsnorm_fwd, rmsnorm_bwd


def benchmarks(device: torch.device, full: bool):

    F = torch.nn.functional
    bf16, f32 = torch.bfloat16, torch.float32
    # (M, N, input dtype, weight dtype)
    if device.type == "cpu":
        shapes = [(512, 1024, f32, f32), (64, 8192, bf16, bf16), (8, 4096, bf16, bf16)]
    elif full:
        shapes = [(2**27 // n, n, dt, wt) for n in (1024, 2048, 4096, 5120, 8192, 16384, 32768, 65536)
                  for dt, wt in ((bf16, bf16), (bf16, f32), (f32, f32))]
        shapes += [(m, n, dt, wt) for n in (4096, 8192) for m in (1, 8, 32) for dt, wt in ((bf16, bf16), (bf16, f32), (f32, f32))]
    else:
        shapes = [(2**27 // 4096, 4096, bf16, bf16), (2**27 // 65536, 65536, bf16, bf16), (2**27 // 4096, 4096, f32, f32),
                  (8, 4096, bf16, bf16)]
    liger = _liger() if device.type == "cuda" else None
    quack = _quack() if device.type == "cuda" else None
    cases = []
    for m, n, dt, wt in shapes:
        e, we = torch.tensor([], dtype=dt).element_size(), torch.tensor([], dtype=wt).element_size()
        tag = f"[{m}, {n}] {str(dt).replace('torch.', '')}" + (" w=float32" if wt != dt else "")
        eps = torch.finfo(torch.float32).eps

        def fwd_inputs(m=m, n=n, dt=dt, wt=wt):
            return torch.randn(m, n, device=device, dtype=dt), torch.randn(n, device=device, dtype=wt)

        # Backward inputs: dy, x, w, rstd, and the forward outputs whose autograd graphs the
        # eager and Liger peers run backward through (built here, with the inputs: an
        # output first made while a CUDA graph is being captured would pin that graph's
        # memory pool for the rest of the run).
        def bwd_inputs(m=m, n=n, dt=dt, wt=wt):
            x = torch.randn(m, n, device=device, dtype=dt, requires_grad=True)
            w = torch.randn(n, device=device, dtype=wt, requires_grad=True)
            y, rstd = torch.ops.baracuda.rms_norm(x, [n], w, None)
            y_liger = liger.apply(x, w, eps, 0.0, "llama", False) if liger is not None else None
            rstd_quack = quack[0](x.detach(), w.detach(), eps=eps, store_rstd=True)[2] if quack is not None else None
            return torch.randn_like(y), x, w, rstd, F.rms_norm(x, [n], w), y_liger, rstd_quack

        fwd_peers = {"eager": lambda x, w, n=n: F.rms_norm(x, [n], w)}
        bwd_peers = {"eager": lambda g, x, w, rstd, y, *_: torch.autograd.grad(y, (x, w), g, retain_graph=True)}
        if liger is not None:
            fwd_peers["liger"] = lambda x, w: liger.apply(x, w, eps, 0.0, "llama", False)
            bwd_peers["liger"] = lambda g, x, w, rstd, y, y_liger, _: torch.autograd.grad(y_liger, (x, w), g,
                                                                                         retain_graph=True)
        if quack is not None:  # its backward takes its own rstd ([M], from its forward)
            fwd_peers["quack"] = lambda x, w: quack[0](x, w, eps=eps)[0]
            bwd_peers["quack"] = lambda g, x, w, rstd, y, y_liger, rstd_quack: quack[1](
                x.detach(), w.detach(), g, rstd_quack)[:2]
        cases.append(BenchCase(
            "rms_norm", f"rms_norm {tag}", 2 * m * n * e + n * we + m * 4, fwd_inputs,
            ours=lambda x, w, n=n: torch.ops.baracuda.rms_norm(x, [n], w, None),
            peers=fwd_peers,
            compile_peer=lambda x, w, n=n: F.rms_norm(x, [n], w),
        ))
        cases.append(BenchCase(
            "rms_norm", f"rms_norm_backward {tag}", 3 * m * n * e + m * 4 + 2 * n * we, bwd_inputs,
            ours=lambda g, x, w, rstd, *_, n=n: torch.ops.baracuda.rms_norm_backward(
                g, x.detach(), [n], rstd, w.detach(), [True, True]),
            peers=bwd_peers,
            compile_peer=lambda g, x, w, rstd, *_, n=n, mixed=wt != dt: _mixed_backward(g, x.detach(), w.detach(),
                                                                                         rstd)
            if mixed else torch.ops.aten._fused_rms_norm_backward(g, x.detach(), [n], rstd, w.detach(), [True, True]),
        ))
    return cases


def _mixed_backward(g, x, w, rstd):
    """What autograd computes for a float32 weight on a half input, for torch.compile to fuse."""
    n = x.shape[-1]
    gf, xf = g.float(), x.float()
    xhat = xf * rstd
    gw = gf * w
    dx = (gw - xhat * (gw * xhat).sum(-1, keepdim=True) / n) * rstd
    return dx.to(x.dtype), (gf * xhat).sum(0)


def _thread_case():
    x = torch.randn(512, 1024).bfloat16()
    weight = torch.randn(1024)
    dy = torch.randn(512, 1024).bfloat16()

    def run():
        out, rstd = torch.ops.baracuda.rms_norm(x, [1024], weight, None)
        return [out, rstd, *torch.ops.baracuda.rms_norm_backward(dy, x, [1024], rstd, weight, [True, True])]

    return run


def cpu_thread_cases():
    return {"rms_norm": _thread_case}
