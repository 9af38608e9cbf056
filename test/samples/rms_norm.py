"""rms_norm and rms_norm_backward samples for the battery (test/test_battery.py)."""

import torch

import baracuda_ops
from helpers import Export, SampleInput, only, random

ops = torch.ops.baracuda
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
VMAP = "a vmap layout; the other samples run the rest of the battery"
GPU = "a GPU-sized problem; the small samples run the rest of the battery"


def _reference(x, ns, w, eps):
    """float64 (y, rstd) from plain ops; eps default = finfo(float32).eps (the computation type of
    the float32 and half samples)."""
    dims = tuple(range(x.dim() - len(ns), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + (torch.finfo(torch.float32).eps if eps is None else eps))
    return (x * rstd if w is None else x * rstd * w), rstd


def samples(device):
    f32, f64 = torch.float32, torch.float64
    # The forward: a row, two normalized dims without a weight, a row of a CTA, zero rows, bf16 with
    # a float32 weight; each with its backward (every output mask).
    for name, shape, ns, xdt, wdt, eps, mask in (("row", (3, 8), (8,), f32, f32, None, [True, True]),
                                                ("2d_no_weight", (2, 3, 4), (3, 4), f32, None, None, [True, True]),
                                                ("cta_row", (5, 1024), (1024,), f32, f32, None, [True, False]),
                                                ("zero_rows", (0, 6), (6,), f32, f32, None, [False, True]),
                                                ("bf16_f32_weight", (4, 16), (16,), torch.bfloat16, f32, 1e-5, None)):
        x = random(shape, xdt, device)
        w = random(ns, wdt, device) if wdt is not None else None
        full = name == "row"
        grad = (0,) if w is None else (0, 2)
        yield SampleInput(name, ops.rms_norm.default, (x, list(ns), w, eps), grad=grad,
                          reference=lambda x, *w, ns=ns, eps=eps: _reference(x, ns, w[0] if w else None, eps),
                          ref_scale=2,
                          skips={} if full else only(("opcheck", "reference", "determinism"), EXTRA_OPCHECK))
        if mask is not None:
            _, rstd = ops.rms_norm(x, list(ns), w, None)
            yield SampleInput(name, ops.rms_norm_backward.default, (random(shape, xdt, device), x, list(ns), rstd, w, mask),
                              skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
    x, w, g = random((3, 8), f32, device), random((8,), f32, device), random((3, 8), f32, device)
    yield SampleInput("out", ops.rms_norm.out, (x, [8], w, None),
                      {"output": torch.empty(3, 8, device=device), "rstd": torch.empty(3, 1, device=device)})
    _, rstd = ops.rms_norm(x, [8], w, None)
    plan = baracuda_ops.RMSNormBackwardPlan.select(baracuda_ops.RMSNormBackwardDescriptor((3, 8), (8,), f32,
                                                                                          device=device))
    yield SampleInput("out", ops.rms_norm_backward.out, (g, x, [8], rstd, w, [True, True]),
                      {"grad_input": torch.empty(3, 8, device=device), "grad_weight": torch.empty(8, device=device),
                       "workspace": torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)})

    # vmap: the samples join the rows (one call; on CUDA the larger launch may sum a row in another
    # order, so within rounding there); a weight per sample runs per sample (bit for bit).
    for xdt, wdt in ((f32, f32), (torch.bfloat16, f32), (f64, f64)):
        tag = f"{str(xdt)[6:]}_{str(wdt)[6:]}"
        x, w = random((5, 8), xdt, device), random((8,), wdt, device)
        yield SampleInput(f"vmap_{tag}", ops.rms_norm.default, (x, [8], w, None), vmap=[(0, None), (1, None)],
                          vmap_exact="cpu", skips=only(("vmap",), VMAP))
        yield SampleInput(f"vmap_{tag}_weight_per_sample", ops.rms_norm.default, (x, [8], w, None),
                          vmap=[(0, 0), (None, 0)], skips=only(("vmap",), VMAP))
        _, rstd = ops.rms_norm(x, [8], w, None)
        dy = random(x.shape, xdt, device)
        for mask in ([True, True], [True, False], [False, True]):
            mtag = "".join("1" if m else "0" for m in mask)
            # dW per sample is summed by torch ops, not the op's kernel: within rounding
            yield SampleInput(f"vmap_{tag}_mask{mtag}", ops.rms_norm_backward.default, (dy, x, [8], rstd, w, mask),
                              vmap=[(0, 0, 0, None), (0, None, None, None)],
                              vmap_exact="nowhere" if mask[1] else "cpu", skips=only(("vmap",), VMAP))
            yield SampleInput(f"vmap_{tag}_mask{mtag}_weight_per_sample", ops.rms_norm_backward.default,
                              (dy, x, [8], rstd, w, mask), vmap=[(0, 0, 0, 0)], skips=only(("vmap",), VMAP))
        yield SampleInput(f"vmap_{tag}_no_weight", ops.rms_norm_backward.default,
                          (dy, x, [8], rstd, None, [True, True]), vmap=[(0, 0, 0)], vmap_exact="cpu",
                          skips=only(("vmap",), VMAP))
    yield SampleInput("vmap_2d_no_weight", ops.rms_norm.default, (random((3, 4, 8), f32, device), [4, 8], None, 1e-3),
                      vmap=[(1,)], vmap_exact="cpu", skips=only(("vmap",), VMAP))

    # The public function: float64 gradcheck and torch.func, export with the backward op.
    x, w = random((4, 3, 5), f64, device), random((3, 5), f64, device)
    yield SampleInput("f64_2d", ops.rms_norm.default, (x, [3, 5], w, None), grad=(0, 2),
                      fn=lambda x, w: baracuda_ops.rms_norm(x, (3, 5), w),
                      skips=only(("gradcheck", "torch_func"), "float64 gradients; the float32 samples run the rest"))
    yield SampleInput("f64_no_weight", ops.rms_norm.default, (x, [5], None, 1e-3), grad=(0,),
                      fn=lambda x: baracuda_ops.rms_norm(x, 5, None, eps=1e-3),
                      skips=only(("gradcheck",), "float64 gradients; the float32 samples run the rest"))
    yield SampleInput("public_no_weight", ops.rms_norm.default, (random((5, 8), f32, device), [8], None, None), grad=(0,),
                      fn=lambda x: baracuda_ops.rms_norm(x, 8),
                      skips=only(("torch_func", "compile"), "the public function; the raw-op samples run the rest"))

    def both(x, w, g):
        y, rstd = ops.rms_norm(x, [32], w, None)
        dx, dw = ops.rms_norm_backward(g, x, [32], rstd, w, [True, True])
        return baracuda_ops.rms_norm(x, [32], w, eps=1e-3), y, dx.detach(), dw.detach()  # no double backward

    rows = torch.export.Dim("rows")
    w = random((32,), f32, device)
    yield SampleInput("export", ops.rms_norm.default, (random((2, 3, 32), f32, device), w, random((2, 3, 32), f32, device)),
                      grad=(0, 1), fn=both,
                      export=Export([{1: rows}, {}, {1: rows}],
                                    [[random((2, 9, 32), f32, device), w, random((2, 9, 32), f32, device)]],
                                    ["rms_norm", "rms_norm_backward"]),
                      skips=only(("export",), "an export of both ops; the other samples run the rest"))

    # CUDA graphs and a second GPU: decode rows, rows of a CTA, cluster rows (and two passes).
    for shape in ((8, 4096), (300, 1024), (64, 65536), (2, 2**20)):
        for xdt, wdt in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, f32), (f32, f32)):
            parts = ("second_gpu",) if shape == (2, 2**20) else ("cuda_graph", "second_gpu")
            yield SampleInput(f"gpu_{shape[0]}x{shape[1]}_{str(xdt)[6:]}_{str(wdt)[6:]}", ops.rms_norm.default,
                              lambda s=shape, x=xdt, w=wdt: (random(s, x, device), [s[1]], random(s[1:], w, device),
                                                             None), grad=(0, 2),
                              fn=lambda x, w, n=shape[1]: baracuda_ops.rms_norm(x, (n,), w), skips=only(parts, GPU))
