"""Hugging Face transformers: run a model's RMSNorm layers on baracuda ops.

``apply(model)`` patches a built model in place: each RMSNorm module of a known family
gets a subclass of its own class whose ``forward`` calls baracuda (``isinstance`` still
holds; parameters, ``state_dict``, eps, dtype and device are untouched) and the call
returns what it replaced. ``patch_transformers(models=[...])`` patches the norm classes
themselves before a model is built, as Liger-Kernel's ``apply_liger_kernel_to_*`` do.

The arithmetic of each family's norm (transformers' ``modeling_<family>.py``), with
``x̂ = x · rsqrt(mean(x²) + eps)`` computed in float32:

- ``"llama"`` (Llama, Mistral, Qwen2, Qwen3 including its per-head ``q_norm``/``k_norm``):
  ``w · round(x̂)``, ``round`` to the input dtype, eps in ``variance_epsilon``.
- ``"gemma"`` (Gemma, Gemma2, Gemma3 including ``q_norm``/``k_norm``):
  ``round(x̂ · (1 + w))``, the product in float32, eps in ``eps``.

``baracuda_ops.rms_norm_fused`` is called with ``casting="llama"`` or ``casting="gemma",
weight_offset=1.0``, which reproduce those.

With ``fused_add_rms_norm`` (the default), each decoder layer (``LAYERS``) also gets a subclass
whose forward takes the residual add into the norm after attention (see "decoder layers"
below); it is checked against the layer's own forward on a probe input first.

Nothing changes silently: before patching, each norm class's new forward is checked
against the class's own forward on random float32 and bfloat16 inputs (within the
dtype's rounding); if any class of the model fails, nothing is patched and a warning
says why. Models of other families, and those whose norms are LayerNorm with the ALiBi
bias built inside HF's attention (BLOOM, MPT, Falcon: use ``baracuda_ops.alibi`` on
their 3-D ``[B*H, Q, K]`` scores or ``baracuda_ops.alibi_bias`` in attention code), are
left unchanged with a warning.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from typing import Callable

import torch

import baracuda_ops

__all__ = ["apply", "revert", "patch_transformers", "unpatch_transformers", "FAMILIES", "LAYERS"]

# model_type -> (transformers.models.<module>, RMSNorm class names, arithmetic)
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "llama": ("llama", ("LlamaRMSNorm",), "llama"),
    "mistral": ("mistral", ("MistralRMSNorm",), "llama"),
    "qwen2": ("qwen2", ("Qwen2RMSNorm",), "llama"),
    "qwen3": ("qwen3", ("Qwen3RMSNorm",), "llama"),
    "gemma": ("gemma", ("GemmaRMSNorm",), "gemma"),
    "gemma2": ("gemma2", ("Gemma2RMSNorm",), "gemma"),
    "gemma3": ("gemma3", ("Gemma3RMSNorm",), "gemma"),
    "gemma3_text": ("gemma3", ("Gemma3RMSNorm",), "gemma"),
}

# Families whose norms are LayerNorm and whose ALiBi bias HF builds inside its attention.
_ALIBI_LAYERNORM_FAMILIES = ("bloom", "mpt", "falcon")


def _llama_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return baracuda_ops.rms_norm_fused(hidden_states, self.weight.shape, self.weight, self.variance_epsilon,
                                       casting="llama")


def _gemma_forward(self, x: torch.Tensor) -> torch.Tensor:
    return baracuda_ops.rms_norm_fused(x, self.weight.shape, self.weight, self.eps, weight_offset=1.0,
                                       casting="gemma")


def _forward_for(arithmetic: str) -> Callable:
    """The forward of a norm of this arithmetic."""
    return _llama_forward if arithmetic == "llama" else _gemma_forward


# ---------------------------------------------------------------------------- decoder layers
#
# Fused residual add + norm: where a decoder layer computes ``h = residual + x`` and then
# ``norm(h)`` with ``h`` kept as the next residual, one ``rms_norm_fused(x, residual=residual)``
# returns both ``(norm(h), h)``: h is written once and not read back for the norm. ``h`` is
# rounded to the residual's dtype as HF's ``residual + x`` is. The add before the next
# layer's ``input_layernorm`` stays in the layer: fusing it would change what a layer returns,
# which the model's own loop reads.


def _llama_add_norm(norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor):
    return baracuda_ops.rms_norm_fused(x, norm.weight.shape, norm.weight, norm.variance_epsilon,
                                       residual=residual, casting="llama")


def _gemma_add_norm(norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor):
    return baracuda_ops.rms_norm_fused(x, norm.weight.shape, norm.weight, norm.eps, residual=residual,
                                       weight_offset=1.0, casting="gemma")


def _pre_norm_layer_forward(add_norm: Callable) -> Callable:
    """Llama's layer: ``h = r + attn(in_norm(r)); out = h + mlp(post_attention_layernorm(h))``."""

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states, residual = add_norm(self.post_attention_layernorm, hidden_states, residual)
        return residual + self.mlp(hidden_states)

    return forward


