"""kernelize's attention path: switch a transformers model to the "kernel_hub" attention implementation.

Flow: register "kernel_hub" (attention.py) -> remember every config's implementation -> two small forwards
(one with left padding) on the model as it is -> one `model.set_attn_implementation("kernel_hub")` -> the same
forwards in probe mode (every layer that calls the AttentionInterface runs its previous implementation and the
kernel on its own q/k/v/mask and returns the previous output) -> the switch check: with every layer returning its
previous output the model must give the outputs it gave before the switch, else the model itself computes
differently under another implementation name (DeepSeek sparse attention hands its top-k keys to the attention
function instead of masking them) and every layer stays on its previous implementation -> hook each layer found:
the kernel where it matched within the dtype tolerance, its previous implementation otherwise. Nothing matched:
switch back. `restore_attention` puts every config's implementation back exactly.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics import relative_error
from . import attention as at
from .report import Kept, KernelizeReport, Replaced

VALIDATION_BATCH, VALIDATION_TOKENS, VALIDATION_PAD = 2, 24, 5


@dataclass
class AttentionState:
    paths: list[str] = field(default_factory=list)
    previous: str | None = None
    configs: list[tuple[Any, str | None]] = field(default_factory=list)


def _configs(model: Any) -> list[Any]:
    """Every distinct config a module of `model` dispatches attention on."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in seen:
            seen[id(cfg)] = cfg
    return list(seen.values())


def can_switch(model: Any) -> tuple[bool, str]:
    """Pure decision: does this model dispatch attention through transformers' AttentionInterface?"""
    if not hasattr(model, "set_attn_implementation") or not hasattr(getattr(model, "config", None),
                                                                        "_attn_implementation"):
        return False, "not a transformers model with set_attn_implementation"
    can = getattr(model, "_can_set_attn_implementation", None)
    if callable(can) and not can():
        return False, f"{type(model).__name__} does not dispatch attention through AttentionInterface"
    if getattr(model.config, "vocab_size", None) is None:
        return False, "no vocab_size to build a validation batch from"
    return True, ""


