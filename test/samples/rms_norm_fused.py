"""rms_norm_fused, rms_norm_fused_backward and rms_norm_quant samples for the battery
(test/test_battery.py)."""

import torch

import baracuda_ops
from helpers import OPCHECK_UTILS, Export, SampleInput, only, random

ops = torch.ops.baracuda
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
VMAP = "a vmap layout; the other samples run the rest of the battery"
F64 = "float64 gradients; the float32 samples run the rest of the battery"


def _one_output(out):
    return out[0] + out[1].cos() if isinstance(out, tuple) else out


def _reference(x, r, w):
    """float64 (y, h, rstd) of the residual sample: h = x + r, y = h·rstd·w over the last dim."""
    h = x + r
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)
    return h * rstd * w, h, rstd


def samples(device):
    f32, f64 = torch.float32, torch.float64
    x, r = random((3, 4, 8), f32, device), random((3, 4, 8), f32, device)
    w, wh = random((8,), f32, device), random((4, 8), f32, device)
    xb, rf = random((3, 4, 8), torch.bfloat16, device), random((3, 4, 8), f32, device)
    # Residual or not, per head, each casting; each with its backward (three output masks).
    for name, args, grad in (("residual", (x, r, [8], w, None, 0.0, "torch"), (0, 1, 3)),
                             ("per_head_gemma", (x, None, [8], wh, 1e-5, 1.0, "gemma"), (0, 3)),
                             ("2d_no_weight", (x, r, [4, 8], None, None, 0.0, "torch"), (0, 1)),
                             ("bf16_llama", (xb, rf, [8], w, None, 0.0, "llama"), (0, 1, 3))):
        full = name == "residual"
        yield SampleInput(name, ops.rms_norm_fused.default, args, grad=grad, compile_exact=True,
                          reference=_reference if full else None, ref_scale=2,
                          skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
        x_, r_, ns, w_, _, offset, casting = args
        y, h, rstd = ops.rms_norm_fused(*args)
        hh = h if r_ is not None else x_
        g = random(y.shape, y.dtype, device)
        gh = random(hh.shape, hh.dtype, device) if r_ is not None else None
        for mask in ([True, True, True], [True, False, False], [False, True, True]):
            yield SampleInput(f"{name}_mask{''.join('1' if m else '0' for m in mask)}",
                              ops.rms_norm_fused_backward.default,
                              (g, gh, hh, ns, rstd, w_, offset, casting, x_.dtype, mask), compile_exact=True,
                              skips={} if full and all(mask) else only(("opcheck", "determinism"), EXTRA_OPCHECK))
    x, r, w, g = (random(s, f32, device) for s in ((3, 8), (3, 8), (8,), (3, 8)))
    y, h, rstd = (torch.empty(3, 8, device=device), torch.empty(3, 8, device=device), torch.empty(3, 1, device=device))
    yield SampleInput("out", ops.rms_norm_fused.out, (x, r, [8], w, None, 1.0, "gemma"),
                      {"output": y, "residual_out": h, "rstd": rstd})
    _, h, rstd = ops.rms_norm_fused(x, r, [8], w, None, 1.0, "gemma")
    yield SampleInput("out", ops.rms_norm_fused_backward.out,
                      (g, g, h, [8], rstd, w, 1.0, "gemma", f32, [True, True, True]),
                      {"grad_input": torch.empty(3, 8, device=device), "grad_residual": torch.empty(3, 8, device=device),
                       "grad_weight": torch.empty(8, device=device),
                       "workspace": torch.empty(1 << 16, dtype=torch.uint8, device=device)})

    # vmap: the samples join the rows (on CUDA the larger launch may sum in another order);
    # a weight per sample runs per sample (bit for bit).
    x, r = random((5, 2, 8), f32, device), random((5, 2, 8), f32, device)
    w, wh = random((8,), f32, device), random((2, 8), f32, device)
    yield SampleInput("vmap", ops.rms_norm_fused.default, (x, r, [8], w, None, 0.5, "torch"),
                      vmap=[(0, 0, None), (0, None, None), (None, 0, None)], vmap_exact="cpu",
                      skips=only(("vmap",), VMAP))
    yield SampleInput("vmap_per_head", ops.rms_norm_fused.default, (x, r, [8], wh, None, 0.5, "torch"),
                      vmap=[(0, None, None)], vmap_exact="cpu", skips=only(("vmap",), VMAP))
    yield SampleInput("vmap_llama", ops.rms_norm_fused.default, (x, None, [8], wh, None, 0.5, "llama"),
                      vmap=[(1, None)], vmap_exact="cpu", skips=only(("vmap",), VMAP))
    yield SampleInput("vmap_weight_per_sample", ops.rms_norm_fused.default, (x, r, [8], w, None, 0.5, "torch"),
                      vmap=[(0, 0, 0)], skips=only(("vmap",), VMAP))
    _, h, rstd = ops.rms_norm_fused(x, r, [8], wh, None, 0.5, "llama")
    g, gh = random(x.shape, f32, device), random(x.shape, f32, device)
    for mask in ([True, True, True], [True, False, False], [False, False, True]):
        mtag = "".join("1" if m else "0" for m in mask)
        args = (g, gh, h, [8], rstd, wh, 0.5, "llama", f32, mask)
        # dW per sample is summed by torch ops, not the op's kernel: within rounding
        yield SampleInput(f"vmap_mask{mtag}", ops.rms_norm_fused_backward.default, args,
                          vmap=[(0, 0, 0, 0, None)], vmap_exact="nowhere" if mask[2] else "cpu",
                          skips=only(("vmap",), VMAP))
        yield SampleInput(f"vmap_mask{mtag}_weight_per_sample", ops.rms_norm_fused_backward.default, args,
                          vmap=[(0, 0, 0, 0, 0)], skips=only(("vmap",), VMAP))

    # The public function: float64 gradcheck, compile and export.
    x, r = random((3, 2, 6), f64, device), random((3, 2, 6), f64, device)
    w, wh = random((6,), f64, device), random((2, 6), f64, device)
    for name, args, grad, fn in (
            ("f64_residual", (x, r, [6], w, None, 0.0, "torch"), (0, 1, 3),
             lambda x, r, w: baracuda_ops.rms_norm_fused(x, 6, w, residual=r)),
            ("f64_gemma", (x, r, [6], w, None, 1.0, "gemma"), (0, 1, 3),
             lambda x, r, w: baracuda_ops.rms_norm_fused(x, 6, w, residual=r, weight_offset=1.0, casting="gemma")),
            ("f64_llama_per_head", (x, None, [6], wh, None, 0.0, "llama"), (0, 3),
             lambda x, w: baracuda_ops.rms_norm_fused(x, 6, w, casting="llama")),
            ("f64_2d", (x, None, [2, 6], wh, 1e-3, 0.0, "torch"), (0, 3),
             lambda x, w: baracuda_ops.rms_norm_fused(x, (2, 6), w, 1e-3)),
            ("f64_residual_no_weight", (x, r, [6], None, None, 0.0, "torch"), (0, 1),
             lambda x, r: baracuda_ops.rms_norm_fused(x, 6, residual=r))):
        yield SampleInput(name, ops.rms_norm_fused.default, args, grad=grad, fn=fn, skips=only(("gradcheck",), F64))
        # torch.func (grad, vjp, per-sample grads, jacfwd, forward AD) on one output: y, and h through cos
        yield SampleInput(f"{name}_one_output", ops.rms_norm_fused.default, args, grad=grad,
                          fn=lambda *a, f=fn: _one_output(f(*a)),
                          skips=only(("torch_func",), "torch.func on float64; the float32 samples run the rest"))

    def two_calls(x, r, w, wh):
        y, h = baracuda_ops.rms_norm_fused(x, 16, w, residual=r, weight_offset=1.0)
        q = baracuda_ops.rms_norm_fused(h.view(*h.shape[:-1], 2, 8), 8, wh, casting="llama")
        return y, h, q

    x, r, w16, wh = (random(s, f32, device) for s in ((3, 5, 16), (3, 5, 16), (16,), (2, 8)))
    yield SampleInput("public_two_calls", ops.rms_norm_fused.default, (x, r, [16], w16, None, 1.0, "torch", wh),
                      grad=(0, 1, 3, 7), fn=two_calls, compile_exact=True,
                      skips=only(("compile", "determinism", "cuda_graph", "second_gpu"),
                                 "the public function twice; the raw-op samples run the rest"))
    rows = torch.export.Dim("rows")
    w = random((32,), f32, device)
    yield SampleInput("export", ops.rms_norm_fused.default,
                      (random((2, 3, 32), f32, device), random((2, 3, 32), f32, device), [32], w, None, 1.0, "gemma"),
                      grad=(0, 1, 3),
                      fn=lambda x, r, w: baracuda_ops.rms_norm_fused(x, 32, w, residual=r, weight_offset=1.0,
                                                                     casting="gemma"),
                      export=Export([{1: rows}, {1: rows}, {}],
                                    [[random((2, 9, 32), f32, device), random((2, 9, 32), f32, device), w]]),
                      skips=only(("export",), "an export of the public function; the other samples run the rest"))

    # rms_norm_quant: a static scale with a residual, a scale per row without.
    x, r = random((3, 4, 8), f32, device), random((3, 4, 8), f32, device)
    w, static = random((4, 8), f32, device), torch.tensor([0.05], device=device)

    def exact_bits(x, r, w):
        q, scale, h = baracuda_ops.rms_norm_quant(x, 8, w, residual=r)
        return q.view(torch.uint8), scale, h

    def per_sample(x, r, w):
        q, h, scale = ops.rms_norm_quant(x, r, [8], w, None, 0.0, "torch", None)
        return q.float(), h, scale  # exact; vmap has no rule for view(dtype) before PyTorch 2.14

    yield SampleInput("static_scale", ops.rms_norm_quant.default, (x, r, [8], w, None, 0.0, "torch", static),
                      skips=only(("opcheck", "determinism"), EXTRA_OPCHECK))
    yield SampleInput("row_scale", ops.rms_norm_quant.default, (x, None, [8], w, 1e-5, 1.0, "gemma", None),
                      skips=dict.fromkeys(("compile", "cuda_graph", "second_gpu"), "float8 outputs (no allclose "
                                          "kernel): the 'public' sample runs it on their bytes"))
    yield SampleInput("public", ops.rms_norm_quant.default, (x, r, [8], w, None, 0.0, "torch", None), fn=exact_bits,
                      compile_exact=True, skips=only(("compile", "cuda_graph", "second_gpu"),
                                                     "the public function; the raw-op samples run the rest"))
    yield SampleInput("vmap", ops.rms_norm_quant.default, (x, r, [8], w, None, 0.0, "torch", None), fn=per_sample,
                      vmap=[(0, 0, None)], skips=only(("vmap",), VMAP))
    out = {"output": torch.empty(3, 4, 8, dtype=torch.float8_e4m3fn, device=device),
           "residual_out": torch.empty(3, 4, 8, device=device), "scale_out": torch.empty(3, 4, 1, device=device)}
    # test_schema compares a mutated argument before and after with torch.allclose, which has no
    # float8 kernel: the out-variant runs the other three utils
    yield SampleInput("out", ops.rms_norm_quant.out, (x, r, [8], w, None, 0.0, "llama", None), out,
                      opcheck_utils=OPCHECK_UTILS[1:])