def _sandwich_layer_forward(add_norm: Callable) -> Callable:
    """Gemma 2/3's layer: ``h = r + post_attention_layernorm(attn(in_norm(r)));
    out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``."""

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states, residual = add_norm(self.pre_feedforward_layernorm,
                                           self.post_attention_layernorm(hidden_states), residual)
        return residual + self.post_feedforward_layernorm(self.mlp(hidden_states))

    return forward


_ADD_NORMS = {"llama": _llama_add_norm, "gemma": _gemma_add_norm}
_LAYER_FORWARDS = {
    (structure, arithmetic): make(add_norm)
    for structure, make in (("pre_norm", _pre_norm_layer_forward), ("sandwich", _sandwich_layer_forward))
    for arithmetic, add_norm in _ADD_NORMS.items()
}

# model_type -> (decoder layer class name, structure of its forward)
LAYERS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaDecoderLayer", "pre_norm"),
    "mistral": ("MistralDecoderLayer", "pre_norm"),
    "qwen2": ("Qwen2DecoderLayer", "pre_norm"),
    "qwen3": ("Qwen3DecoderLayer", "pre_norm"),
    "gemma": ("GemmaDecoderLayer", "pre_norm"),
    "gemma2": ("Gemma2DecoderLayer", "sandwich"),
    "gemma3": ("Gemma3DecoderLayer", "sandwich"),
    "gemma3_text": ("Gemma3DecoderLayer", "sandwich"),
}

# relative to the layer output's largest magnitude: one layer of float32 / bfloat16 rounding
_LAYER_TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _check_layer(cls: type, layer: torch.nn.Module, forward: Callable) -> str | None:
    """``_compare_layer`` once per layer class, forward and weight dtype."""
    weight = next(layer.parameters(), None)
    key = (cls, forward, None if weight is None else weight.dtype)
    if key not in _layers_checked:
        _layers_checked[key] = _compare_layer(cls, layer, forward)
    return _layers_checked[key]


def _compare_layer(cls: type, layer: torch.nn.Module, forward: Callable) -> str | None:
    """None when ``forward`` matches the layer class's own forward on a probe input (the
    layer's own weights, device and dtype; no mask; random rotary cos/sin), else why not."""
    weight = next(layer.parameters(), None)
    if weight is None or weight.device.type == "meta" or not weight.dtype.is_floating_point:
        return f"{cls.__name__}: no materialized floating-point weights to probe"
    head_dim = getattr(getattr(layer, "self_attn", None), "head_dim", None)
    hidden = getattr(getattr(layer, "input_layernorm", None), "weight", None)
    if head_dim is None or hidden is None:
        return f"{cls.__name__}: no self_attn.head_dim or input_layernorm.weight"
    generator = torch.Generator().manual_seed(0)
    seq = 4

    def rand(*shape):
        return torch.randn(shape, generator=generator).to(device=weight.device, dtype=weight.dtype)

    x = rand(1, seq, hidden.shape[-1])
    kwargs = dict(attention_mask=None, position_ids=torch.arange(seq, device=weight.device)[None],
                  position_embeddings=(rand(1, seq, head_dim), rand(1, seq, head_dim)))
    training = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            want, got = cls.forward(layer, x, **kwargs), forward(layer, x, **kwargs)
    except Exception as e:  # noqa: BLE001  (the reason goes into the warning)
        return f"{cls.__name__}: {type(e).__name__}: {e}"
    finally:
        layer.train(training)
    if not isinstance(want, torch.Tensor) or want.dtype != got.dtype or want.shape != got.shape:
        return f"{cls.__name__}: HF's forward returns {type(want).__name__}, not a tensor like ours"
    err = (got.float() - want.float()).abs().max().item()
    if not err <= _LAYER_TOLERANCES.get(want.dtype, 2e-2) * max(want.float().abs().max().item(), 1.0):
        return f"{cls.__name__} on {want.dtype}: differs from HF's forward by up to {err:.3g}"
    return None


