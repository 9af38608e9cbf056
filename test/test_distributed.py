"""DTensor sharding rules, tensor/sequence parallelism and FSDP2 on CPU: gloo ranks spawned here.

Each test starts one group of ranks (2, or 4) that runs every check of its list, so the process
start-up (importing torch in each rank) is paid once per group. A check computes each op on the
full tensors (the same on every rank, from the same seed) and on DTensors sharded as the issue's
table lists, and compares: bit-equal where the sharded call performs the same arithmetic on each
element, within the dtype's tolerance where a reduction is split across ranks. The output
placements are checked too: a rule that passes a placement through does so without communication.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available in this build of PyTorch",
)

GROUP_TIMEOUT_S = 240  # one group of ranks, start-up included (the CI machine has 2 cores)


def _run_group(world: int, checks: list[str]) -> None:
    """Runs the checks (functions of this module, by name) on ``world`` gloo ranks on 127.0.0.1,
    rendezvous through a file (no port to pick); a rank's failure fails the test with its traceback."""
    import torch.multiprocessing as mp

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(_rank_main, args=(world, tmp, root, checks), nprocs=world, join=False,
                                     start_method="spawn")
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    pytest.fail(f"{world} ranks did not finish {checks} within {GROUP_TIMEOUT_S} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()


def _rank_main(rank: int, world: int, tmp: str, root: str, checks: list[str]) -> None:
    sys.path.insert(0, root)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                                         world_size=world)
    try:
        import baracuda_ops  # noqa: F401  (registers the ops and, with DTensor imported, their rules)

        module = sys.modules[__name__] if __name__ in sys.modules else __import__("test_distributed")
        for name in checks:
            getattr(module, name)(world)
    finally:
        torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------- helpers


def _mesh(*shape):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape)


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


_SPLIT_SUM_TOLERANCE = {torch.bfloat16: (4e-2, 2e-2), torch.float16: (5e-3, 2e-3)}


def _same(actual, expected, exact: bool, what: str) -> None:
    actual = _full(actual)
    if exact:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:  # each rank's share rounded to the dtype once before the sum: a few more roundings
        rtol, atol = _SPLIT_SUM_TOLERANCE.get(expected.dtype, (None, None))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")


def _check(op, args: list, placements: list, mesh, expect: list | None = None, exact=(), what: str = "",
           local=()) -> tuple:
    """op on the full ``args`` and on them distributed with ``placements`` (None: not a tensor, or
    left as it is); outputs equal (bit-equal at the output positions in ``exact``; not compared at
    those in ``local``, which hold per-rank values), output placements ``expect`` (None: not
    checked). Returns the sharded outputs."""
    from torch.distributed.tensor import distribute_tensor

    reference = op(*args)
    sharded = op(*[a if p is None else distribute_tensor(a, mesh, p) for a, p in zip(args, placements)])
    one = not isinstance(reference, tuple)
    reference, outputs = ((reference,), (sharded,)) if one else (reference, sharded)
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        label = f"{what or op} output {i} with {placements}"
        if ref is None:
            assert out is None, label
            continue
        if expect is not None and expect[i] is not None:
            assert tuple(out.placements) == tuple(expect[i]), f"{label}: placements {out.placements} != {expect[i]}"
        if i in local:
            continue
        _same(out, ref, i in exact, label)
    return sharded


def _seeded(seed: int = 0):
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- checks of the ops


