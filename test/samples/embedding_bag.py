"""embedding_bag, embedding_bag_backward and embedding_bag_per_sample_weights_backward samples for
the battery (test/test_battery.py)."""

import torch
import torch.nn.functional as F

import baracuda_ops
from baracuda_ops.bench.embedding_bag import zipf_indices
from helpers import Export, SampleInput, only

ops = torch.ops.baracuda
MODES = ("sum", "mean", "max")
EXTRA_OPCHECK = "an extra opcheck layout; the other samples run the rest of the battery"
VMAP = "a vmap layout; the other samples run the rest of the battery"


def make_bags(device, index_dtype=torch.int64, num_weights=25):
    """40 indices in 7 bags: an empty bag in the middle and at the end, a bag of one, a long bag."""
    idx = torch.randint(0, num_weights, (40,), device=device, dtype=index_dtype)
    return idx, torch.tensor([0, 5, 5, 6, 20, 33, 40], device=device, dtype=index_dtype)


def _op_samples(device):
    """(name, args) of baracuda::embedding_bag: every mode, 1-D and 2-D indices, int32, padding, psw."""
    idx, off = make_bags(device)
    w, psw = torch.randn(25, 8, device=device), torch.randn(40, device=device)
    return [("sum", (w, idx, off, 0, None, False, -1)),
            ("mean_int32_padding", (w, idx.int(), off.int(), 1, None, False, 3)),
            ("max", (w, idx, off, 2, None, False, -1)),
            ("sum_psw_last_offset", (w, idx, off, 0, psw, True, 5)),
            ("max_2d", (w, idx.view(5, 8), None, 2, None, False, 1)),
            ("sum_2d_psw", (w, idx.view(5, 8), None, 0, psw.view(5, 8), False, -1))]


def _gpu_bags(mode, num_weights, dim, device):
    """4000 Zipf indices with 60% on one row in 300 bags (some empty), per-sample weights."""
    idx = zipf_indices(4000, num_weights, 1.05, device)
    idx = torch.where(torch.rand(4000, device=device) < 0.6, torch.full_like(idx, 7), idx)
    off = torch.sort(torch.randint(0, 4000, (300,), device=device)).values
    off[0] = 0
    return (torch.randn(num_weights, dim, device=device), torch.randn(4000, device=device), idx, off)