# ---------------------------------------------------------------------------- the check


_CHECK_TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}
_checked: dict[tuple[type, Callable], str | None] = {}
_layers_checked: dict[tuple[type, Callable, torch.dtype | None], str | None] = {}
_original_forward: dict[type, Callable] = {}  # classes patched by patch_transformers


def _check(cls: type, module: torch.nn.Module, forward: Callable) -> str | None:
    """None when ``forward`` matches the class's own forward on random inputs in float32
    and bfloat16 (on the CPU, a copy of ``module`` with a random weight), else why not."""
    key = (cls, forward)
    if key not in _checked:
        _checked[key] = _compare(cls, module, forward)
    return _checked[key]


def _compare(cls: type, module: torch.nn.Module, forward: Callable) -> str | None:
    reference = _original_forward.get(cls, cls.forward)
    probe = copy.deepcopy(module)
    if any(p.device.type == "meta" for p in probe.parameters()):
        probe = probe.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for dtype, (rtol, atol) in _CHECK_TOLERANCES.items():
            probe = probe.to(device="cpu", dtype=dtype)
            probe.weight.copy_(torch.randn(probe.weight.shape, generator=generator) * 0.5)
            x = torch.randn((5, *probe.weight.shape), generator=generator).to(dtype)
            try:
                want, got = reference(probe, x), forward(probe, x)
            except Exception as e:  # noqa: BLE001  (the reason goes into the warning)
                return f"{cls.__name__} on {dtype}: {type(e).__name__}: {e}"
            if want.dtype != got.dtype or want.shape != got.shape:
                return (f"{cls.__name__} on {dtype}: returns {got.dtype} {list(got.shape)}, "
                        f"HF {want.dtype} {list(want.shape)}")
            if not torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol):
                err = (got.float() - want.float()).abs().max().item()
                return f"{cls.__name__} on {dtype}: differs from HF's forward by up to {err:.3g}"
    return None


# ---------------------------------------------------------------------------- built models

_subclasses: dict[tuple[type, Callable], type] = {}


def _patched_class(cls: type, forward: Callable) -> type:
    """``cls`` with ``forward`` (one subclass per class and forward)."""
    key = (cls, forward)
    if key not in _subclasses:
        _subclasses[key] = type(f"Baracuda{cls.__name__}", (cls,), {"forward": forward, "_baracuda_base": cls})
    return _subclasses[key]


