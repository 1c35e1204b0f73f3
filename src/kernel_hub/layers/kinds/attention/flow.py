"""The attention kind's flow on a transformers model over the jobs: find.can_switch_attention -> load (the kernel) ->
register "kernel_hub" and "kernel_hub_flash" (dispatch.py) -> remember every config's implementation -> two small
forwards (validate.model_forwards, one left-padded) on the model as it is -> one
`model.set_attn_implementation("kernel_hub")` -> the same forwards in probe mode (every layer that calls the
AttentionInterface runs its previous implementation and the kernel on its own q/k/v/mask and returns the previous
output) -> plan.switch_check: with every layer returning its previous output the model must give the outputs it gave
before the switch, else the model itself computes differently under another implementation name (DeepSeek sparse
attention hands its top-k keys to the attention function instead of masking them) and every layer stays on its previous
implementation -> hook each layer found: the kernel where it matched within the dtype tolerance, its previous
implementation otherwise -> the model's continuous-batching entry, which gives the configs the flash-named name while a
manager runs (config_switch.py). The switched configs (the model's private copies) accept attention-weight requests
from the switch on. Nothing matched: switch back. `restore` puts every config's implementation and class, and the
model's instance dict, back exactly. On a Diffusers denoiser the kind runs through the processor API instead
(diffusers.py, diffusers_route.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...layer_check import dtype_device, tolerance_for
from ...load import kernel_for, kernel_info
from ...plan import verdict
from ...report import Kept, Replaced
from ...swap import KernelizeState, put_back_names
from ..declaration import KindRun
from . import config_switch, dispatch
from .contract import HOOK_ATTR, NAME
from .find import attention_configs, can_switch_attention
from .packed import PackedKernel
from .plan import switch_check
from .validate import model_forwards

if TYPE_CHECKING:
    import torch


@dataclass
class AttentionState:
    """For restore: hooked paths, the model's implementation before, each config's, and each config's class before
    it accepted attention-weight requests."""

    paths: list[str] = field(default_factory=list)
    previous: str | None = None
    configs: list[tuple[Any, str | None]] = field(default_factory=list)
    classes: list[tuple[Any, type]] = field(default_factory=list)
    #: (whether the model's __dict__ held an entry under BATCHING_ENTRY, what); None: untouched
    batching: tuple[bool, Any] | None = None


def apply(run: KindRun) -> None:
    ok, _ = can_switch_attention(run.model)
    if not ok:
        return  # not a transformers attention model (e.g. a bare expert block): nothing to say
    loaded = kernel_for(run, runs_the_model=True)  # attention layers are found by running the model
    if loaded is None:
        return
    kernel, repo_id = loaded
    state = run.state.kinds[NAME] = AttentionState()  # recorded first: an exception on the way restores it
    _swap(run, kernel, repo_id, state)
    if not state.paths:
        run.state.kinds.pop(NAME, None)
    elif run.mode == "training":
        run.report.notes.append("attention validated on the forward pass (its backward is the kernel's autograd)")


def _swap(run: KindRun, kernel: Any, repo_id: str, state: AttentionState) -> None:
    """Hook every attention layer of the model onto `kernel` (or its previous implementation), filling the report."""
    model, report, validate = run.model, run.report, run.validate
    info = kernel_info(kernel, run.device, "flash_attention")
    packed_kernel = PackedKernel.of(kernel)
    dispatch.register()
    state.previous = model.config._attn_implementation
    try:
        before = model_forwards(model, run.device)
    except Exception as exc:  # the model could not run a plain token batch: keep its attention
        report.notes.append(f"attention kept: validation forward failed: {type(exc).__name__}: {exc}")
        return
    for cfg in attention_configs(model):
        state.configs.append((cfg, cfg._attn_implementation))
        config_switch.remember_previous(cfg, cfg._attn_implementation)
        # a private copy (swap.take_own_configs): no other model's config
        original = config_switch.accept_weight_requests(cfg)
        if original is not None:
            state.classes.append((cfg, original))
    model.set_attn_implementation(config_switch.IMPLEMENTATION_NAME)  # transformers' own switch
    probe = dispatch.AttentionProbe(flash=kernel.flash_attention)
    dispatch.set_probe([cfg for cfg, _ in state.configs], probe)
    try:
        after = model_forwards(model, run.device)
    except Exception as exc:  # the model could not run a plain token batch: keep its attention
        _restore_state(model, state)
        report.notes.append(f"attention kept: validation forward failed: {type(exc).__name__}: {exc}")
        return
    finally:
        dispatch.set_probe([cfg for cfg, _ in state.configs], None)
    paths = {id(m): p for p, m in model.named_modules()}
    found = sorted(probe.modules, key=lambda k: list(paths).index(k) if k in paths else 1 << 30)
    # One implementation name per config: a model that is not itself under the switch keeps every layer.
    blocked = switch_check(before, after, tolerance_for(dtype_device(model)[0]), state.previous)
    first_sparse = next((f"{paths.get(k, '?')}: {probe.sparse[k]}" for k in found if k in probe.sparse), "")
    if first_sparse:
        blocked = f"the model stays on its own attention ({first_sparse})"
    hooks: list[tuple[Any, str, dispatch.AttentionHook]] = []
    for key in found:
        module, path = probe.modules[key], paths.get(key, "?")
        previous = config_switch.PREVIOUS.get(id(getattr(module, "config", None)), state.previous)
        tol = tolerance_for(dtype_device(module)[0])
        errors = probe.errors.get(key, [])
        err = max(errors) if errors else None
        reason = probe.sparse.get(key, "") or blocked or probe.failures.get(key, "")
        if not reason and validate:
            reason = verdict(err, tol)
        if reason:
            report.kept.append(Kept(path, NAME, reason))
            hooks.append((module, path, dispatch.AttentionHook(flash=None, previous=previous)))
            continue
        report.replaced.append(Replaced(
            layer=path, kind=NAME, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="interface",
            layout=_layout(module), max_error=err if validate else None, tolerance=tol if validate else None))
        hooks.append((module, path, dispatch.AttentionHook(flash=kernel.flash_attention, previous=previous,
                                                     packed=packed_kernel)))
    if not any(h.flash is not None for _, _, h in hooks):
        _restore_state(model, state)
        if not found:
            report.notes.append("no attention layer calls transformers' AttentionInterface: attention unchanged")
        return
    for module, path, hook in hooks:
        module.__dict__[HOOK_ATTR] = hook
        state.paths.append(path)
    if callable(getattr(type(model), config_switch.BATCHING_ENTRY, None)):
        before = model.__dict__.get(config_switch.BATCHING_ENTRY)
        state.batching = (config_switch.BATCHING_ENTRY in model.__dict__, before)
        model.__dict__[config_switch.BATCHING_ENTRY] = config_switch.BatchingEntry(
            model, [cfg for cfg, _ in state.configs])
    report.notes.append(f"attention implementation switched to {config_switch.IMPLEMENTATION_NAME!r} "
                        f"(was {state.previous}); kept layers and calls the kernel cannot express run the previous "
                        "implementation")


def _layout(module: torch.nn.Module) -> str:
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


def _restore_state(model: torch.nn.Module, state: AttentionState) -> None:
    """Remove the hooks, put every config's class and attention implementation back exactly."""
    for path in state.paths:
        with contextlib.suppress(AttributeError):
            model.get_submodule(path).__dict__.pop(HOOK_ATTR, None)
    state.paths.clear()
    if state.batching is not None:
        had, before = state.batching
        if had:
            model.__dict__[config_switch.BATCHING_ENTRY] = before
        else:
            model.__dict__.pop(config_switch.BATCHING_ENTRY, None)
        state.batching = None
    for cfg, cls in reversed(state.classes):
        cfg.__class__ = cls
    state.classes.clear()
    if state.previous is not None and model.config._attn_implementation != state.previous:
        with contextlib.suppress(Exception):  # the exact per-config restore below still runs
            model.set_attn_implementation(state.previous)
    put_back_names(state.configs, "_attn_implementation")
    for cfg, _ in state.configs:
        config_switch.PREVIOUS.pop(id(cfg), None)
    state.configs.clear()


def restore(model: torch.nn.Module, state: KernelizeState) -> None:
    attention: AttentionState | None = state.kinds.get(NAME)
    if attention is not None:
        _restore_state(model, attention)

