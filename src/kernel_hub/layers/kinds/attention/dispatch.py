"""The attention implementation kernelize registers with transformers ("kernel_hub_flash" and "kernel_hub", one
function): per call, the hooked layer's kernel where the call is expressible (call_plan.py, kernel_call.py), continuous
batching's packed and paged calls (packed.py), the layer's eager attention where the caller asked for attention
weights, and the layer's previous implementation otherwise, with the same arguments. While kernelize validates a
model, its calls run the previous implementation and the kernel side by side and record the kernel's error (a probe).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ....errors import KernelHubError
from ...swap import CallCounts
from ...weights_guard import KernelRefused, check_output, held_weights
from . import packed
from .call_plan import sparse_selection
from .config_switch import NAMES, PREVIOUS, kernel_hub_mask, previous_function
from .contract import HOOK_ATTR, NAME
from .kernel_call import kernel_call, rel_rows
from .masks import eager_mask

LAYER_KIND = NAME  # the kind's name, as its report rows give it


@dataclass
class AttentionHook(CallCounts):
    """What a kernelized attention module does; lives on the instance under HOOK_ATTR. Its counts: calls the kernel
    served, calls handed to the previous implementation (a mask / kwargs the kernel cannot express) and why."""

    flash: Callable[..., torch.Tensor] | None  # the kernel's torch flash_attention; None: layer kept
    previous: str | None
    packed: packed.PackedKernel | None = None  # its flash-attn functions for packed calls; None: layer kept


@dataclass
class AttentionProbe:
    """Validation mode: each call runs the previous implementation and the kernel, records the error."""

    flash: Callable[..., torch.Tensor]
    errors: dict[int, list[float]] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    sparse: dict[int, str] = field(default_factory=dict)  # layers whose calls carry a sparse selection: why


#: id(config) -> the probe of the kernelize run validating the model that holds that config. Per model, not per
#: process: kernelize gives each model private config copies, so two models validated at once (two threads, two
#: asyncio tasks) each feed their own probe, and another model's forward meanwhile is never probed. A dict keyed by
#: config id, like PREVIOUS, is also what torch.compile traces without a graph break (a ContextVar it cannot).
_PROBES: dict[int, AttentionProbe] = {}
_log = logging.getLogger(__name__)
_weights_logged = False


def attention_weights_requested(kwargs: dict[str, Any]) -> bool:
    """Whether this call's caller asked for attention weights: an `output_attentions` kwarg, or transformers' output
    capture collecting "attentions" for the forward now running (read outside torch.compile only: dynamo cannot
    trace the ContextVar, and a compiled graph asking for weights is traced with them off)."""
    if kwargs.get("output_attentions"):
        return True
    if torch.compiler.is_compiling():
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capture passes output_attentions instead
        return False
    try:
        collected = _active_collector.get()
    except LookupError:  # no capturing forward is running
        return False
    return isinstance(collected, dict) and "attentions" in collected


def _weights_call(module: torch.nn.Module) -> Callable[..., Any]:
    """The implementation that returns attention weights (the module's eager attention), logged once."""
    global _weights_logged
    if not _weights_logged:
        _weights_logged = True
        _log.warning("kernel_hub attention: attention weights were requested (output_attentions), which the kernel "
                     "does not compute; such calls run the model's eager attention (this is logged once)")
    return previous_function(module, "eager")


def register() -> None:
    """Register both names in AttentionInterface and AttentionMaskInterface (idempotent; adds names, edits no
    class)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    for name in NAMES:
        if ALL_ATTENTION_FUNCTIONS._global_mapping.get(name) is not kernel_hub_attention:
            AttentionInterface.register(name, kernel_hub_attention)
        if ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(name) is not kernel_hub_mask:
            AttentionMaskInterface.register(name, kernel_hub_mask)


def kernel_hub_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Registered as attention implementation "kernel_hub": the kernel for hooked layers where the call
    is expressible, else the layer's previous implementation with the same arguments."""
    hook: AttentionHook | None = module.__dict__.get(HOOK_ATTR)
    previous = hook.previous if hook is not None else PREVIOUS.get(id(getattr(module, "config", None)))
    prev_fn = previous_function(module, previous)
    probe = _PROBES.get(id(getattr(module, "config", None))) if _PROBES else None
    if probe is not None:
        ref = prev_fn(module, query, key, value, attention_mask, **kwargs)
        key_id = id(module)
        probe.modules[key_id] = module
        sparse = sparse_selection(kwargs)
        if sparse:
            probe.sparse.setdefault(key_id, sparse)
        try:
            # a kernel that wrote to the model's weights or its inputs is undone and refused
            with held_weights(module, inputs={"query": query, "key": key, "value": value}):
                out, plan, why = kernel_call(module, probe.flash, query, key, value, attention_mask, kwargs)
            if out is not None:
                check_output(out, ref[0], "the layer's attention")
        except KernelRefused as exc:  # recorded; kernelize keeps the layer with this reason
            probe.failures[key_id] = str(exc)
            return ref
        except Exception as exc:  # recorded; kernelize keeps the layer with this reason
            probe.failures[key_id] = f"kernel raised in validation: {type(exc).__name__}: {exc}"
            return ref
        if out is None:
            probe.failures.setdefault(key_id, f"validation call fell back: {why}")
        else:
            probe.errors.setdefault(key_id, []).append(rel_rows(out, ref[0], plan.rows))
        return ref
    sparse = sparse_selection(kwargs)
    if sparse:  # kernelize keeps such models off "kernel_hub": the previous implementation here would drop them too
        raise KernelHubError(f"{type(module).__name__} passed {sparse}; neither can run under 'kernel_hub': "
                             "call kh.restore(model) (kernelize keeps such models on their own attention)")
    if packed.is_packed(kwargs):
        return _packed_call(module, hook, prev_fn, previous, query, key, value, kwargs)
    if attention_weights_requested(kwargs):
        return _weights_call(module)(module, query, key, value, eager_mask(module, query, key, attention_mask, kwargs),
                                     **kwargs)
    if hook is None or hook.flash is None:
        return prev_fn(module, query, key, value, attention_mask, **kwargs)
    out, _, why = kernel_call(module, hook.flash, query, key, value, attention_mask, kwargs)
    if out is None:
        hook.fell_back(why)
        return prev_fn(module, query, key, value, attention_mask, **kwargs)
    hook.served()
    return out, None


def _packed_call(module: torch.nn.Module, hook: AttentionHook | None, prev_fn: Callable[..., Any], previous: str | None,
                 query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    """A packed call (continuous batching, padding-free): the kernel's flash-attn functions, or the previous
    implementation with the block-diagonal mask transformers builds for it only under eager/sdpa."""
    kernel = hook.packed if hook is not None and hook.flash is not None else None
    why = packed.plan_packed(kernel, kwargs, training=bool(module.training))
    if not why:
        out = packed.kernel_packed(kernel, module, query, key, value, kwargs)
        hook.served()
        return out, None
    if hook is not None:
        hook.fell_back(why)
    fn = _weights_call(module) if attention_weights_requested(kwargs) else prev_fn
    eager = fn is not prev_fn or previous in (None, "eager", *NAMES)
    return packed.previous_packed(fn, module, query, key, value, kwargs, additive=eager)


def set_probe(configs: Iterable[Any], probe: AttentionProbe | None) -> None:
    """Validation mode for the model holding `configs`: its attention calls feed `probe` (None: off again)."""
    for cfg in configs:
        if probe is None:
            _PROBES.pop(id(cfg), None)
        else:
            _PROBES[id(cfg)] = probe
