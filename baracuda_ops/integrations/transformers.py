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

__all__ = ["apply", "revert", "patch_transformers", "unpatch_transformers", "FAMILIES"]

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


# ---------------------------------------------------------------------------- the check


_CHECK_TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}
_checked: dict[tuple[type, Callable], str | None] = {}
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


def apply(model: torch.nn.Module, rms_norm: bool = True) -> dict[str, str]:
    """Patches the RMSNorm modules of a built Hugging Face model in place.

    Returns ``{module name: original class name}`` of what it replaced (empty when nothing
    was patched); :func:`revert` undoes it. A model of an unknown family, or one whose
    norms do not pass the check, is left unchanged with a warning.
    """
    model_type = _model_type(model)
    if model_type in _ALIBI_LAYERNORM_FAMILIES:
        warnings.warn(
            f"baracuda_ops.integrations.transformers.apply: {model_type} uses LayerNorm and builds its ALiBi bias "
            "inside HF's attention; model left unchanged (baracuda_ops.alibi takes its [B*H, Q, K] scores, "
            "baracuda_ops.alibi_bias builds the bias)",
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
    if not rms_norm:
        return {}
    _, class_names, arithmetic = FAMILIES[model_type]
    forward = _forward_for(arithmetic)
    plan: list[tuple[str, torch.nn.Module, type]] = []
    for name, module in model.named_modules():
        cls = type(module)
        if cls.__name__ in class_names and cls.__module__.startswith("transformers.") and cls not in _original_forward:
            reason = _check(cls, module, forward)
            if reason is not None:
                warnings.warn(
                    f"baracuda_ops.integrations.transformers.apply: {reason}; model left unchanged", stacklevel=2
                )
                return {}
            plan.append((name, module, cls))
    for _, module, cls in plan:
        module.__class__ = _patched_class(cls, forward)
    return {name: cls.__name__ for name, _, cls in plan}


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
