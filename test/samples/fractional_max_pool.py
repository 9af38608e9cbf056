"""fractional_max_pool2d / 3d and their backward samples for the battery (test/test_battery.py)."""

import torch
import torch.nn.functional as F

import baracuda_ops
from helpers import Export, SampleInput, only, random

ops = torch.ops.baracuda
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
VMAP = "a vmap layout; the other samples run the rest of the battery"


def _samples(x, dims):
    """Random samples in [0, 1) for x's planes: [N, C, dims] (N = 1 for an unbatched input)."""
    n = 1 if x.dim() == dims + 1 else x.shape[0]
    return torch.rand(n, x.shape[-dims - 1], dims, device=x.device).to(x.dtype)


def _torch_pool(dims, x, k, out, s):
    """PyTorch's fractional_max_pool on the float32 values (the window starts depend on the
    samples' dtype): the values and indices bit for bit."""
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    y, i = pool(x.float(), k, output_size=out, _random_samples=s.float(), return_indices=True)
    return y.double(), i


def _pool_both(s2, s3):
    def fn(x, v):
        a = baracuda_ops.fractional_max_pool2d(x, 3, output_size=(5, 4), _random_samples=s2)
        b = baracuda_ops.fractional_max_pool3d(v, 2, output_size=(2, 3, 3), _random_samples=s3)
        return a, b

    return fn


def _gpu_pooling(dtype, device, n=4, c=16):
    """A 2d and a 3d input (their windows overlap in part) and their samples."""
    return (random((n, c, 40, 36), dtype, device), random((n, c, 9, 10, 11), dtype, device),
            torch.rand(n, c, 2, device=device, dtype=dtype), torch.rand(n, c, 3, device=device, dtype=dtype))