def _first_tensor(out: Any) -> torch.Tensor | None:
    """A model output's main tensor (logits, else last_hidden_state, else its first tensor field)."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    values = out.values() if hasattr(out, "values") else out if isinstance(out, (tuple, list)) else (out,)
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def _validation_forwards(model: Any, device: torch.device) -> list[torch.Tensor | None]:
    """Two forwards on random tokens: no padding (the mask-free path) and left padding in row 1; their outputs."""
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    x = torch.randint(min(3, vocab - 1), vocab, (VALIDATION_BATCH, VALIDATION_TOKENS), generator=g).to(device)
    mask = torch.ones_like(x)
    mask[1, :VALIDATION_PAD] = 0
    rows = mask.bool()  # real tokens (a padded row's output is not part of the check)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # a training-mode model draws the same dropout
        torch.manual_seed(0)
        plain = _first_tensor(model(input_ids=x, use_cache=False))
        padded = _first_tensor(model(input_ids=x, attention_mask=mask, use_cache=False))
    if padded is not None and padded.shape[:2] == rows.shape:
        padded = padded[rows]
    return [plain, padded]


def switch_check(before: list[torch.Tensor | None], after: list[torch.Tensor | None], tol: float,
                 previous: str | None) -> str:
    """Pure decision: why the model may not switch to "kernel_hub" ("" if it may). `after` is the model switched, every
    layer returning its previous implementation's output: anything but `before` means the model computes differently
    under another implementation name, beyond the attention function kernelize swaps."""
    errors = [relative_error(a, b) for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    err = max(errors, default=0.0)
    if err <= tol:
        return ""
    return (f"the model computes differently once its attention implementation is not {previous!r} (output error "
            f"{err:.2e} > {tol:.0e} with every layer on its previous implementation)")


def _layout(module: Any) -> str:
    parts = []
    hq = getattr(getattr(module, "config", None), "num_attention_heads", None)
    groups = getattr(module, "num_key_value_groups", None)
    if isinstance(hq, int) and isinstance(groups, int) and groups:
        parts.append(f"heads {hq}/{hq // groups}")
    if isinstance(getattr(module, "head_dim", None), int):
        parts.append(f"d{module.head_dim}")
    if getattr(module, "sliding_window", None):
        parts.append(f"sliding {module.sliding_window}")
    if getattr(module, "sinks", None) is not None:
        parts.append("sinks")
    return ", ".join(parts) or "attention"


def _dtype_of(module: Any) -> torch.dtype:
    p = next(module.parameters(), None)
    return p.dtype if p is not None else torch.float32


def kernelize_attention(
    model: Any, kernel: Any, repo_id: str, *, device: torch.device, validate: bool, tolerance: dict,
    info: dict[str, Any], state: AttentionState, report: KernelizeReport,
) -> None:
    """Hook every attention layer of `model` onto `kernel` (or its previous implementation), filling `report`."""
    at.register()
    state.previous = model.config._attn_implementation
    try:
        before = _validation_forwards(model, device)
    except Exception as exc:  # the model could not run a plain token batch: keep its attention
        report.notes.append(f"attention kept: validation forward failed: {type(exc).__name__}: {exc}")
        return
    for cfg in _configs(model):
        state.configs.append((cfg, cfg._attn_implementation))
        at._PREVIOUS[id(cfg)] = cfg._attn_implementation
        weakref.finalize(cfg, at._PREVIOUS.pop, id(cfg), None)  # an id is never reused while its entry stays
    model.set_attn_implementation(at.IMPLEMENTATION_NAME)
    probe = at.Probe(flash=kernel.flash_attention)
    at.set_probe(probe)
    try:
        after = _validation_forwards(model, device)
    except Exception as exc:  # the model could not run a plain token batch: keep its attention
        restore_attention(model, state)
        report.notes.append(f"attention kept: validation forward failed: {type(exc).__name__}: {exc}")
        return
    finally:
        at.set_probe(None)
    paths = {id(m): p for p, m in model.named_modules()}
    found = sorted(probe.modules, key=lambda k: list(paths).index(k) if k in paths else 1 << 30)
    # One implementation name per config: a model that is not itself under the switch keeps every layer.
    blocked = switch_check(before, after, tolerance.get(_dtype_of(model), 1e-4), state.previous)
    first_sparse = next((f"{paths.get(k, '?')}: {probe.sparse[k]}" for k in found if k in probe.sparse), "")
    if first_sparse:
        blocked = f"the model stays on its own attention ({first_sparse})"
    hooks: list[tuple[Any, str, at.AttentionHook]] = []
    for key in found:
        module, path = probe.modules[key], paths.get(key, "?")
        previous = at._PREVIOUS.get(id(getattr(module, "config", None)), state.previous)
        tol = tolerance.get(_dtype_of(module), 1e-4)
        errors = probe.errors.get(key, [])
        err = max(errors) if errors else None
        reason = probe.sparse.get(key, "") or blocked or probe.failures.get(key, "")
        if not reason and validate and not (err is not None and err <= tol):
            reason = f"validation failed: max error {err:.2e} > tolerance {tol:.0e}"
        if reason:
            report.kept.append(Kept(path, at.LAYER_KIND, reason))
            hooks.append((module, path, at.AttentionHook(flash=None, previous=previous)))
            continue
        report.replaced.append(Replaced(
            layer=path, kind=at.LAYER_KIND, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="interface",
            layout=_layout(module), max_error=err if validate else None, tolerance=tol if validate else None))
        hooks.append((module, path, at.AttentionHook(flash=kernel.flash_attention, previous=previous)))
    if not any(h.flash is not None for _, _, h in hooks):
        restore_attention(model, state)
        if not found:
            report.notes.append("no attention layer calls transformers' AttentionInterface: attention unchanged")
        return
    for module, path, hook in hooks:
        module.__dict__[at.HOOK_ATTR] = hook
        state.paths.append(path)
    report.notes.append(f"attention implementation switched to {at.IMPLEMENTATION_NAME!r} (was {state.previous}); "
                        "kept layers and calls the kernel cannot express run the previous implementation")


def restore_attention(model: Any, state: AttentionState) -> None:
    """Remove the hooks and put every config's attention implementation back exactly."""
    for path in state.paths:
        with contextlib.suppress(AttributeError):
            model.get_submodule(path).__dict__.pop(at.HOOK_ATTR, None)
    state.paths.clear()
    if state.previous is not None and model.config._attn_implementation != state.previous:
        with contextlib.suppress(Exception):  # the exact per-config restore below still runs
            model.set_attn_implementation(state.previous)
    for cfg, value in state.configs:
        if cfg._attn_implementation != value:
            cfg._attn_implementation_internal = value
        at._PREVIOUS.pop(id(cfg), None)
    state.configs.clear()
