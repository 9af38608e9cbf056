"""A Hugging Face Llama trained a few steps several ways: as it is (``hf``), patched by Liger-Kernel
(``liger``: its RMSNorm, RoPE, SwiGLU and fused linear cross-entropy), patched by baracuda_ops
(``baracuda``: baracuda_ops.integrations.transformers.apply, its norms and each decoder layer's
residual add + norm fused; ``baracuda_norms`` patches the norms only), Liger's RMSNorm alone
(``liger_norms``: the like-for-like peer of ``baracuda``), and Liger's other kernels with our norms
(``liger+baracuda``: Liger with rms_norm=False, then ours).

Every way starts from the same weights and sees the same random tokens; each prints
tokens/s (steps after the warm-up), peak memory and its loss per step, then the largest
loss difference to the unpatched model. Default: a ~1B-parameter Llama (hidden 2048,
16 layers, 32 heads, 8 KV heads, MLP 5632, vocab 32000) in bfloat16, batch 4 x 2048
tokens, 50 steps of AdamW, on CUDA. ``--smoke``: a tiny model on the CPU, 3 steps, to
check the script itself. Liger is skipped (said so) when ``liger_kernel`` is not installed.
On a machine without a package index, wheels fetched elsewhere (``pip download --no-deps
--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl_hf transformers
liger-kernel``) install with ``pip install --no-index --find-links .whl_hf transformers liger-kernel``.

    python tools/hf_train.py [--steps 50] [--batch 4] [--seq 2048] [--ways hf,liger,baracuda] [--smoke]
                             (ways: hf, liger, liger_norms, baracuda, baracuda_norms, liger+baracuda)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import transformers

from baracuda_ops.integrations import transformers as baracuda_hf


def _config(smoke: bool) -> transformers.LlamaConfig:
    if smoke:
        return transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                                    rms_norm_eps=1e-5, attn_implementation="sdpa")


def _patch(way: str, model: torch.nn.Module) -> bool:
    """Patches ``model`` the given way; False when that way is not available here."""
    if way.startswith("liger"):
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except ImportError:
            print(f"  {way}: liger_kernel is not installed, skipped")
            return False
        if way == "liger_norms":
            apply_liger_kernel_to_llama(rope=False, swiglu=False, cross_entropy=False,
                                        fused_linear_cross_entropy=False, rms_norm=True, model=model)
        else:
            apply_liger_kernel_to_llama(rms_norm=way == "liger", model=model)
        if way == "liger":
            return True
    if way in ("baracuda", "baracuda_norms", "liger+baracuda"):
        replaced = baracuda_hf.apply(model, fused_add_rms_norm=way != "baracuda_norms")
        layers = sum(name == baracuda_hf.LAYERS["llama"][0] for name in replaced.values())
        print(f"  {way}: {len(replaced) - layers} norm modules and {layers} decoder layers (fused residual add + "
              "norm) patched")
        return bool(replaced)
    return way in ("hf", "liger_norms")


def _run(way: str, config, state: dict, batches: list[torch.Tensor], device, dtype, warmup: int):
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(state)
    model.to(dtype)
    if not _patch(way, model):
        return None
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, start = [], None
    for step, ids in enumerate(batches):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    tokens = sum(ids.numel() for ids in batches[warmup:])
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {"losses": [float(x) for x in losses], "tokens_per_s": tokens / seconds, "peak_gib": peak}


def _setup(args):
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    config = _config(args.smoke)
    torch.manual_seed(0)
    with torch.device(device):
        state = transformers.LlamaForCausalLM(config).state_dict()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=generator).to(device)
               for _ in range(args.steps)]
    return device, dtype, config, state, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--ways", default="hf,liger,baracuda")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU, 3 steps")
    parser.add_argument("--one-way", help=argparse.SUPPRESS)  # internal: run this way, print its result as JSON
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.batch, args.seq = 3, 2, 32
    warmup = 1 if args.smoke else 5
    if args.one_way:
        device, dtype, config, state, batches = _setup(args)
        print(json.dumps(_run(args.one_way, config, state, batches, device, dtype, warmup)))
        return
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    with torch.device("meta"):  # the parameter count only: no weights are made here
        params = sum(p.numel() for p in transformers.LlamaForCausalLM(_config(args.smoke)).parameters())
    print(f"Llama {params / 1e9:.2f}B parameters, {dtype}, batch {args.batch} x {args.seq}, {args.steps} steps "
          f"on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    # Each way in a process of its own: Liger patches transformers' modules (RoPE, the MLP class), which would
    # carry over into the ways after it.
    results = {}
    for way in args.ways.split(","):
        print(f"{way}:")
        argv = [sys.executable, __file__, "--one-way", way, "--steps", str(args.steps), "--batch", str(args.batch),
                "--seq", str(args.seq)] + (["--smoke"] if args.smoke else [])
        child = subprocess.run(argv, capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stdout + child.stderr)
            raise SystemExit(f"{way}: the run failed")
        lines = child.stdout.strip().splitlines()
        for line in lines[:-1]:
            print(line)
        result = json.loads(lines[-1])
        if result is not None:
            results[way] = result
            print(f"  {result['tokens_per_s']:.0f} tokens/s, peak {result['peak_gib']:.2f} GiB, losses "
                  + " ".join(f"{x:.4f}" for x in result["losses"]))
    if "hf" in results:
        base = results["hf"]["losses"]
        for way, result in results.items():
            if way != "hf":
                diff = max(abs(a - b) for a, b in zip(result["losses"], base))
                speed = result["tokens_per_s"] / results["hf"]["tokens_per_s"]
                print(f"{way} vs hf: max |loss difference| {diff:.2e}, {speed:.3f}x the tokens/s")


if __name__ == "__main__":
    main()
