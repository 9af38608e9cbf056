"""rms_norm_fused: self-checks against float64 references and benchmark cases of the pre-norm
residual block (h = x + r; y = rms_norm(h) * w), against the unfused PyTorch code, its
torch.compile, Liger-Kernel's fused add and quack's residual RMSNorm."""

from __future__ import annotations

import math

import torch

from . import BenchCase, SelfCheck
from .rms_norm import _quack

_EPS = torch.finfo(torch.float32).eps


def _reference(x, residual, weight, weight_offset=0.0):
    """float64 y and h of the fused op (h rounded to its dtype first, as the op stores it)."""
    h = (x + residual) if residual is not None else x
    h64 = h.double()
    y = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + _EPS)
    return y * (weight.double() + weight_offset), h


def self_checks():
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}

    # On CUDA: rows of 257 take the CTA-per-row kernels, 5 rows of 4096 decode rows (the weight loaded
    # with x), 19 rows of 32776 the backward's cluster rows (5 CTAs a row, the last one's slice partly
    # past the row; float64's rows: the CTA-per-row kernel), 1300 rows of 2560 the backward's streamed
    # rows of 16-bit inputs on an H200 (every stage refilled, each row's last chunk of vectors partial),
    # 2500 rows of 2048 those rows' CTAs folding dW in launch clusters, 300 rows of 32760 the
    # backward's streamed cluster rows (CTAs of 128 threads, eight of them a 16-bit row, sixteen a
    # float32 one; the last CTA's last chunk short), 140 rows of 40000 in 16-bit those of ten CTAs a
    # row (the last CTA's part of the row short), 33 rows of 200 the quant's decode rows.
    def forward(dtype, offset, m, n):
        def run(device):
            x, r = (torch.randn(m, n, device=device, dtype=dtype) for _ in range(2))
            w = torch.randn(n, device=device, dtype=dtype)
            y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, [n], w, _EPS, offset, "torch")
            y_ref, h_ref = _reference(x, r, w, offset)
            torch.testing.assert_close(h, h_ref)
            torch.testing.assert_close(y.double(), y_ref, rtol=tol[dtype], atol=tol[dtype])
        return run

    def backward(dtype, n, m=19):
        def run(device):
            def rounded(*shape):  # float64 values of `dtype`: the reference sees the kernel's inputs
                return torch.randn(*shape, device=device, dtype=torch.float64).to(dtype).double()

            x, r = (rounded(m, n).requires_grad_() for _ in range(2))
            w = rounded(n).requires_grad_()
            dy, dh = rounded(m, n), rounded(m, n)
            y_ref, h_ref = _reference(x, r, w)
            expected = torch.autograd.grad((y_ref, h_ref), (x, r, w), (dy, dh))
            args = [t.detach().to(dtype).requires_grad_() for t in (x, r, w)]
            y, h = torch.ops.baracuda.rms_norm_fused(args[0], args[1], [n], args[2], _EPS, 0.0, "torch")[:2]
            got = torch.autograd.grad((y, h), args, (dy.to(dtype), dh.to(dtype)))
            # dW sums a product per row: the inputs' rounding error grows with the square root of the rows
            for g, e, scale in zip(got, expected, (1, 1, max(1.0, math.sqrt(m / 16)))):
                t = 4 * tol[dtype] * scale
                torch.testing.assert_close(g.double(), e, rtol=t, atol=t)
        return run

    def quant(dtype, m=33, n=200):  # static and dynamic scales: the float8 bits of (y / scale).clamp(+-448)
        def run(device):
            x, r = (torch.randn(m, n, device=device, dtype=dtype) for _ in range(2))
            w = torch.randn(n, device=device, dtype=dtype)
            y, h, _ = torch.ops.baracuda.rms_norm_fused(x, r, [n], w, _EPS, 0.0, "torch")
            static = torch.tensor([0.05], device=device)
            for scale in (static, None):
                q, h_q, scale_out = torch.ops.baracuda.rms_norm_quant(x, r, [n], w, _EPS, 0.0, "torch", scale)
                s = static if scale is not None else scale_out.view(-1, 1)
                # y / scale in the op's accumulation dtype (float64 for float64 y), as it divides
                expected = (y / s).clamp(-448, 448).to(torch.float8_e4m3fn)
                torch.testing.assert_close(h_q, h)
                assert torch.equal(q.view(torch.uint8), expected.view(torch.uint8)), "float8 bits differ"
        return run

    checks = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        checks.append(SelfCheck("rms_norm_fused", dtype, forward(dtype, 0.0, 37, 257)))
        checks.append(SelfCheck("rms_norm_fused (weight_offset=1)", dtype, forward(dtype, 1.0, 37, 257)))
        checks.append(SelfCheck("rms_norm_fused (5 x 4096)", dtype, forward(dtype, 1.0, 5, 4096)))
        checks.append(SelfCheck("rms_norm_fused (9 x 40000)", dtype, forward(dtype, 1.0, 9, 40000)))
        checks.append(SelfCheck("rms_norm_fused_backward", dtype, backward(dtype, 130)))
        checks.append(SelfCheck("rms_norm_fused_backward (19 x 32776)", dtype, backward(dtype, 32776)))
        checks.append(SelfCheck("rms_norm_fused_backward (1300 x 2560)", dtype, backward(dtype, 2560, 1300)))
        checks.append(SelfCheck("rms_norm_fused_backward (2500 x 2048)", dtype, backward(dtype, 2048, 2500)))
        checks.append(SelfCheck("rms_norm_fused_backward (300 x 32760)", dtype, backward(dtype, 32760, 300)))
        if dtype.itemsize == 2:
            checks.append(SelfCheck("rms_norm_fused_backward (140 x 40000)", dtype, backward(dtype, 40000, 140)))
        checks.append(SelfCheck("rms_norm_quant", dtype, quant(dtype)))
        checks.append(SelfCheck("rms_norm_quant (9 x 40000)", dtype, quant(dtype, 9, 40000)))
    return checks