def samples(device):
    f32, f64 = torch.float32, torch.float64
    for dims in (2, 3):
        fw, bw = getattr(ops, f"fractional_max_pool{dims}d"), getattr(ops, f"fractional_max_pool{dims}d_backward")
        problems = ([((2, 3, 10, 9), [3, 2], [6, 7]), ((3, 7, 7), [2, 2], [6, 6])] if dims == 2
                    else [((2, 2, 6, 7, 5), [2, 3, 2], [4, 4, 3]), ((3, 5, 4, 6), [1, 2, 2], [4, 3, 5])])
        for (shape, k, out), name in zip(problems, ("batched", "unbatched")):
            x = random(shape, f32, device)
            s = _samples(x, dims)
            full = name == "batched"
            yield SampleInput(name, fw.default, (x, k, out, s), grad=(0,),
                              reference=lambda x, s, dims=dims, k=k, out=out: _torch_pool(dims, x, k, out, s),
                              skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
            _, i = fw(x, k, out, s)
            g = random(i.shape, f32, device)
            yield SampleInput(name, bw.default, (g, x, k, out, i), grad=(0,),
                              skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
            if full:
                y_out, i_out = torch.empty_like(g), torch.empty_like(i)
                yield SampleInput("out", fw.out, (x, k, out, s), {"output": y_out, "indices": i_out})
                desc = getattr(baracuda_ops, f"FractionalMaxPool{dims}dDescriptor")(shape, tuple(k), tuple(out), f32,
                                                                                  device)
                plan = getattr(baracuda_ops, f"FractionalMaxPool{dims}dBackwardPlan").select(desc)
                yield SampleInput("out", bw.out, (g, x, k, out, i),
                                  {"grad_input": torch.empty(shape, device=device),
                                   "workspace": torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)})

        # vmap: the samples join the batch of planes (one call, the same bits), the random samples
        # with them (each sample's first N rows), for the forward and the backward.
        for planes in ((2, 3), (3,)):
            tag = f"{dims}d_{'batched' if len(planes) == 2 else 'unbatched'}"
            k, out = [2] * dims, [5] * dims
            xs = random((4, *planes) + (9,) * dims, f32, device)
            shared = torch.rand(planes[0] if len(planes) == 2 else 1, 3, dims, device=device)
            per_sample = torch.rand(4, shared.shape[0] + 1, 3, dims, device=device)
            yield SampleInput(f"vmap_{tag}", fw.default, (xs[0], k, out, shared), vmap=[(0, None)], batch=(xs, None),
                              skips=only(("vmap",), VMAP))
            yield SampleInput(f"vmap_{tag}_samples_per_sample", fw.default, (xs[0], k, out, per_sample[0]),
                              vmap=[(0, 0), (None, 0), (1, 2)], batch=(xs, per_sample), skips=only(("vmap",), VMAP))
            _, indices = torch.func.vmap(lambda x, s: fw(x, k, out, s))(xs, per_sample)
            grad = random(indices.shape, f32, device)
            yield SampleInput(f"vmap_{tag}", bw.default, (grad[0], xs[0], k, out, indices[0]),
                              vmap=[(0, 0, 0), (0, None, 0), (0, None, None)], batch=(grad, xs, indices),
                              skips=only(("vmap",), VMAP))

        # torch.func, twice (the backward's backward is a gather): vjp of grad as well.
        pool = getattr(baracuda_ops, f"fractional_max_pool{dims}d")
        x = random((3,) + (7,) * dims, f64, device)
        s = torch.rand(1, 3, dims, dtype=f64, device=device)
        yield SampleInput(f"f64_{dims}d", fw.default, (x, [2] * dims, [4] * dims, s), grad=(0,),
                          fn=lambda x, s, p=pool: p(x, 2, output_size=4, _random_samples=s),
                          skips=only(("torch_func",), "float64 gradients; the float32 samples run the rest"))
        yield SampleInput(f"f64_{dims}d_grad_of_grad", fw.default, (x, [2] * dims, [4] * dims, s), grad=(0,),
                          fn=lambda x, s, p=pool: torch.func.grad(
                              lambda y: p(y, 2, output_size=4, _random_samples=s).pow(3).sum())(x),
                          skips=only(("torch_func",), "float64 gradients; the float32 samples run the rest"))
    x2 = random((2, 2, 9, 8), f64, device)
    yield SampleInput("f64_gradcheck", ops.fractional_max_pool2d.default, (x2, [3, 2], [5, 6], _samples(x2, 2)), grad=(0,),
                      fn=lambda t, s: baracuda_ops.fractional_max_pool2d(t, (3, 2), (5, 6), _random_samples=s),
                      gradgrad=True, skips=only(("gradcheck",), "float64 gradients; the float32 samples run the rest"))
    x3 = random((2, 5, 6, 7), f64, device)
    yield SampleInput("f64_gradcheck", ops.fractional_max_pool3d.default, (x3, [2] * 3, [3, 4, 5], _samples(x3, 3)),
                      grad=(0,), fn=lambda t, s: baracuda_ops.fractional_max_pool3d(t, 2, (3, 4, 5), _random_samples=s),
                      skips=only(("gradcheck",), "float64 gradients; the float32 samples run the rest"))

    # Both pools through the public functions: compiled at two sizes, exported.
    pool = _pool_both(torch.rand(2, 3, 2, device=device), torch.rand(2, 3, 3, device=device))

    def around(x, v):
        a, b = pool(x * 2, v)
        return a.sin(), b * 3

    for name, shapes in (("public", ((2, 3, 9, 8), (2, 3, 5, 6, 4))), ("public_larger", ((2, 3, 11, 7), (2, 3, 6, 5, 5)))):
        yield SampleInput(name, ops.fractional_max_pool2d.default, tuple(random(s, f32, device) for s in shapes),
                          grad=(0, 1), fn=around,
                          skips=only(("compile", "determinism"), "both pools through the public functions; the "
                                     "raw-op samples run the rest"))
    h, w, t, d = (torch.export.Dim(name, min=low) for name, low in (("h", 7), ("w", 6), ("t", 3), ("d", 4)))
    yield SampleInput("export", ops.fractional_max_pool2d.default,
                      (random((2, 3, 9, 8), f32, device), random((2, 3, 5, 6, 4), f32, device)), grad=(0, 1), fn=pool,
                      export=Export([{2: h, 3: w}, {2: t, 4: d}],
                                    [[random((2, 3, 11, 7), f32, device), random((2, 3, 6, 6, 6), f32, device)]],
                                    ["fractional_max_pool2d", "fractional_max_pool3d"]),
                      skips=only(("export",), "an export of both pools; the other samples run the rest"))
    for dtype in (f32, torch.bfloat16):
        yield SampleInput(f"gpu_{str(dtype)[6:]}", ops.fractional_max_pool2d.default,
                          lambda d=dtype: _gpu_pooling(d, device), grad=(0, 1),
                          fn=lambda x, v, s2, s3: _pool_both(s2, s3)(x, v))
