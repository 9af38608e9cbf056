"""baracuda_ops.integrations.transformers on Hugging Face models built from tiny configs
(random weights, nothing downloaded): patched logits and gradients equal the unpatched
model's, state_dict unchanged, torch.compile fullgraph, unknown models left unchanged."""

import pathlib
import re
import subprocess
import sys

import pytest
import torch
import transformers

import baracuda_ops
from baracuda_ops.integrations import transformers as hf

_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)

# model_type -> (config class, causal-LM class, extra config, RMSNorm modules of the tiny model)
_MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, 5),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, 5),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, 5),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}, 9),  # + q_norm, k_norm per layer
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}, 5),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8, "query_pre_attn_scalar": 8}, 9),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8, "query_pre_attn_scalar": 8}, 13),
}

# patched vs unpatched: float32 differs by float32 rounding; bfloat16 by a rounding of the
# norm's output (llama-style norms round x̂ before the weight product in HF) carried
# through two layers.
_TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}


def _build(model_type, dtype=torch.float32, seed=0):
    config_name, model_name, extra, _ = _MODELS[model_type]
    config = getattr(transformers, config_name)(**_TINY, **extra, attn_implementation="eager")
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(dtype)
    with torch.no_grad():  # Gemma's norms start at w = 0 (scale 1 + w): make every weight matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    return model


def _logits_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


def _inputs():
    return torch.randint(0, _TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fused_add", [False, True], ids=["norms", "norms+fused_add"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model_type", list(_MODELS))
def test_apply_keeps_logits_grads_and_state_dict(model_type, dtype, fused_add):
    model = _build(model_type, dtype)
    ids = _inputs()
    want_logits, want_grads = _logits_and_grads(model, ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {n: type(m) for n, m in model.named_modules()}

    replaced = hf.apply(model, fused_add_rms_norm=fused_add)

    norm_class = hf.FAMILIES[model_type][1][0]
    layer_class = hf.LAYERS[model_type][0]
    norms = {n for n, c in replaced.items() if c == norm_class}
    layers = {n for n, c in replaced.items() if c == layer_class}
    assert len(norms) == _MODELS[model_type][3] and norms | layers == set(replaced)
    assert layers == ({f"model.layers.{i}" for i in range(_TINY["num_hidden_layers"])} if fused_add else set())
    for name in replaced:
        module = model.get_submodule(name)
        assert isinstance(module, classes[name]) and type(module) is not classes[name]
    assert all(type(m) is classes[n] for n, m in model.named_modules() if n not in replaced)
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], v) for k, v in state.items())
    got_logits, got_grads = _logits_and_grads(model, ids)
    torch.testing.assert_close(got_logits, want_logits, **_TOLERANCE[dtype])
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **_TOLERANCE[dtype], msg=name)

    assert sorted(hf.revert(model)) == sorted(replaced)
    assert all(type(m) is classes[n] for n, m in model.named_modules())


def test_patched_norms_call_baracuda(monkeypatch):
    model = _build("qwen3")
    hf.apply(model, fused_add_rms_norm=False)
    calls = []
    real = baracuda_ops.rms_norm_fused
    monkeypatch.setattr(baracuda_ops, "rms_norm_fused", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    model(input_ids=_inputs(), use_cache=False)
    assert len(calls) == _MODELS["qwen3"][3] and set(calls) == {1e-5}  # eps carried (variance_epsilon)


@pytest.mark.parametrize("model_type", ["llama", "gemma", "gemma2"])
def test_compile_fullgraph(model_type):
    model = _build(model_type)
    replaced = hf.apply(model)
    assert hf.LAYERS[model_type][0] in replaced.values()  # the fused residual add + norm is compiled too
    ids = _inputs()
    eager = model(input_ids=ids, use_cache=False).logits
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(input_ids=ids, use_cache=False).logits, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_fused_add_norm_takes_the_residual(monkeypatch, model_type):
    # Each layer's add before its middle norm (llama: post_attention_layernorm; gemma2:
    # pre_feedforward_layernorm) is one rms_norm_fused call with the residual.
    model = _build(model_type)
    hf.apply(model, rms_norm=False)
    residuals = []
    real = baracuda_ops.rms_norm_fused
    monkeypatch.setattr(baracuda_ops, "rms_norm_fused",
                        lambda *a, **k: residuals.append(k.get("residual") is not None) or real(*a, **k))
    model(input_ids=_inputs(), use_cache=False)
    assert residuals == [True] * _TINY["num_hidden_layers"]


def test_a_layer_that_fails_the_check_leaves_the_model_unpatched(monkeypatch):
    # Gemma2's sandwich layer claimed to be Llama-shaped: the probe against HF's own forward catches it,
    # and the norms (which pass their own check) are not patched either.
    monkeypatch.setitem(hf.LAYERS, "gemma2", ("Gemma2DecoderLayer", "pre_norm"))
    model = _build("gemma2")
    classes = {n: type(m) for n, m in model.named_modules()}
    with pytest.warns(UserWarning, match="Gemma2DecoderLayer on torch.float32: differs from HF's forward by up to"):
        assert hf.apply(model) == {}
    assert all(type(m) is classes[n] for n, m in model.named_modules())


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_patched_norms_ask_for_hf_casting(monkeypatch, model_type):
    # The patched norms run rms_norm_fused with HF's casting (llama: x-hat rounded before the weight
    # product; gemma: (1 + w) in float32): bfloat16 logits within one rounding of HF's.
    model = _build(model_type, torch.bfloat16)
    ids = _inputs()
    want = model(input_ids=ids, use_cache=False).logits
    calls = []
    real = baracuda_ops.rms_norm_fused
    monkeypatch.setattr(baracuda_ops, "rms_norm_fused", lambda *a, **k: calls.append(k["casting"]) or real(*a, **k))
    hf.apply(model)
    torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, want, rtol=1.6e-2, atol=1e-2)
    assert set(calls) == {hf.FAMILIES[model_type][2]}
    hf.revert(model)