def _liger():
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        return None
    return LigerFusedAddRMSNormFunction


def _unfused(x, r, w, n):
    h = x + r
    return torch.nn.functional.rms_norm(h, [n], w, _EPS), h


def benchmarks(device: torch.device, full: bool):
    bf16, f32 = torch.bfloat16, torch.float32
    if device.type == "cpu":
        shapes = [(512, 1024, f32, f32), (64, 4096, bf16, bf16)]
    elif full:
        shapes = [(2**27 // n, n, dt, wt) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
                  for dt, wt in ((bf16, bf16), (bf16, f32), (f32, f32))]
        shapes += [(m, n, bf16, bf16) for n in (4096, 8192) for m in (1, 8, 32)]
    else:
        shapes = [(2**27 // 4096, 4096, bf16, bf16), (2**27 // 4096, 4096, f32, f32), (8, 4096, bf16, bf16)]
    liger = _liger() if device.type == "cuda" else None
    quack = _quack() if device.type == "cuda" else None
    cases = []
    for m, n, dt, wt in shapes:
        e, we = torch.tensor([], dtype=dt).element_size(), torch.tensor([], dtype=wt).element_size()
        tag = f"[{m}, {n}] {str(dt).replace('torch.', '')}" + (" w=float32" if wt != dt else "")

        def fwd_inputs(m=m, n=n, dt=dt, wt=wt):
            return (torch.randn(m, n, device=device, dtype=dt), torch.randn(m, n, device=device, dtype=dt),
                    torch.randn(n, device=device, dtype=wt))

        # Backward inputs: dy, dh, h, rstd, w, and the forward graphs the eager and Liger peers
        # run backward through (built here, outside any CUDA-graph capture).
        def bwd_inputs(m=m, n=n, dt=dt, wt=wt):
            x, r = (torch.randn(m, n, device=device, dtype=dt, requires_grad=True) for _ in range(2))
            w = torch.randn(n, device=device, dtype=wt, requires_grad=True)
            _, h, rstd = torch.ops.baracuda.rms_norm_fused(x.detach(), r.detach(), [n], w.detach(), _EPS, 0.0,
                                                           "torch")
            eager = _unfused(x, r, w, n)
            lig = liger.apply(x, r, w, _EPS, 0.0, "llama", False) if liger is not None else None
            rstd_quack = quack[0](h, w.detach(), eps=_EPS, store_rstd=True)[2] if quack is not None else None
            return (torch.randn(m, n, device=device, dtype=dt), torch.randn(m, n, device=device, dtype=dt), h, rstd,
                    w, x, r, eager, lig, rstd_quack)

        fwd_peers = {"eager": lambda x, r, w, n=n: _unfused(x, r, w, n)}
        bwd_peers = {"eager": lambda dy, dh, h, rstd, w, x, r, eager, *_: torch.autograd.grad(
            eager, (x, r, w), (dy, dh), retain_graph=True)}
        if liger is not None:
            fwd_peers["liger"] = lambda x, r, w: liger.apply(x, r, w, _EPS, 0.0, "llama", False)
            bwd_peers["liger"] = lambda dy, dh, h, rstd, w, x, r, eager, lig, _: torch.autograd.grad(
                lig, (x, r, w), (dy, dh), retain_graph=True)
        if quack is not None:
            fwd_peers["quack"] = lambda x, r, w: quack[0](x, w, residual=r, eps=_EPS)[:2]
            bwd_peers["quack"] = lambda dy, dh, h, rstd, w, x, r, eager, lig, rstd_quack: quack[1](
                h, w.detach(), dy, rstd_quack, dresidual_out=dh, has_residual=True)
        cases.append(BenchCase(
            "rms_norm_fused", f"rms_norm_fused {tag}", 4 * m * n * e + n * we + m * 4, fwd_inputs,
            ours=lambda x, r, w, n=n: torch.ops.baracuda.rms_norm_fused(x, r, [n], w, _EPS, 0.0, "torch"),
            peers=fwd_peers,
            compile_peer=lambda x, r, w, n=n: _unfused(x, r, w, n),
        ))
        cases.append(BenchCase(
            "rms_norm_fused", f"rms_norm_fused_backward {tag}", 4 * m * n * e + m * 4 + 2 * n * we, bwd_inputs,
            ours=lambda dy, dh, h, rstd, w, *_, n=n, dt=dt: torch.ops.baracuda.rms_norm_fused_backward(
                dy, dh, h, [n], rstd, w.detach(), 0.0, "torch", dt, [True, False, True]),
            peers=bwd_peers,
        ))
    return cases


def _thread_case():
    x, r = torch.randn(256, 1024).bfloat16(), torch.randn(256, 1024).bfloat16()
    weight = torch.randn(1024).bfloat16()
    dy, dh = torch.randn(256, 1024).bfloat16(), torch.randn(256, 1024).bfloat16()

    def run():
        y, h, rstd = torch.ops.baracuda.rms_norm_fused(x, r, [1024], weight, None, 0.0, "torch")
        grads = torch.ops.baracuda.rms_norm_fused_backward(dy, dh, h, [1024], rstd, weight, 0.0, "torch",
                                                           torch.bfloat16, [True, False, True])
        return [y, h, rstd, grads[0], grads[2]]

    return run


def cpu_thread_cases():
    return {"rms_norm_fused": _thread_case}
