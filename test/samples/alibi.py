"""alibi, alibi_inplace and alibi_backward samples for the battery (test/test_battery.py)."""

import torch

import baracuda_ops
from helpers import Export, SampleInput, only, random

ops = torch.ops.baracuda
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
VMAP = "a vmap layout; the other samples run the rest of the battery"
F64 = "float64 gradients; the float32 samples run the rest of the battery"
MASKS = ([True, True], [False, True], [True, False])


def slopes(h, dtype, device):
    """The paper's slopes, perturbed so that no two heads share a value."""
    if h == 0:
        return torch.empty(0, dtype=dtype, device=device)
    return (baracuda_ops.alibi_slopes(h, dtype=torch.float64, device=device) * (1 + 0.1 * torch.rand(h, device=device,
            dtype=torch.float64))).to(dtype)


def _reference(scores, slopes):
    """y = scores + slope[h]·(j − i) in float64."""
    q, k = scores.shape[-2:]
    rel = torch.arange(k, device=scores.device, dtype=scores.dtype) - torch.arange(q, device=scores.device,
                                                                                 dtype=scores.dtype)[:, None]
    return scores + slopes[:, None, None] * rel


def _twice(scores, slopes):
    y = baracuda_ops.alibi(scores * 2, slopes)
    z = y.sin()
    baracuda_ops.alibi_(z, slopes * 0.5)
    return z