def test_unknown_and_alibi_models_warn_and_stay_unchanged():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64))
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(hidden_size=32, n_layer=1, n_head=4,
                                                                   vocab_size=64))
    for model, text in ((gpt2, "model type 'gpt2' is not one of"), (bloom, "bloom uses LayerNorm")):
        classes = {n: type(m) for n, m in model.named_modules()}
        with pytest.warns(UserWarning, match=text):
            assert hf.apply(model) == {}
        assert all(type(m) is classes[n] for n, m in model.named_modules())
    with pytest.warns(UserWarning, match="is not one of"):
        assert hf.apply(torch.nn.Linear(2, 2)) == {}


def test_a_norm_that_fails_the_check_leaves_the_model_unpatched(monkeypatch):
    # Llama's norms claimed to be Gemma-style: the check against HF's own forward catches it.
    monkeypatch.setitem(hf.FAMILIES, "llama", ("llama", ("LlamaRMSNorm",), "gemma"))
    model = _build("llama")
    for m in model.modules():
        if type(m).__name__ == "LlamaRMSNorm":
            m.eps = m.variance_epsilon  # the attribute the Gemma forward reads: only the arithmetic differs
    classes = {n: type(m) for n, m in model.named_modules()}
    with pytest.warns(UserWarning, match="LlamaRMSNorm on torch.float32: differs from HF's forward by up to"):
        assert hf.apply(model) == {}
    assert all(type(m) is classes[n] for n, m in model.named_modules())


def test_patch_transformers_before_the_model_is_built():
    ids = _inputs()
    want_logits, want_grads = _logits_and_grads(_build("qwen3"), ids)
    try:
        patched = hf.patch_transformers(models=["qwen3"])
        assert patched == {"Qwen3RMSNorm": "transformers.models.qwen3.modeling_qwen3"}
        model = _build("qwen3")
        assert hf.apply(model, fused_add_rms_norm=False) == {}  # its norm classes run on baracuda already
        got_logits, got_grads = _logits_and_grads(model, ids)
    finally:
        assert hf.unpatch_transformers() == ["Qwen3RMSNorm"]
    torch.testing.assert_close(got_logits, want_logits, **_TOLERANCE[torch.float32])
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **_TOLERANCE[torch.float32], msg=name)
    with pytest.warns(UserWarning, match="model type 'gpt2' is not one of .*; nothing patched"):
        assert hf.patch_transformers(models=["llama", "gpt2"]) == {}
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    assert LlamaRMSNorm.forward.__module__ == "transformers.models.llama.modeling_llama"


def test_hf_train_smoke():
    # tools/hf_train.py --smoke: a tiny Llama trained 3 steps on the CPU as it is and patched by us, each in its
    # own process; the patched model's losses equal HF's and the patch reports what it replaced
    tool = pathlib.Path(__file__).resolve().parent.parent / "tools" / "hf_train.py"
    run = subprocess.run([sys.executable, str(tool), "--smoke", "--ways", "hf,baracuda"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "baracuda: 5 norm modules and 2 decoder layers (fused residual add + norm) patched" in run.stdout
    diff = re.search(r"baracuda vs hf: max \|loss difference\| (\S+),", run.stdout)
    assert diff is not None and float(diff.group(1)) < 1e-5, run.stdout