def _model_type(model: torch.nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


def apply(model: torch.nn.Module, rms_norm: bool = True, fused_add_rms_norm: bool = True,
          alibi: bool = True) -> dict[str, str]:
    """Patches a built Hugging Face model in place: its RMSNorm modules (``rms_norm``) and
    its decoder layers' residual add + norm (``fused_add_rms_norm``). ``alibi``: BLOOM, MPT
    and Falcon build a ``[B*H or H, 1, K]`` bias of key positions (softmax-equivalent to
    ``slopes * (j - i)``, K values per head) that they add inside their attention; that
    construction costs less than a launch and is kept, so these models are left unchanged
    with a warning (their attention code can call ``baracuda_ops.alibi`` on its ``[B*H, Q, K]``
    scores, or take ``baracuda_ops.alibi_bias(..., layout="bqk")``).

    Returns ``{module name: original class name}`` of what it replaced (empty when nothing
    was patched); :func:`revert` undoes it. A model of an unknown family, or one whose
    norms or layers do not pass the check, is left unchanged with a warning.
    """
    model_type = _model_type(model)
    if model_type in _ALIBI_LAYERNORM_FAMILIES:
        alibi_note = ("; its ALiBi bias of key positions, [B*H or H, 1, K], is kept (cheaper than a launch; "
                      "baracuda_ops.alibi takes its [B*H, Q, K] scores, baracuda_ops.alibi_bias builds the bias)"
                      if alibi else "")
        warnings.warn(
            f"baracuda_ops.integrations.transformers.apply: {model_type} uses LayerNorm (no RMSNorm to patch)"
            f"{alibi_note}; model left unchanged",
            stacklevel=2,
        )
        return {}
    if model_type not in FAMILIES:
        warnings.warn(
            f"baracuda_ops.integrations.transformers.apply: model type {model_type!r} is not one of "
            f"{sorted(FAMILIES)}; model left unchanged",
            stacklevel=2,
        )
        return {}
    _, class_names, arithmetic = FAMILIES[model_type]
    wanted: list[tuple[tuple[str, ...], Callable, Callable]] = []  # (class names, forward, check)
    if rms_norm:
        wanted.append((class_names, _forward_for(arithmetic), _check))
    if fused_add_rms_norm:
        layer_name, structure = LAYERS[model_type]
        wanted.append(((layer_name,), _LAYER_FORWARDS[(structure, arithmetic)], _check_layer))
    plan: list[tuple[str, torch.nn.Module, type, Callable]] = []
    for names, forward, check in wanted:
        for name, module in model.named_modules():
            cls = type(module)
            if cls.__name__ in names and cls.__module__.startswith("transformers.") and cls not in _original_forward:
                reason = check(cls, module, forward)
                if reason is not None:
                    warnings.warn(
                        f"baracuda_ops.integrations.transformers.apply: {reason}; model left unchanged", stacklevel=2
                    )
                    return {}
                plan.append((name, module, cls, forward))
    for _, module, cls, forward in plan:
        module.__class__ = _patched_class(cls, forward)
    return {name: cls.__name__ for name, _, cls, _ in plan}


def revert(model: torch.nn.Module) -> list[str]:
    """Undoes :func:`apply` on ``model``; returns the names of the modules restored."""
    restored = []
    for name, module in model.named_modules():
        base = type(module).__dict__.get("_baracuda_base")
        if base is not None:
            module.__class__ = base
            restored.append(name)
    return restored


# ---------------------------------------------------------------------------- classes


def patch_transformers(models: list[str] | tuple[str, ...] | None = None) -> dict[str, str]:
    """Patches the RMSNorm classes of the given model families (``FAMILIES`` keys, e.g.
    ``["llama", "qwen3"]``; default: every family the installed transformers has) so models
    built afterwards run on baracuda. Returns ``{class: its module}`` of what it patched.
    Unknown names, families the installed transformers lacks and classes that fail the
    check are skipped with a warning, and then nothing is patched."""
    names = list(FAMILIES) if models is None else list(models)
    todo: dict[type, Callable] = {}
    problems = []
    for name in names:
        if name not in FAMILIES:
            problems.append(f"model type {name!r} is not one of {sorted(FAMILIES)}")
            continue
        module_name, class_names, arithmetic = FAMILIES[name]
        try:
            modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        except ImportError:
            if models is not None:
                problems.append(f"the installed transformers has no {name}")
            continue
        forward = _forward_for(arithmetic)
        for class_name in class_names:
            cls = getattr(modeling, class_name, None)
            if cls is None:
                problems.append(f"transformers has no {module_name}.{class_name}")
            elif cls not in _original_forward:
                reason = _check(cls, cls(8), forward)
                if reason is not None:
                    problems.append(reason)
                todo[cls] = forward
    if problems:
        warnings.warn(
            "baracuda_ops.integrations.transformers.patch_transformers: " + "; ".join(problems)
            + "; nothing patched",
            stacklevel=2,
        )
        return {}
    for cls, forward in todo.items():
        _original_forward[cls] = cls.forward
        cls.forward = forward
    return {cls.__name__: cls.__module__ for cls in todo}


def unpatch_transformers() -> list[str]:
    """Restores every class :func:`patch_transformers` patched; returns their names."""
    restored = []
    for cls, forward in list(_original_forward.items()):
        cls.forward = forward
        del _original_forward[cls]
        restored.append(cls.__name__)
    return restored