def check_rms_norm(world: int) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(world + 1, 2 * world + 1, 16, dtype=dtype)  # uneven shards
        w = torch.randn(16, dtype=dtype)
        for dim in (0, 1):
            s = Shard(dim)
            y, rstd = _check(ops.rms_norm, [x, [16], w, None], [[s], None, [Replicate()], None], mesh,
                             expect=[[s], [s]], exact=(0, 1))
            g = torch.randn_like(x)
            _check(ops.rms_norm_backward, [g, x, [16], rstd.full_tensor(), w, [True, True]],
                   [[s], [s], None, [s], [Replicate()], None], mesh, expect=[[s], [Partial()]], exact=(0,))
            _check(ops.rms_norm_backward, [g, x, [16], rstd.full_tensor(), None, [True, False]],
                   [[s], [s], None, [s], None, None], mesh, expect=[[s], None], exact=(0,))
        _check(ops.rms_norm, [x, [x.shape[1], 16], None, 1e-5], [[Shard(0)], None, None, None], mesh,
               expect=[[Shard(0)], [Shard(0)]], exact=(0, 1))
    # the functional form, differentiated through DTensors (sequence parallel)
    x = torch.randn(2, 4 * world, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    import baracuda_ops

    baracuda_ops.rms_norm(x, [8], w).pow(2).sum().backward()
    dx = distribute_tensor(x.detach(), mesh, [Shard(1)]).requires_grad_()
    dw = distribute_tensor(w.detach(), mesh, [Replicate()]).requires_grad_()
    y = baracuda_ops.rms_norm(dx, [8], dw)
    assert y.placements == (Shard(1),)
    y.pow(2).sum().backward()
    _same(dx.grad, x.grad, True, "rms_norm dx")
    _same(dw.grad, w.grad, False, "rms_norm dW")
    # the module, its weight a plain tensor, on a DTensor input (taken as replicated)
    module = baracuda_ops.nn.RMSNorm(8, dtype=torch.float64)
    torch.nn.init.uniform_(module.weight, 0.5, 1.5)
    batch = torch.randn(world + 1, 3, 8, dtype=torch.float64)
    module(batch).pow(2).sum().backward()
    reference = module.weight.grad.clone()
    module.weight.grad = None
    y = module(distribute_tensor(batch, mesh, [Shard(0)]))
    assert y.placements == (Shard(0),)
    y.pow(2).sum().backward()
    _same(module.weight.grad, reference, False, "nn.RMSNorm dW")
    # a shard inside the normalized dims: refused, naming the placement
    with pytest.raises(NotImplementedError, match=r"baracuda::rms_norm: input placement Shard\(dim=2\) on mesh dim 0 "
                                                  r"shards normalized dim 2"):
        ops.rms_norm(distribute_tensor(x.detach(), mesh, [Shard(2)]), [8], None, None)


def check_rms_norm_fused(world: int) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import baracuda_ops

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(world + 1, 2 * world + 1, 16, dtype=dtype)  # uneven shards
        r, w, g = torch.randn_like(x), torch.randn(16, dtype=dtype), torch.randn_like(x)
        for dim in (0, 1):
            s = Shard(dim)
            y, h, rstd = _check(ops.rms_norm_fused, [x, r, [16], w, None, 0.5, "llama"],
                                [[s], [s], None, [Replicate()], None, None, None], mesh, expect=[[s], [s], [s]],
                                exact=(0, 1, 2))
            _check(ops.rms_norm_fused_backward, [g, g, h.full_tensor(), [16], rstd.full_tensor(), w, 0.5, "llama",
                                                 dtype, [True, False, True]],
                   [[s], [s], [s], None, [s], [Replicate()], None, None, None, None], mesh,
                   expect=[[s], None, [Partial()]], exact=(0,))
            # without a residual: residual_out is the empty [0] tensor, Replicate
            _check(ops.rms_norm_fused, [x, None, [16], w, 1e-5, 0.0, "gemma"],
                   [[s], None, None, [Replicate()], None, None, None], mesh, expect=[[s], [Replicate()], [s]],
                   exact=(0, 1, 2))
            # quantized: per-row scales sharded like the rows; a static scale Replicate
            for scale in (None, torch.tensor([0.05])):
                q, _, row_scale = _check(
                    ops.rms_norm_quant, [x, r, [16], w, None, 0.0, "torch", scale],
                    [[s], [s], None, [Replicate()], None, None, None, None if scale is None else [Replicate()]],
                    mesh, expect=[[s], [s], [s] if scale is None else [Replicate()]], exact=(1, 2), local=(0,))
                want = ops.rms_norm_quant(x, r, [16], w, None, 0.0, "torch", scale)[0]
                # (gloo gathers no float8: each rank's shard against its part of the full result)
                want = distribute_tensor(want.view(torch.uint8), mesh, [s]).to_local()
                assert torch.equal(q.to_local().view(torch.uint8), want), "rms_norm_quant q"
    # per-head weight (QK-norm): the heads sharded (tensor parallel) take their weight rows; dW sharded alike
    x = torch.randn(2, 3, 2 * world, 8)
    w, g = torch.randn(2 * world, 8), torch.randn(2, 3, 2 * world, 8)
    y, _, rstd = _check(ops.rms_norm_fused, [x, None, [8], w, None, 0.0, "torch"],
                        [[Shard(2)], None, None, [Shard(0)], None, None, None], mesh,
                        expect=[[Shard(2)], [Replicate()], [Shard(2)]], exact=(0, 2))
    _check(ops.rms_norm_fused_backward, [g, None, x, [8], rstd.full_tensor(), w, 0.0, "torch", x.dtype,
                                         [True, False, True]],
           [[Shard(2)], None, [Shard(2)], None, [Shard(2)], [Shard(0)], None, None, None, None], mesh,
           expect=[[Shard(2)], None, [Shard(0)]], exact=(0, 2))
    # the functional form with a residual, differentiated through DTensors (sequence parallel)
    x = torch.randn(2, 4 * world, 8, dtype=torch.float64, requires_grad=True)
    r = torch.randn(2, 4 * world, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    y, h = baracuda_ops.rms_norm_fused(x, [8], w, residual=r, casting="llama")
    (y.pow(2).sum() + h.sin().sum()).backward()
    dx, dr = (distribute_tensor(t.detach(), mesh, [Shard(1)]).requires_grad_() for t in (x, r))
    dw = distribute_tensor(w.detach(), mesh, [Replicate()]).requires_grad_()
    y, h = baracuda_ops.rms_norm_fused(dx, [8], dw, residual=dr, casting="llama")
    assert y.placements == h.placements == (Shard(1),)
    (y.pow(2).sum() + h.sin().sum()).backward()
    _same(dx.grad, x.grad, True, "rms_norm_fused dx")
    _same(dr.grad, r.grad, True, "rms_norm_fused dresidual")
    _same(dw.grad, w.grad, False, "rms_norm_fused dW")
    with pytest.raises(NotImplementedError, match=r"baracuda::rms_norm_fused: input placement Shard\(dim=2\) on "
                                                  r"mesh dim 0 shards normalized dim 2"):
        ops.rms_norm_fused(distribute_tensor(x.detach(), mesh, [Shard(2)]), None, [8], None, None, 0.0, "torch")


class _FusedBlock(torch.nn.Module):
    """A pre-norm block whose second norm takes the residual add: ``y, h = norm2(a, residual=x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.Parameter(torch.rand(dim) + 0.5), torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.wi, self.wo = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(hidden, dim, bias=False)
        self.w1, self.w2 = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        import baracuda_ops

        dim = x.shape[-1]
        a = self.wo(torch.relu(self.wi(baracuda_ops.rms_norm_fused(x, [dim], self.norm1, casting="llama"))))
        y, h = baracuda_ops.rms_norm_fused(a, [dim], self.norm2, residual=x, casting="llama")
        return h + self.w2(torch.relu(self.w1(y)))


def check_tp_sp_fused_block(world: int) -> None:
    """Tensor + sequence parallel over a block with the fused residual add + norm: the sequence-sharded
    residual stream and norms between column- and row-parallel linears, equal to the full block."""
    import copy

    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = _mesh(world)
    _seeded()
    block = _FusedBlock(8, 4 * world).double()
    reference = copy.deepcopy(block)
    x = torch.randn(2, 2 * world, 8, dtype=torch.float64)
    reference(x).pow(2).sum().backward()
    parallelize_module(block, mesh, {
        "wi": ColwiseParallel(input_layouts=Shard(1)), "wo": RowwiseParallel(output_layouts=Shard(1),
                                                                             use_local_output=False),
        "w1": ColwiseParallel(input_layouts=Shard(1)), "w2": RowwiseParallel(output_layouts=Shard(1),
                                                                             use_local_output=False),
    })
    for name in ("norm1", "norm2"):
        weight = distribute_tensor(getattr(block, name).detach(), mesh, [Replicate()])
        setattr(block, name, torch.nn.Parameter(weight))
    out = block(distribute_tensor(x, mesh, [Shard(1)]))
    assert out.placements == (Shard(1),)
    _same(out, reference(x).detach(), False, "TP+SP block output")
    out.pow(2).sum().backward()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(_full(block.get_parameter(name).grad), p.grad, msg=lambda m: f"d{name}: {m}")


def check_repeat(world: int) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    x = torch.randn(2 * world, 3, world + 1, dtype=torch.float32)
    # a dim repeated once passes through (after the extra leading repeat dims)
    _check(ops.repeat, [x, [2, 1, 3, 1]], [[Shard(0)], None], mesh, expect=[[Shard(1)]], exact=(0,))
    _check(ops.repeat, [x, [1, 2, 1]], [[Shard(2)], None], mesh, expect=[[Shard(2)]], exact=(0,))
    _check(ops.repeat, [x, [2, 2, 2]], [[Replicate()], None], mesh, expect=[[Replicate()]], exact=(0,))
    # a sharded repeated dim: gathered first, still equal
    _check(ops.repeat, [x, [3, 1, 1]], [[Shard(0)], None], mesh, exact=(0,))
    g = torch.randn(2, 2 * world, 3, 2 * (world + 1))
    _check(ops.repeat_backward, [g, [2, 1, 1, 2], list(x.shape)], [[Shard(1)], None, None], mesh,
           expect=[[Shard(0)]], exact=(0,))
    _check(ops.repeat_backward, [g, [2, 1, 1, 2], list(x.shape)], [[Shard(0)], None, None], mesh,
           expect=[[Partial()]])
    _check(ops.repeat_backward, [g, [2, 1, 1, 2], list(x.shape)], [[Shard(3)], None, None], mesh, exact=(0,))


def check_alibi(world: int) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import baracuda_ops

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    for dtype in (torch.float32, torch.float16):
        scores = torch.randn(2, 2 * world, 2 * world + 1, 3 * world, dtype=dtype)
        slopes = baracuda_ops.alibi_slopes(2 * world)
        grad = torch.randn_like(scores)
        cases = [(Shard(0), Replicate(), Partial(), True), (Shard(1), Shard(0), Shard(0), True),
                 (Shard(2), Replicate(), Partial(), False), (Shard(3), Replicate(), Partial(), False)]
        for s, w, g, exact in cases:
            _check(ops.alibi, [scores, slopes], [[s], [w]], mesh, expect=[[s]], exact=(0,) if exact else ())
            _check(ops.alibi_backward, [grad, slopes, [True, True]], [[s], [w], None], mesh, expect=[[s], [g]],
                   exact=(0, 1) if s == Shard(1) else (0,))
            inplace = scores.clone()
            ops.alibi_inplace(inplace, slopes)
            sharded = distribute_tensor(scores, mesh, [s])
            ops.alibi_inplace(sharded, distribute_tensor(slopes, mesh, [w]))
            assert sharded.placements == (s,)
            _same(sharded, inplace, exact, f"alibi_inplace {s}")
    # scores and slopes sharded over heads through the functional form, with gradients
    scores = torch.randn(2, 2 * world, 5, 7, dtype=torch.float64, requires_grad=True)
    slopes = baracuda_ops.alibi_slopes(2 * world, dtype=torch.float64).requires_grad_()
    baracuda_ops.alibi(scores, slopes).pow(2).sum().backward()
    for s, w in ((Shard(1), Shard(0)), (Shard(2), Replicate())):
        ds = distribute_tensor(scores.detach(), mesh, [s]).requires_grad_()
        dw = distribute_tensor(slopes.detach(), mesh, [w]).requires_grad_()
        baracuda_ops.alibi(ds, dw).pow(2).sum().backward()
        _same(ds.grad, scores.grad, False, f"alibi dscores {s}")
        _same(dw.grad, slopes.grad, False, f"alibi dslopes {s}")
    with pytest.raises(NotImplementedError, match=r"baracuda::alibi_inplace: scores placement Partial\(sum\)"):
        from torch.distributed.tensor import DTensor

        partial = DTensor.from_local(torch.zeros(1, 2, 3, 3), mesh, [Partial()])
        ops.alibi_inplace(partial, distribute_tensor(torch.ones(2), mesh, [Replicate()]))


def check_fractional_max_pool(world: int) -> None:
    from torch.distributed.tensor import Replicate, Shard

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    for dims in (2, 3):
        pool = getattr(ops, f"fractional_max_pool{dims}d")
        backward = getattr(ops, f"fractional_max_pool{dims}d_backward")
        spatial = [7] * dims
        x = torch.randn(world + 1, 2 * world, *spatial)
        samples = torch.rand(world + 1, 2 * world, dims, dtype=x.dtype)
        for p in (Shard(0), Shard(1)):
            out, idx = _check(pool, [x, [2] * dims, [4] * dims, samples], [[p], None, None, [p]], mesh,
                              expect=[[p], [p]], exact=(0, 1))
            g = torch.randn(out.shape)
            _check(backward, [g, x, [2] * dims, [4] * dims, idx.full_tensor()], [[p], [p], None, None, [p]], mesh,
                   expect=[[p]], exact=(0,))
        unbatched = x[0]
        _check(pool, [unbatched, [2] * dims, [4] * dims, samples[:1]], [[Shard(0)], None, None, [Shard(1)]], mesh,
               expect=[[Shard(0)], [Shard(0)]], exact=(0, 1))
        # a pooled dim sharded: gathered first, still equal
        _check(pool, [x, [2] * dims, [4] * dims, samples], [[Shard(2)], None, None, [Replicate()]], mesh,
               exact=(0, 1))


def check_embedding_bag(world: int) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import baracuda_ops

    mesh = _mesh(world)
    ops = torch.ops.baracuda
    _seeded()
    rows, dim = 5 * world + 3, 6  # an uneven row shard
    for dtype, index_dtype in ((torch.float32, torch.int64), (torch.float64, torch.int32)):
        weight = torch.randn(rows, dim, dtype=dtype)
        lengths = torch.randint(0, 5, (3 * world,))
        lengths[1] = 0  # an empty bag
        indices = torch.randint(0, rows, (int(lengths.sum()),), dtype=index_dtype)
        indices[:2] = 1  # padding_idx entries
        offsets = (torch.cumsum(lengths, 0) - lengths).to(index_dtype)
        psw = torch.randn(indices.shape, dtype=dtype)
        for mode in (0, 1, 2):
            for padding_idx, last in ((-1, False), (1, True)):
                offs = torch.cat([offsets, offsets.new_tensor([indices.numel()])]) if last else offsets
                for weights in ((None, psw) if mode == 0 else (None,)):
                    args = [weight, indices, offs, mode, weights, last, padding_idx]
                    r = Replicate()
                    out_placement = Partial() if mode != 2 else r
                    placements = [[Shard(0)], [r], [r], None, None if weights is None else [r], None, None]
                    out, offset2bag, bag_size, positions = _check(
                        ops.embedding_bag, args, placements, mesh, expect=[[out_placement], [r], [Partial("max")], [r]],
                        exact=(1, 2, 3) if mode != 2 else (0, 1, 2, 3), what=f"embedding_bag row-sharded mode {mode}")
                    grad = torch.randn(out.shape, dtype=dtype)
                    _, o2b, size, pos = ops.embedding_bag(*args)
                    reference = ops.embedding_bag_backward(grad, indices, o2b, size, pos, rows, mode, weights,
                                                           padding_idx)
                    sharded = ops.embedding_bag_backward(
                        distribute_tensor(grad, mesh, [r]), distribute_tensor(indices, mesh, [r]), offset2bag, bag_size,
                        positions, rows, mode, None if weights is None else distribute_tensor(weights, mesh, [r]),
                        padding_idx)
                    assert sharded.placements == (Shard(0),), sharded.placements
                    _same(sharded, reference, mode == 2, f"embedding_bag_backward row-sharded mode {mode}")
                    if mode == 0:
                        _check(ops.embedding_bag_per_sample_weights_backward,
                               [grad, weight, indices, o2b, 0, padding_idx], [[r], [Shard(0)], [r], [r], None, None],
                               mesh, expect=[[Partial()]])
        # bags sharded: each rank's own batch of fixed-size bags, the table Replicate (offset2bag and
    # max_positions number the rank's own bags and entries)
        bags = torch.randint(0, rows, (2 * world + 1, 3), dtype=index_dtype)
        for mode in (0, 1, 2):
            out, o2b, size, pos = _check(ops.embedding_bag, [weight, bags, None, mode, None, False, -1],
                                         [[Replicate()], [Shard(0)], None, None, None, None, None], mesh,
                                         expect=[[Shard(0)]] * 3 + [[Shard(0) if mode == 2 else Replicate()]],
                                         exact=(0, 2), local=(1, 3))
            grad = torch.randn(out.shape, dtype=dtype)
            _, ro2b, rsize, rpos = ops.embedding_bag(weight, bags, None, mode)
            reference = ops.embedding_bag_backward(grad, bags, ro2b, rsize, rpos, rows, mode, None, -1)
            sharded = ops.embedding_bag_backward(distribute_tensor(grad, mesh, [Shard(0)]),
                                                 distribute_tensor(bags, mesh, [Shard(0)]), o2b, size, pos, rows,
                                                 mode, None, -1)
            assert sharded.placements == (Partial(),), sharded.placements
            _same(sharded, reference, False, f"embedding_bag_backward bags sharded mode {mode}")
    # the module with a row-sharded table, trained through the functional form's autograd
    table = baracuda_ops.nn.EmbeddingBag(rows, dim, mode="mean", padding_idx=1)
    indices = torch.randint(0, rows, (4 * world,))
    offsets = torch.tensor([0, 3, 3, 7])
    table(indices, offsets).pow(2).sum().backward()
    weight = distribute_tensor(table.weight.detach(), mesh, [Shard(0)]).requires_grad_()
    out = baracuda_ops.embedding_bag(distribute_tensor(indices, mesh, [Replicate()]), weight,
                                     distribute_tensor(offsets, mesh, [Replicate()]), mode="mean", padding_idx=1)
    out.redistribute(mesh, [Replicate()]).pow(2).sum().backward()
    assert weight.grad.placements == (Shard(0),)
    _same(weight.grad, table.weight.grad, False, "EmbeddingBag row-sharded dW")


def check_two_dim_mesh(world: int) -> None:
    """The rules over a 2 x 2 mesh: each mesh dim takes its own placement."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    import baracuda_ops

    mesh = _mesh(2, world // 2)
    ops = torch.ops.baracuda
    _seeded()
    x, w = torch.randn(3, 5, 16), torch.randn(16)
    _check(ops.rms_norm, [x, [16], w, None], [[Shard(0), Shard(1)], None, [Replicate(), Replicate()], None], mesh,
           expect=[[Shard(0), Shard(1)]] * 2, exact=(0, 1))
    scores = torch.randn(2, 4, 5, 6)
    slopes = baracuda_ops.alibi_slopes(4)
    _check(ops.alibi, [scores, slopes], [[Shard(1), Shard(2)], [Shard(0), Replicate()]], mesh,
           expect=[[Shard(1), Shard(2)]])
    _check(ops.alibi_backward, [torch.randn_like(scores), slopes, [False, True]],
           [[Shard(1), Shard(2)], [Shard(0), Replicate()], None], mesh, expect=[None, [Shard(0), Partial()]])
    weight = torch.randn(11, 4)
    indices = torch.randint(0, 11, (8, 3))
    for mode in (0, 2):  # the table's rows over both mesh dims; bags over one, rows over the other
        _check(ops.embedding_bag, [weight, indices, None, mode], [[Shard(0), Shard(0)], [Replicate()] * 2, None, None],
               mesh, exact=(1, 2, 3) if mode == 0 else (0, 1, 2, 3))
        _check(ops.embedding_bag, [weight, indices, None, mode], [[Replicate(), Shard(0)], [Shard(0), Replicate()],
                                                                  None, None], mesh, exact=() if mode == 0 else (0,),
               local=(1, 3))


# --------------------------------------------------------------------------- checks of training


_TINY = None


def _dist_train():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tools"))
    import dist_train

    global _TINY
    _TINY = dist_train.Config(vocab=64, dim=16, layers=1, heads=4, hidden=32, seq=8, batch=4)
    return dist_train


def _check_training(layouts, compile=False) -> None:
    """A small Llama-style block stack with baracuda_ops.nn.RMSNorm norms, trained 3 steps in each
    layout, has the single-process run's losses (within float32 rounding: the layouts split
    matmul and gradient sums across ranks)."""
    dist_train = _dist_train()
    for layout in layouts:
        losses, _, reference = dist_train.compare(_TINY, layout, "ours", 2, torch.device("cpu"), compile)
        torch.testing.assert_close(losses, reference, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{layout} (compile={compile}): {m}")


def check_training_fsdp_and_tp(world: int) -> None:
    _check_training(["fsdp", "tp"])


def check_training_tp_compiled(world: int) -> None:
    _check_training(["tp"], compile="aot_eager")


def check_training_fsdp_x_tp(world: int) -> None:
    _check_training(["fsdp_tp"])


def test_two_ranks():
    _run_group(2, ["check_rms_norm", "check_rms_norm_fused", "check_tp_sp_fused_block", "check_repeat", "check_alibi",
                   "check_fractional_max_pool", "check_embedding_bag",
                   "check_training_fsdp_and_tp", "check_training_tp_compiled"])


def test_four_ranks():
    _run_group(4, ["check_rms_norm", "check_rms_norm_fused", "check_embedding_bag", "check_two_dim_mesh",
                   "check_training_fsdp_x_tp"])


def test_rules_register_on_first_use_of_dtensor():
    """``import baracuda_ops`` leaves torch.distributed.tensor (seconds to import) unimported; the
    rules register when the program imports it."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys, torch, baracuda_ops\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'imported by baracuda_ops'\n"
        "from torch.distributed.tensor import DTensor\n"
        "rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "ops = [getattr(torch.ops.baracuda, name).default for name in ('repeat', 'repeat_backward', 'rms_norm',\n"
        "       'rms_norm_backward', 'rms_norm_fused', 'rms_norm_fused_backward', 'rms_norm_quant',\n"
        "       'alibi', 'alibi_inplace', 'alibi_backward', 'fractional_max_pool2d',\n"
        "       'fractional_max_pool2d_backward', 'fractional_max_pool3d', 'fractional_max_pool3d_backward',\n"
        "       'embedding_bag', 'embedding_bag_backward', 'embedding_bag_per_sample_weights_backward')]\n"
        "missing = [str(op) for op in ops if op not in rules]\n"
        "assert not missing, missing\n"
    )
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
