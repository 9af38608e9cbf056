"""Training-step benchmark: whole models with PyTorch's modules against ours (and Liger's RMSNorm).

    python tools/train_bench.py [--device cuda] [--steps 20] [--warmup 5] [--no-compile] [--json F] [--models M,...]
    python tools/train_bench.py --smoke          # tiny sizes on CPU, eager only, in seconds

Models (plain torch modules; only the swapped module differs between variants):
  llama-256-fp32 / llama-2048-bf16  Llama-style decoder (RMSNorm, SwiGLU MLP, causal SDPA), 4 layers,
                                    seq 1024, batch 4, AdamW; RMSNorm from torch, ours, Liger
  dlrm-{dense-sgd,sparse-sgd,adagrad} DLRM-style: 8 EmbeddingBag tables (dim 64, sum), bottom and
                                    top MLPs, batch 8192, BCE loss; the dense-gradient ones also
                                    with the 8 tables in one EmbeddingBagCollection (ours-collection)
  alibi-lm                          BLOOM-style LM: attention scores plus the ALiBi bias, LayerNorm
  cnn-fmp                           CNN with FractionalMaxPool2d after each conv block, SGD momentum
Each variant runs eager and under torch.compile: median step time (forward, loss, backward,
optimizer step; synchronized per step), peak memory (CUDA), and the loss curve, which must equal
PyTorch's within rounding (same seed, same initial weights, same batches).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import baracuda_ops
from baracuda_ops.nn_collection import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor


# ---------------------------------------------------------------------------- norms and biases


def _liger_rms_norm():
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        return None

    def make(hidden, device, dtype):
        return LigerRMSNorm(hidden).to(device=device, dtype=dtype)

    return make


def _norm_factories(device: torch.device) -> dict[str, Callable]:
    factories = {
        "torch": lambda hidden, device, dtype: nn.RMSNorm(hidden, device=device, dtype=dtype),
        "ours": lambda hidden, device, dtype: baracuda_ops.nn.RMSNorm(hidden, device=device, dtype=dtype),
    }
    liger = _liger_rms_norm() if device.type == "cuda" else None  # Liger's kernels are Triton: CUDA only
    if liger is not None:
        factories["liger"] = liger
    return factories


class _TorchALiBi(nn.Module):
    """``scores + slopes[h] * (j - i)`` from PyTorch ops."""

    def __init__(self, heads: int, device) -> None:
        super().__init__()
        self.register_buffer("slopes", baracuda_ops.alibi_slopes(heads, device=device))

    def forward(self, scores):
        q, k = scores.shape[-2:]
        distance = torch.arange(k, device=scores.device) - torch.arange(q, device=scores.device).unsqueeze(1)
        return scores + (self.slopes.view(-1, 1, 1) * distance).to(scores.dtype)


# ---------------------------------------------------------------------------- models


class _Block(nn.Module):
    def __init__(self, hidden, heads, norm, alibi=None, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype, bias=False)
        self.heads, self.alibi = heads, alibi
        self.norm1, self.norm2 = norm(), norm()
        self.qkv = nn.Linear(hidden, 3 * hidden, **kw)
        self.proj = nn.Linear(hidden, hidden, **kw)
        self.gate = nn.Linear(hidden, 4 * hidden, **kw)
        self.up = nn.Linear(hidden, 4 * hidden, **kw)
        self.down = nn.Linear(4 * hidden, hidden, **kw)

    def attention(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if self.alibi is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = self.alibi((q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads))
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, h))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class _LM(nn.Module):
    def __init__(self, vocab, hidden, heads, layers, norm, alibi=None, device=None, dtype=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(
            _Block(hidden, heads, norm, alibi() if alibi else None, device, dtype) for _ in range(layers))
        self.norm = norm()
        self.head = nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class _DLRM(nn.Module):
    def __init__(self, rows, dim, dense_features, bag_cls, sparse, device):
        super().__init__()
        self.tables = nn.ModuleList(bag_cls(r, dim, mode="sum", sparse=sparse, device=device) for r in rows)
        self.bottom = nn.Sequential(nn.Linear(dense_features, 256, device=device), nn.ReLU(),
                                    nn.Linear(256, dim, device=device), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(dim * (len(rows) + 1), 512, device=device), nn.ReLU(),
                                 nn.Linear(512, 256, device=device), nn.ReLU(), nn.Linear(256, 1, device=device))

    def forward(self, dense, indices, offsets):
        features = [self.bottom(dense)] + [t(i, o) for t, i, o in zip(self.tables, indices, offsets)]
        return self.top(torch.cat(features, 1)).squeeze(1)


class _DLRMCollection(nn.Module):
    """``reference``'s DLRM with its tables in one baracuda_ops EmbeddingBagCollection (one
    embedding_bag launch for all tables, forward and backward), the same weights."""

    def __init__(self, reference: _DLRM, device):
        super().__init__()
        names = [f"t{i}" for i in range(len(reference.tables))]
        self.keys = [f"f{i}" for i in range(len(reference.tables))]
        configs = [EmbeddingBagConfig(num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim, name=name,
                                      feature_names=[key])
                   for t, name, key in zip(reference.tables, names, self.keys)]
        self.tables = EmbeddingBagCollection(configs, device=device)
        with torch.no_grad():
            for t, name in zip(reference.tables, names):
                self.tables.table_weight(name).copy_(t.weight)
        self.bottom, self.top = reference.bottom, reference.top

    def forward(self, dense, indices, offsets):
        lengths = torch.cat([torch.diff(o, append=o.new_tensor([i.numel()])) for i, o in zip(indices, offsets)])
        pooled = self.tables(KeyedJaggedTensor(self.keys, torch.cat(indices), lengths=lengths)).values()
        return self.top(torch.cat([self.bottom(dense), pooled], 1)).squeeze(1)


class _CNN(nn.Module):
    def __init__(self, pool_cls, width, device):
        super().__init__()
        layers, channels = [], 3
        for out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(channels, out, 3, padding=1, device=device), nn.BatchNorm2d(out, device=device),
                       nn.ReLU(), pool_cls(2, output_ratio=(0.7, 0.7))]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, 10, device=device)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


# ---------------------------------------------------------------------------- benchmark cases


@dataclass
class Workload:
    """A model family: ``build(variant)`` returns (model, optimizer); ``batch(step)`` the inputs and
    target of a step; ``loss(output, target)``."""

    name: str
    variants: list[str]
    build: Callable
    batch: Callable
    loss: Callable


def _lm_batch(step, vocab, batch, seq, device):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    return (tokens[:, :-1],), tokens[:, 1:]


def _lm_loss(out, target):
    return F.cross_entropy(out.float().flatten(0, 1), target.flatten())


def _llama(name, hidden, dtype, device, smoke):
    vocab, layers, seq, batch = (256, 1, 16, 2) if smoke else (32000, 4, 1024, 4)
    heads = max(hidden // 128, 2) if not smoke else 2
    factories = _norm_factories(device)

    def build(variant):
        torch.manual_seed(0)
        norm = factories[variant]
        model = _LM(vocab, hidden, heads, layers, lambda: norm(hidden, device, dtype), device=device, dtype=dtype)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    return Workload(name, list(factories), build, lambda step: _lm_batch(step, vocab, batch, seq, device), _lm_loss)


def _dlrm(name, optimizer, sparse, device, smoke):
    tables, dim, batch, bag = (8, 16, 64, 4) if smoke else (8, 64, 8192, 20)
    rows = [1000] * tables if smoke else [725_000] * tables  # 5.8M rows
    dense_features = 13

    def build(variant):
        torch.manual_seed(0)
        bag_cls = baracuda_ops.nn.EmbeddingBag if variant == "ours" else nn.EmbeddingBag
        model = _DLRM(rows, dim, dense_features, bag_cls, sparse, device)
        if variant == "ours-collection":
            model = _DLRMCollection(model, device)
        if optimizer == "adagrad":
            return model, torch.optim.Adagrad(model.parameters(), lr=0.01)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        dense = torch.randn(batch, dense_features, generator=g).to(device)
        indices = [torch.randint(0, r, (batch * bag,), generator=g).to(device) for r in rows]
        offsets = [torch.arange(0, batch * bag, bag, device=device) for _ in rows]
        target = torch.randint(0, 2, (batch,), generator=g).float().to(device)
        return (dense, indices, offsets), target

    # the collection's gradients are dense: it stands beside the dense-gradient models only
    variants = ["torch", "ours"] + ([] if sparse else ["ours-collection"])
    return Workload(name, variants, build, make_batch,
                    lambda out, target: F.binary_cross_entropy_with_logits(out, target))


def _alibi_lm(device, smoke):
    vocab, hidden, heads, layers, seq, batch = (256, 32, 2, 1, 16, 2) if smoke else (32000, 1024, 16, 4, 1024, 4)
    dtype = torch.float32 if smoke else torch.bfloat16

    def build(variant):
        torch.manual_seed(0)
        alibi = (lambda: _TorchALiBi(heads, device)) if variant == "torch" else (
            lambda: baracuda_ops.nn.ALiBi(heads, device=device))
        norm = lambda: nn.LayerNorm(hidden, device=device, dtype=dtype)  # noqa: E731
        model = _LM(vocab, hidden, heads, layers, norm, alibi, device=device, dtype=dtype)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    return Workload("alibi-lm", ["torch", "ours"], build, lambda step: _lm_batch(step, vocab, batch, seq, device),
                    _lm_loss)


def _cnn(device, smoke):
    batch, width, size = (4, 4, 16) if smoke else (256, 64, 32)

    def build(variant):
        torch.manual_seed(0)
        pool = torch.nn.FractionalMaxPool2d if variant == "torch" else baracuda_ops.nn.FractionalMaxPool2d
        model = _CNN(pool, width, device)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch, 3, size, size, generator=g).to(device)
        return (x,), torch.randint(0, 10, (batch,), generator=g).to(device)

    return Workload("cnn-fmp", ["torch", "ours"], build, make_batch, F.cross_entropy)


def workloads(device: torch.device, smoke: bool) -> list[Workload]:
    return [
        _llama("llama-256-fp32", 32 if smoke else 256, torch.float32, device, smoke),
        _llama("llama-2048-bf16", 64 if smoke else 2048, torch.float32 if smoke else torch.bfloat16, device, smoke),
        _dlrm("dlrm-dense-sgd", "sgd", False, device, smoke),
        _dlrm("dlrm-sparse-sgd", "sgd", True, device, smoke),
        _dlrm("dlrm-adagrad", "adagrad", False, device, smoke),
        _alibi_lm(device, smoke),
        _cnn(device, smoke),
    ]


# ---------------------------------------------------------------------------- runner


def _run(workload: Workload, variant: str, compiled: bool, device, steps: int, warmup: int) -> dict:
    model, opt = workload.build(variant)
    forward = torch.compile(model) if compiled else model
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    torch.manual_seed(1)  # the fractional pools' random samples
    for step in range(warmup + steps):
        inputs, target = workload.batch(step)
        sync()
        start = time.perf_counter()
        loss = workload.loss(forward(*inputs), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"model": workload.name, "variant": variant, "compiled": compiled, "median_ms": statistics.median(times),
            "peak_mib": peak, "losses": losses}


def run(device: torch.device, steps: int, warmup: int, compile_too: bool, smoke: bool,
        models: list[str] | None = None) -> list[dict]:
    results = []
    for workload in workloads(device, smoke):
        if models is not None and workload.name not in models:
            continue
        for compiled in (False, True) if compile_too else (False,):
            reference = None
            for variant in workload.variants:
                r = _run(workload, variant, compiled, device, steps, warmup)
                if reference is None:
                    reference = r
                r["speedup_vs_torch"] = reference["median_ms"] / r["median_ms"]
                r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], reference["losses"]))
                results.append(r)
                if compiled:
                    torch._dynamo.reset()
    return results


def format_table(results: list[dict]) -> str:
    lines = [f"{'model':<18} {'variant':<15} {'mode':<8} {'median ms':>10} {'vs torch':>9} {'peak MiB':>9} "
             f"{'max |dloss|':>12}"]
    for r in results:
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        lines.append(f"{r['model']:<18} {r['variant']:<15} {'compiled' if r['compiled'] else 'eager':<8} "
                     f"{r['median_ms']:>10.3f} {r['speedup_vs_torch']:>8.2f}x {peak:>9} {r['max_loss_diff']:>12.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, eager, 2 steps: a check that it runs")
    p.add_argument("--json", help="write the results (loss curves included) to this file")
    p.add_argument("--models", help="only these models (comma-separated names, e.g. dlrm-dense-sgd,dlrm-adagrad)")
    args = p.parse_args(argv)
    if args.smoke:
        device, steps, warmup, compile_too = torch.device("cpu"), 2, 1, False
    else:
        device, steps, warmup, compile_too = torch.device(args.device), args.steps, args.warmup, not args.no_compile
    models = args.models.split(",") if args.models else None
    unknown = sorted(set(models or []) - {w.name for w in workloads(torch.device("cpu"), True)})
    if unknown:
        p.error(f"unknown models {unknown}")
    results = run(device, steps, warmup, compile_too, args.smoke, models)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