def samples(device):
    for name, args in _op_samples(device):
        w, idx, off, mode, psw, ilo, pad = args
        full = name == "sum_psw_last_offset"
        yield SampleInput(name, ops.embedding_bag.default, args, grad=(0,) if psw is None else (0, 4),
                          skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
        # The output alone, for calls that want no gradient (the CPU kernel writes no offset2bag).
        yield SampleInput(name, ops.embedding_bag_forward_only.default, args)
        out, o2b, bag_size, max_positions = ops.embedding_bag(*args)
        yield SampleInput(name, ops.embedding_bag.out, args,
                          dict(output=torch.empty_like(out), offset2bag=torch.empty_like(o2b),
                               bag_size=torch.empty_like(bag_size), max_positions=torch.empty_like(max_positions)))
        grad = torch.randn_like(out)
        bargs = (grad, idx, o2b, bag_size, max_positions, w.shape[0], mode, psw, pad)
        yield SampleInput(name, ops.embedding_bag_backward.default, bargs,
                          skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
        plan = baracuda_ops.EmbeddingBagBackwardPlan.select(baracuda_ops.EmbeddingBagBackwardDescriptor(
            25, 8, tuple(idx.shape), out.shape[0], MODES[mode], device=device, index_dtype=idx.dtype,
            per_sample_weights=psw is not None, padding_idx=None if pad < 0 else pad))
        yield SampleInput(name, ops.embedding_bag_backward.out, bargs,
                          {"grad_weight": torch.empty_like(w),
                           "workspace": torch.empty(plan.workspace_size(), dtype=torch.uint8, device=device)})
        if name == "sum":
            yield SampleInput("sum_scale_grad_by_freq", ops.embedding_bag_weight_backward.default,
                              bargs + (True, False), skips=only(("opcheck", "determinism"), "the scaled dense gradient; "
                                                                "embedding_bag_backward's samples run the rest"))
        if name in ("sum", "mean_int32_padding"):
            # embedding_bag_with_options: embedding_bag's forward, embedding_bag_weight_backward's
            # scaled or sparse weight gradient.
            for scale, sparse in ((True, False), (False, True)):
                yield SampleInput(f"{name}_{'sparse' if sparse else 'scale_grad_by_freq'}",
                                  ops.embedding_bag_with_options.default, args + (scale, sparse), grad=(0,),
                                  skips=only(("opcheck", "determinism", "compile"), "the options' weight gradient; "
                                             "embedding_bag's samples run the rest"))
        if mode == 0:
            pargs = (grad, w, idx, o2b, mode, pad)
            yield SampleInput(name, ops.embedding_bag_per_sample_weights_backward.default, pargs,
                              skips={} if full else only(("opcheck", "determinism"), EXTRA_OPCHECK))
            yield SampleInput(name, ops.embedding_bag_per_sample_weights_backward.out, pargs,
                              {"grad_per_sample_weights": torch.empty(idx.shape, device=device)})

    # vmap: the samples become more bags of one call over one table (the weights stacked when they
    # differ per sample); on CUDA the backward's sums may group differently (within rounding).
    n, num_weights = 3, 25
    for mode in MODES:
        mode_enum = MODES.index(mode)
        for index_dtype in (torch.int64, torch.int32):
            weights = torch.randn(n, num_weights, 6, device=device)
            idx = torch.stack([make_bags(device, index_dtype)[0] for _ in range(n)])
            off = torch.stack([make_bags(device, index_dtype)[1],
                               torch.tensor([0, 0, 1, 9, 9, 30, 39], device=device, dtype=index_dtype),
                               torch.tensor([0, 2, 4, 8, 16, 32, 40], device=device, dtype=index_dtype)])
            psw = torch.randn(n, 40, device=device)
            tag = f"{mode}_{str(index_dtype)[6:]}"
            for padding_idx in (-1, 3):
                for ilo in (False, True):
                    args = (weights[0], idx[0], off[0], mode_enum, None, ilo, padding_idx)
                    yield SampleInput(f"vmap_{tag}_pad{padding_idx}_last{int(ilo)}", ops.embedding_bag.default, args,
                                      vmap=[(None, 0, 0), (0, 0, 0), (0, None, None), (0, 0, None), (None, 0, None)],
                                      vmap_exact="cpu", batch=(weights, idx, off), skips=only(("vmap",), VMAP))
                    if mode == "sum":
                        yield SampleInput(f"vmap_{tag}_pad{padding_idx}_last{int(ilo)}_psw", ops.embedding_bag.default,
                                          (weights[0], idx[0], off[0], mode_enum, psw[0], ilo, padding_idx),
                                          vmap=[(None, 0, 0, 0)], vmap_exact="cpu", batch=(weights, idx, off, psw),
                                          skips=only(("vmap",), VMAP))
                yield SampleInput(f"vmap_{tag}_pad{padding_idx}", ops.embedding_bag_forward_only.default,
                                  (weights[0], idx[0], off[0], mode_enum, None, False, padding_idx),
                                  vmap=[(None, 0, 0), (0, 0, 0), (0, None, None)], vmap_exact="cpu",
                                  batch=(weights, idx, off), skips=only(("vmap",), VMAP))
                yield SampleInput(f"vmap_{tag}_pad{padding_idx}_2d", ops.embedding_bag.default,
                                  (weights[0], idx[0].view(8, 5), None, mode_enum, None, False, padding_idx),
                                  vmap=[(0, 0)], vmap_exact="cpu", batch=(weights, idx.view(n, 8, 5)),
                                  skips=only(("vmap",), VMAP))
                _, o2b, bag_size, max_positions = torch.func.vmap(
                    lambda w, i: ops.embedding_bag(w, i, off[0], mode_enum, None, False, padding_idx))(weights, idx)
                grad = torch.randn(n, 7, 6, device=device)
                batch = (grad, idx, o2b, bag_size, max_positions)
                yield SampleInput(f"vmap_{tag}_pad{padding_idx}", ops.embedding_bag_backward.default,
                                  (grad[0], idx[0], o2b[0], bag_size[0], max_positions[0], num_weights, mode_enum, None,
                                   padding_idx), vmap=[(0,) * 5], vmap_exact="cpu", batch=batch,
                                  skips=only(("vmap",), VMAP))
                if mode == "sum":
                    yield SampleInput(f"vmap_{tag}_pad{padding_idx}", ops.embedding_bag_per_sample_weights_backward.default,
                                      (grad[0], weights[0], idx[0], o2b[0], 0, padding_idx), vmap=[(0,) * 4],
                                      vmap_exact="cpu", batch=(grad, weights, idx, o2b), skips=only(("vmap",), VMAP))

    # The public function: float64 gradcheck and torch.func in every mode, compile, export, and
    # GPU-sized skewed bags for CUDA graphs and a second GPU.
    idx8, off4 = torch.tensor([1, 4, 4, 0, 2, 3, 1, 4], device=device), torch.tensor([0, 2, 2, 5], device=device)
    idx, off = make_bags(device)
    for mode in MODES:
        mode_enum = MODES.index(mode)
        w, psw = torch.randn(6, 3, device=device, dtype=torch.float64), torch.randn(8, device=device, dtype=torch.float64)
        yield SampleInput(f"f64_{mode}_padding", ops.embedding_bag.default,
                          (w, idx8, off4, mode_enum, psw if mode == "sum" else None, False, 2),
                          grad=(0, 4) if mode == "sum" else (0,),
                          fn=lambda w, i, o, p=None, m=mode: baracuda_ops.embedding_bag(i, w, o, mode=m, per_sample_weights=p,
                                                                                      padding_idx=2),
                          skips=only(("gradcheck",), "float64 gradients; the float32 samples run the rest"))
        w = torch.randn(25, 6, dtype=torch.float64, device=device)
        yield SampleInput(f"f64_{mode}", ops.embedding_bag.default, (w, idx, off, mode_enum, None, False, -1), grad=(0,),
                          fn=lambda w, i, o, m=mode: baracuda_ops.embedding_bag(i, w, o, mode=m),
                          skips=only(("torch_func",), "float64 gradients; the float32 samples run the rest"))
        if mode == "sum":
            psw = torch.randn(40, dtype=torch.float64, device=device)
            yield SampleInput("f64_sum_psw", ops.embedding_bag.default, (w, idx, off, 0, psw, False, -1), grad=(0, 4),
                              fn=lambda w, i, o, p: baracuda_ops.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
                              skips=only(("torch_func",), "float64 gradients; the float32 samples run the rest"))
        for num_weights, dim in ((50, 8), (100000, 128)):
            def bags(w, psw, i, o, m=mode):
                return baracuda_ops.embedding_bag(i, w, o, mode=m, per_sample_weights=psw if m == "sum" else None,
                                                  padding_idx=3)

            yield SampleInput(f"gpu_{mode}_{num_weights}x{dim}", ops.embedding_bag.default,
                              lambda m=mode, n=num_weights, d=dim: _gpu_bags(m, n, d, device),
                              grad=(0, 1) if mode == "sum" else (0,), fn=bags)

    # The public function against torch.nn.functional.embedding_bag in float64, every mode.
    w = torch.randn(25, 8, device=device)
    for mode in MODES:
        yield SampleInput(f"public_{mode}_padding", ops.embedding_bag.default, (w, idx, off, MODES.index(mode), None,
                                                                                False, 3), grad=(0,),
                          fn=lambda w, i, o, m=mode: baracuda_ops.embedding_bag(i, w, o, mode=m, padding_idx=3),
                          reference=lambda w, i, o, m=mode: F.embedding_bag(i, w, o, mode=m, padding_idx=3), ref_scale=4,
                          skips=only(("reference", "determinism"), "the public function against F.embedding_bag; the "
                                     "raw-op samples run the rest"))

    def two_modes(w, psw, idx, off):
        y = baracuda_ops.embedding_bag(idx, w * 2, off, mode="sum", per_sample_weights=psw)
        z = baracuda_ops.embedding_bag(idx, w, off, mode="max", padding_idx=1)
        return (y + z).sin()

    for n_idx, offsets in ((30, [0, 4, 4, 17]), (41, [0, 9, 20, 20, 33])):
        yield SampleInput(f"public_{n_idx}", ops.embedding_bag.default,
                          (torch.randn(20, 16, device=device), torch.randn(n_idx, device=device),
                           torch.randint(0, 20, (n_idx,), device=device), torch.tensor(offsets, device=device)),
                          grad=(0, 1), fn=two_modes,
                          skips=only(("compile", "determinism"), "two modes through the public function; the raw-op "
                                     "samples run the rest"))

    def three_modes(w, psw, idx, off):
        y = baracuda_ops.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw)
        z = baracuda_ops.embedding_bag(idx, w, off, mode="max", padding_idx=1)
        return y, z, baracuda_ops.embedding_bag(idx, w, off, mode="mean", include_last_offset=True)

    def inputs(n_idx, offsets):
        return (torch.randn(20, 16, device=device), torch.randn(n_idx, device=device),
                torch.randint(0, 20, (n_idx,), device=device), torch.tensor(offsets, device=device))

    # include_last_offset makes an output of len(offsets) - 1 rows, and export's tracer guards
    # that size against 1 (as it does for F.embedding_bag): offsets of 3 or more.
    positions, bags = torch.export.Dim("positions"), torch.export.Dim("bags", min=3)
    yield SampleInput("export", ops.embedding_bag.default, inputs(30, [0, 4, 4, 17]), grad=(0, 1), fn=three_modes,
                      export=Export([{}, {0: positions}, {0: positions}, {0: bags}],
                                    [list(inputs(41, [0, 9, 20, 20, 33, 41]))], ["embedding_bag"]),
                      skips=only(("export",), "an export of three modes; the other samples run the rest"))