def samples(device):
    f32, f64 = torch.float32, torch.float64
    for shape in ((2, 3, 4, 5), (1, 2, 1, 16), (0, 2, 3, 4), (2, 2, 3, 8)):
        name = "x".join(map(str, shape))
        full = shape == (2, 3, 4, 5)
        scores, s = random(shape, f32, device), slopes(shape[1], f32, device)
        yield SampleInput(name, ops.alibi.default, (scores, s), grad=(0, 1), reference=_reference,
                          skips={} if full else only(("opcheck", "reference", "determinism"), EXTRA_OPCHECK))
        # In place: the scores are written, so only the slopes may require grad.
        yield SampleInput(name, ops.alibi_inplace.default, (scores.clone(), s), grad=(1,),
                          skips=only(("opcheck",), "an in-place op of no outputs: the '_twice' samples run it "
                                     "after other ops through the public alibi_"))
        grad = random(shape, f32, device)
        for mask in MASKS:
            yield SampleInput(f"{name}_mask{''.join('1' if m else '0' for m in mask)}", ops.alibi_backward.default,
                              (grad, s, mask), grad=(0,),
                              skips={} if full and mask[0] and mask[1] else only(("opcheck", "determinism"), EXTRA_OPCHECK))
    scores, s = random((2, 3, 4, 8), f32, device), slopes(3, f32, device)
    yield SampleInput("out", ops.alibi.out, (scores, s), {"out": torch.empty_like(scores)})
    plan = baracuda_ops.AlibiBackwardPlan.select(baracuda_ops.AlibiBackwardDescriptor((2, 3, 4, 8), f32, device=device))
    yield SampleInput("out", ops.alibi_backward.out, (scores, s, [True, True]),
                      {"grad_scores": torch.empty_like(scores), "grad_slopes": torch.empty(3, device=device),
                       "workspace": torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)})

    # vmap: the samples join the batch; with a slope per sample, or a slope gradient per sample, the
    # heads. The forward is elementwise (the same bits); on CUDA the slope sums over a longer head
    # list may add in another order (within rounding there).
    for dtype in (f32, torch.bfloat16):
        tag = str(dtype)[6:]
        scores, shared, per_sample = random((3, 2, 4, 5, 6), dtype, device), random((4,), f32, device), random((3, 4), f32, device)
        yield SampleInput(f"vmap_{tag}", ops.alibi.default, (scores[0], shared), vmap=[(0, None)], batch=(scores, None),
                          skips=only(("vmap",), VMAP))
        yield SampleInput(f"vmap_{tag}_slopes_per_sample", ops.alibi.default, (scores[0], per_sample[0]),
                          vmap=[(0, 0), (None, 0), (3, 1)], batch=(scores, per_sample), skips=only(("vmap",), VMAP))
        for mask in MASKS:
            mtag = "".join("1" if m else "0" for m in mask)
            exact = "cpu" if mask[1] else "everywhere"
            yield SampleInput(f"vmap_{tag}_mask{mtag}", ops.alibi_backward.default, (scores[0], shared, mask),
                              vmap=[(0, None)], vmap_exact=exact, batch=(scores, None), skips=only(("vmap",), VMAP))
            yield SampleInput(f"vmap_{tag}_mask{mtag}_slopes_per_sample", ops.alibi_backward.default,
                              (scores[0], per_sample[0], mask), vmap=[(0, 0), (None, 0)], vmap_exact=exact,
                              batch=(scores, per_sample), skips=only(("vmap",), VMAP))

    # The public functions: float64 gradcheck (and gradgradcheck), torch.func per-sample gradients
    # over the slopes and over the scores; alibi then alibi_ compiled, exported and on the GPU.
    scores, s = random((2, 3, 4, 5), f64, device), slopes(3, f64, device)
    yield SampleInput("f64", ops.alibi.default, (scores, s), grad=(0, 1), fn=baracuda_ops.alibi, gradgrad=True,
                      skips=only(("gradcheck",), F64))
    yield SampleInput("f64", ops.alibi_inplace.default, (scores, s), grad=(0, 1),
                      fn=lambda x, w: baracuda_ops.alibi_(x * 1.0, w), skips=only(("gradcheck",), F64))
    yield SampleInput("f64", ops.alibi_backward.default, (random((2, 3, 4, 5), f64, device), s, [True, True]), grad=(0,),
                      fn=lambda g, w: ops.alibi_backward(g, w, [True, True]), skips=only(("gradcheck",), F64))
    yield SampleInput("f64_per_sample_slopes", ops.alibi.default, (scores, random((3,), f64, device)), grad=(1,),
                      fn=lambda x, w: baracuda_ops.alibi(x, w), skips=only(("torch_func",), F64))
    yield SampleInput("f64_per_sample_scores", ops.alibi.default, (scores[0], random((3,), f64, device)), grad=(0,),
                      fn=lambda x, w: baracuda_ops.alibi(x[None], w)[0], skips=only(("torch_func",), F64))
    for shape in ((2, 3, 4, 8), (1, 4, 5, 7)):
        yield SampleInput(f"twice_{'x'.join(map(str, shape))}", ops.alibi_inplace.default,
                          (random(shape, f32, device), slopes(shape[1], f32, device)), grad=(0, 1), fn=_twice,
                          skips=only(("compile", "determinism") if shape[0] == 2 else ("compile",),
                                     "alibi then alibi_ through the public functions; the raw-op samples run the rest"))
    batch, q, k = torch.export.Dim("batch"), torch.export.Dim("q"), torch.export.Dim("k")
    s = slopes(3, f32, device)
    yield SampleInput("export", ops.alibi_inplace.default, (random((2, 3, 4, 8), f32, device), s), grad=(0, 1), fn=_twice,
                      export=Export([{0: batch, 2: q, 3: k}, {}], [[random((5, 3, 1, 7), f32, device), s]],
                                    ["alibi", "alibi_inplace"]),
                      skips=only(("export",), "an export of alibi then alibi_; the other samples run the rest"))
    for shape in ((64, 16, 1, 4096), (2, 8, 512, 512)):  # decode, large
        for dtype in (f32, torch.bfloat16):
            yield SampleInput(f"gpu_{'x'.join(map(str, shape))}_{str(dtype)[6:]}", ops.alibi_inplace.default,
                              lambda s=shape, d=dtype: (random(s, d, device), slopes(s[1], f32, device)), grad=(0, 1),
                              fn=_twice)
