"""A tiny Llama-style model trained on several ranks: FSDP2, TP+SP, FSDP2 x TP, with
``baracuda_ops.nn.RMSNorm`` and with ``torch.nn.RMSNorm`` side by side.

    torchrun --nproc-per-node 2 tools/dist_train.py            # (a) FSDP2, (b) TP+SP on 2 GPUs
    torchrun --nproc-per-node 4 tools/dist_train.py            # (c) FSDP2 x TP on 4 GPUs (2 x 2)
    python tools/dist_train.py --nproc 2                       # the same, spawning its own ranks
    python tools/dist_train.py --nproc 2 --device cpu --smoke  # gloo on CPU, a smaller model, 3 steps

Every layout trains the same model (random weights from one seed, a small config) on the same
token batches for ``--steps`` steps with AdamW, and is compared with the model trained in one
process on the whole batch: rank 0 prints a table of losses (first, last, largest difference
from the single-process run), whether a second run of ours gave bit-identical losses, and the
median step time with our norms and with PyTorch's. ``--compile`` runs the models under
``torch.compile``. NCCL on CUDA (one GPU per rank), gloo on CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 4096
    dim: int = 512
    layers: int = 4
    heads: int = 8
    hidden: int = 1408
    seq: int = 256
    batch: int = 8
    eps: float = 1e-5


SMOKE = Config(vocab=128, dim=32, layers=2, heads=4, hidden=64, seq=16, batch=4)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.head_dim = config.dim // config.heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(config.dim, config.dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1: the heads of this rank under tensor parallelism
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: Config, norm: type[nn.Module]):
        super().__init__()
        self.attention_norm = norm(config.dim, eps=config.eps)
        self.attention = Attention(config)
        self.ffn_norm = norm(config.dim, eps=config.eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Model(nn.Module):
    def __init__(self, config: Config, norm: type[nn.Module]):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleList(Block(config, norm) for _ in range(config.layers))
        self.norm = norm(config.dim, eps=config.eps)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def norm_class(name: str) -> type[nn.Module]:
    if name == "ours":
        import baracuda_ops

        return baracuda_ops.nn.RMSNorm
    return nn.RMSNorm


def build(config: Config, norm: str, device) -> Model:
    """The model, its weights drawn from seed 0 (every rank and layout gets the same), norm
    weights drawn too (not all ones) so that their gradients matter."""
    torch.manual_seed(0)
    model = Model(config, norm_class(norm)).to(device)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.RMSNorm, norm_class(norm))):
                module.weight.uniform_(0.5, 1.5)
    return model


def batches(config: Config, steps: int, device) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, config.vocab, (config.batch, config.seq + 1), generator=generator).to(device)
            for _ in range(steps)]


def apply_tp(model: Model, mesh) -> None:
    """Tensor + sequence parallelism as torchtitan lays out a Llama: norms and the residual stream
    sharded over the sequence (Shard(1)), attention and MLP column/row-wise."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def apply_fsdp(model: Model, mesh) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


LAYOUTS = {2: ("fsdp", "tp"), 4: ("fsdp_tp",)}


def parallel_model(config: Config, norm: str, layout: str, device):
    """(the model laid out over this rank's mesh, the rows of each batch this rank trains on)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    model = build(config, norm, device)
    if layout == "fsdp":
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
        apply_fsdp(model, mesh)
        dp, dp_rank = world, rank
    elif layout == "tp":
        apply_tp(model, init_device_mesh(device.type, (world,), mesh_dim_names=("tp",)))
        dp, dp_rank = 1, 0
    else:
        mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("dp", "tp"))
        apply_tp(model, mesh["tp"])
        apply_fsdp(model, mesh["dp"])
        dp, dp_rank = 2, mesh.get_local_rank("dp")
    per_rank = config.batch // dp
    return model, slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)


def train(model, data: list[torch.Tensor], rows: slice, device, compile: bool | str, distributed: bool):
    """Losses (of the whole batch: averaged over the ranks that split it) and step times in ms;
    ``compile``: False, True (torch.compile's default backend) or a backend's name."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = model
    if compile:
        step_fn = torch.compile(model) if compile is True else torch.compile(model, backend=compile)
    losses, times = [], []
    for tokens in data:
        tokens = tokens[rows]
        start = time.perf_counter()
        logits = step_fn(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
        loss = loss.detach()
        if distributed:
            loss = loss.clone()
            torch.distributed.all_reduce(loss)
            loss /= torch.distributed.get_world_size()  # ranks of one batch slice hold the same loss
        losses.append(loss.item())
    return losses, times


def compare(config: Config, layout: str, norm: str, steps: int, device, compile: bool | str = False):
    """A layout's losses and step times, and the single-process run's losses on the whole batch."""
    data = batches(config, steps, device)
    reference, _ = train(build(config, norm, device), data, slice(None), device, compile, distributed=False)
    model, rows = parallel_model(config, norm, layout, device)
    losses, times = train(model, data, rows, device, compile, distributed=True)
    return losses, times, reference


def run(args) -> None:
    world = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    if world not in LAYOUTS:
        raise SystemExit(f"dist_train: runs on 2 or 4 ranks, got {world}")
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    config = SMOKE if args.smoke else Config()
    steps = 3 if args.smoke else args.steps
    rows = []
    for layout in LAYOUTS[world]:
        for norm in ("ours", "torch"):
            losses, times, reference = compare(config, layout, norm, steps, device, args.compile)
            again = compare(config, layout, norm, steps, device, args.compile)[0] if norm == "ours" else None
            rows.append((layout, norm, losses, reference, times, again))
    if rank != 0:
        return
    print(f"{world} ranks, {device.type}, torch {torch.__version__}, {config}, {steps} steps"
          f"{', compiled' if args.compile else ''}")
    print("| layout | norms | loss step 1 | loss last | max abs diff vs 1 process | run-to-run | step ms (median) |")
    print("|---|---|---|---|---|---|---|")
    for layout, norm, losses, reference, times, again in rows:
        diff = max(abs(a - b) for a, b in zip(losses, reference))
        repeat = "-" if again is None else ("bit-equal" if again == losses else "DIFFERS")
        step_ms = statistics.median(times[1:] if len(times) > 1 else times)
        print(f"| {layout} | {norm} | {losses[0]:.6f} | {losses[-1]:.6f} | {diff:.2e} | {repeat} | {step_ms:.2f} |")


def _spawned(rank: int, world: int, store: str, args) -> None:
    backend = "nccl" if args.device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        run(args)
    finally:
        torch.distributed.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="a smaller model, 3 steps")
    parser.add_argument("--compile", action="store_true", help="train under torch.compile")
    parser.add_argument("--nproc", type=int, choices=(2, 4), help="spawn this many ranks (without torchrun)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "RANK" in os.environ:  # under torchrun
        torch.distributed.init_process_group("nccl" if args.device == "cuda" else "gloo")
        try:
            run(args)
        finally:
            torch.distributed.destroy_process_group()
        return
    if args.nproc is None:
        parser.error("run under torchrun, or give --nproc")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_spawned, args=(args.nproc, f"{tmp}/rendezvous", args), nprocs=args.nproc,
                           start_method="spawn")


if __name__ == "__main__":
    main()
