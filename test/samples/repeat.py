"""repeat and repeat_backward samples for the battery (test/test_battery.py)."""

import torch

import baracuda_ops
from helpers import Export, SampleInput, only, random

ops = torch.ops.baracuda
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
OUT = "an out= overload: opcheck runs it, its functional overload's samples the rest"


def samples(device):
    f32 = torch.float32
    # (input shape, repeats) that opcheck also runs with grad: extra leading dims, a 1-D input,
    # zero repeats, a 2-D tiling
    for name, shape, repeats in (("extra_dim", (3, 4), (2, 1, 3)), ("1d", (5,), (4,)), ("zero_repeats", (2, 3), (0, 2)),
                                 ("tiles", (4, 16), (2, 3))):
        x = random(shape, f32, device)
        full = name == "extra_dim"
        yield SampleInput(name, ops.repeat.default, (x, list(repeats)), grad=(0,),
                          reference=lambda x, r=repeats: x.repeat(*r), vmap=[(0,), (len(shape),)] if full else (),
                          skips={} if full else only(("opcheck", "reference", "determinism"), EXTRA_OPCHECK))
        g = random(x.repeat(*repeats).shape, f32, device)
        yield SampleInput(name, ops.repeat_backward.default, (g, list(repeats), list(shape)),
                          vmap=[(0,), (-1,)] if full else (),
                          skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
    for dtype in (torch.bfloat16, torch.float32):
        x = random((4, 5), dtype, device)
        for repeats in ([2, 3], [2, 1, 3], [1, 2, 2, 1]):
            name = f"{str(dtype)[6:]}_{'x'.join(map(str, repeats))}"
            yield SampleInput(name, ops.repeat.default, (x, repeats), grad=(0,), vmap=[(0,), (2,)],
                              skips=only(("vmap", "determinism"), "a vmap layout; 'extra_dim' runs the rest"))
            g = random(x.repeat(*repeats).shape, dtype, device)
            yield SampleInput(name, ops.repeat_backward.default, (g, repeats, [4, 5]), vmap=[(0,), (-1,)],
                              skips=only(("vmap", "determinism"), "a vmap layout; 'extra_dim' runs the rest"))
    x = random((3, 4), f32, device)
    yield SampleInput("out", ops.repeat.out, (x, [2, 3]), {"out": torch.empty(6, 12, device=device)})
    yield SampleInput("out", ops.repeat_backward.out, (random((6, 12), f32, device), [2, 3], [3, 4]),
                      {"grad_input": torch.empty(3, 4, device=device),
                       "workspace": torch.empty(0, dtype=torch.uint8, device=device)})

    # The public function: compiled, exported and transformed by torch.func; in float64 gradcheck
    # and gradgradcheck (repeat's backward is repeat_backward, whose backward is repeat).
    def around(x):
        return baracuda_ops.repeat(x * 2, (3, 1, 2)).sin()

    yield SampleInput("public", ops.repeat.default, (random((4, 6), f32, device),), grad=(0,), fn=around,
                      skips=only(("compile", "determinism", "cuda_graph"), "the raw-op samples run the rest"))
    yield SampleInput("public_5x3", ops.repeat.default, (random((5, 3), f32, device),), grad=(0,), fn=around,
                      skips=only(("compile",), "a second shape under the same compiled function"))
    rows = torch.export.Dim("rows")

    def both(x, g):
        return baracuda_ops.repeat(x, (3, 1, 2)), ops.repeat_backward(g, [3, 1, 2], x.shape)

    yield SampleInput("export", ops.repeat.default, (random((4, 6), f32, device), random((3, 4, 12), f32, device)),
                      grad=(0, 1), fn=both,
                      export=Export([{0: rows}, {1: rows}], [[random((7, 6), f32, device), random((3, 7, 12), f32, device)]],
                                    ["repeat", "repeat_backward"]),
                      skips=only(("export",), "an export of both ops; the other samples run the rest"))
    f64 = torch.float64
    yield SampleInput("f64", ops.repeat.default, (random((3, 1, 4), f64, device),), grad=(0,),
                      fn=lambda x: baracuda_ops.repeat(x, (2, 1, 3, 2)), gradgrad=True,
                      skips=only(("gradcheck", "torch_func"), "float64 gradients; the float32 samples run the rest"))
    yield SampleInput("f64_grad_of_grad", ops.repeat.default, (random((4, 5), f64, device),), grad=(0,),
                      fn=lambda x: torch.func.grad(lambda y: (baracuda_ops.repeat(y, (2, 3)) ** 3).sum())(x),
                      skips=only(("torch_func",), "torch.func through repeat's backward; 'f64' runs the rest"))
    for dtype in (torch.float32, torch.bfloat16):
        for shape, repeats in (((64, 48), (2, 3, 1)), ((4096, 256), (8, 1)), ((512,), (4096, 1))):
            parts = ("cuda_graph", "second_gpu") if shape == (64, 48) else ("second_gpu",)
            yield SampleInput(f"gpu_{'x'.join(map(str, shape))}_{str(dtype)[6:]}", ops.repeat.default,
                              lambda s=shape, d=dtype, r=repeats: (random(s, d, device), list(r)), grad=(0,),
                              fn=lambda x, r=repeats: baracuda_ops.repeat(x, r),
                              skips=only(parts, "a GPU-sized layout; the small samples run the rest"))
