"""The attention kind's find job: whether a transformers model dispatches attention through AttentionInterface
(`can_switch_attention`; its layers are found by running it, in flow.py) and the configs it dispatches on
(`attention_configs`); on a Diffusers denoiser every module with a processor (`diffusers_attention_modules`) and the
width of the encoder states it attends to (`encoder_width`). Read from attributes, never by running anything."""

from __future__ import annotations

from typing import Any


def attention_configs(model: Any) -> list[Any]:
    """Every distinct config a module of `model` dispatches attention on."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in seen:
            seen[id(cfg)] = cfg
    return list(seen.values())


def can_switch_attention(model: Any) -> tuple[bool, str]:
    """Does this model dispatch attention through transformers' AttentionInterface (and can it make a batch)?"""
    if not hasattr(model, "set_attn_implementation") or not hasattr(getattr(model, "config", None),
                                                                        "_attn_implementation"):
        return False, "not a transformers model with set_attn_implementation"
    can = getattr(model, "_can_set_attn_implementation", None)
    if callable(can) and not can():
        return False, f"{type(model).__name__} does not dispatch attention through AttentionInterface"
    if getattr(model.config, "vocab_size", None) is None:
        return False, "no vocab_size to build a validation batch from"
    return True, ""


def diffusers_attention_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every Diffusers attention module: those with a processor and set_processor."""
    return [(p, m) for p, m in model.named_modules()
            if hasattr(m, "set_processor") and hasattr(m, "processor") and m.processor is not None]


def encoder_width(module: Any) -> int | None:
    """Width of the encoder states a Diffusers attention module attends to (joint or cross attention); None: self."""
    import torch

    add_k = getattr(module, "add_k_proj", None)
    if isinstance(add_k, torch.nn.Linear):
        return add_k.in_features  # joint attention (Flux / SD3 dual-stream): text states of their own width
    to_q, to_k = getattr(module, "to_q", None), getattr(module, "to_k", None)
    if isinstance(to_k, torch.nn.Linear) and (
            getattr(module, "is_cross_attention", False)
            or (isinstance(to_q, torch.nn.Linear) and to_k.in_features != to_q.in_features)):
        return to_k.in_features
    return None
