"""The transformers adapter of the moe_experts kind: the experts implementation kernelize registers with
transformers, the per-module hooks it reads at call time, and the call of the kernel on a block's own weights.

One function, `kernel_hub_experts_forward`, is registered under the name "kernel_hub" in
transformers' ExpertsInterface. A model switched to it (`model.set_experts_implementation`) calls it
for every expert block; the function reads the block's own hook (an instance attribute) and either
runs the kernel or, for a block kernelize kept, the implementation the block had before. Blocks whose
model does not dispatch through the interface get an instance-level `forward` (bound method) that
calls the same function. No class is ever modified.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from ...swap import IMPLEMENTATION_NAME
from . import packed_op, packing, quantize
from .contract import HOOK_ATTR, NAME
from .find import ExpertsLayout, ExpertsSite

LAYER_KIND = NAME  # the kind's name, as its report rows give it

ExpertsCall = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ExpertsHook:
    """What a kernelized expert block does; lives on the module instance under HOOK_ATTR."""

    call: ExpertsCall | None  # the kernel path; None: this block kept its previous implementation
    previous: str | None  # experts implementation name before kernelize ("forward" route: None)
    route: str  # "interface" or "forward"
    signature: inspect.Signature | None = None  # of the forward the "forward" route replaced
    had_instance_forward: bool = False
    instance_forward: Callable[..., torch.Tensor] | None = None


def _eager_forward(module: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The class's own (eager) forward, unwrapped from transformers' dispatcher if decorated."""
    forward = type(module).forward
    return getattr(forward, "__wrapped__", forward)


def previous_forward(module: torch.nn.Module, previous: str | None) -> Callable[..., torch.Tensor]:
    """The unbound function `module` ran before kernelize, given its previous implementation name."""
    eager = _eager_forward(module)
    if previous in (None, "eager", IMPLEMENTATION_NAME):
        return eager
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS.get_interface(previous, eager)


def reference_for(module: torch.nn.Module, site: ExpertsSite) -> Callable[..., torch.Tensor]:
    """What the block runs now, as fn(module, hidden, index, weights): what its kernel call is checked against."""
    if site.route == "interface":
        return previous_forward(module, module.config._experts_implementation)
    instance = module.__dict__.get("forward")
    if instance is not None:
        return lambda _m, h, i, w: instance(h, i, w)
    return previous_forward(module, None)


def kernel_hub_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """Registered as experts implementation "kernel_hub": kernel for hooked blocks, else the previous."""
    hook: ExpertsHook | None = self.__dict__.get(HOOK_ATTR)
    if hook is None or hook.call is None:
        fn = previous_forward(self, hook.previous if hook is not None else None)
        return fn(self, hidden_states, top_k_index, top_k_weights)
    return hook.call(self, hidden_states, top_k_index, top_k_weights)


def _replaced_forward(self: torch.nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
    """Instance forward for blocks outside the interface: same signature as the one it replaces."""
    hook: ExpertsHook = self.__dict__[HOOK_ATTR]
    assert hook.signature is not None
    bound = hook.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    hidden, index, weights = list(bound.arguments.values())[:3]
    return kernel_hub_experts_forward(self, hidden, index, weights)


def register_implementation() -> None:
    """Register "kernel_hub" in transformers' ExpertsInterface (idempotent; adds a name, edits no class)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    if ALL_EXPERTS_FUNCTIONS.get(IMPLEMENTATION_NAME) is not kernel_hub_experts_forward:
        ExpertsInterface.register(IMPLEMENTATION_NAME, kernel_hub_experts_forward)
    quantize.register_fp8_interface(IMPLEMENTATION_NAME, kernel_hub_experts_forward)  # FP8Experts' own interface


def install_forward(module: torch.nn.Module, hook: ExpertsHook) -> None:
    """Give `module` an instance-level forward bound to it (deepcopy rebinds it to the copy)."""
    hook.had_instance_forward = "forward" in module.__dict__
    hook.instance_forward = module.__dict__.get("forward")
    hook.signature = inspect.signature(_eager_forward(module))
    params = list(hook.signature.parameters.values())
    if params and params[0].name == "self":
        hook.signature = hook.signature.replace(parameters=params[1:])
    module.__dict__[HOOK_ATTR] = hook
    module.forward = types.MethodType(_replaced_forward, module)


def remove_hook(module: torch.nn.Module) -> None:
    """Undo install_forward / the hook attribute, leaving the instance as it was."""
    hook: ExpertsHook | None = module.__dict__.pop(HOOK_ATTR, None)
    if hook is None:
        return
    if hook.route == "forward":
        module.__dict__.pop("forward", None)
        if hook.had_instance_forward:
            module.__dict__["forward"] = hook.instance_forward


def _is_default_gate(module: torch.nn.Module) -> bool:
    from transformers.integrations import moe

    gate = getattr(type(module), "_apply_gate", None)
    return gate is None or gate is getattr(moe, "_default_apply_gate", None)


def _generic_moe(ragged_dot: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An expert block over any torch ragged_dot (for kernels that export only ragged_dot)."""

    def moe_experts(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, *,
                    gate_up_proj_bias=None, down_proj_bias=None, is_transposed=False,
                    is_concatenated=True, has_gate=True, act=F.silu, gate_fn=None, post_fn=None):
        e = gate_up_proj.shape[0]
        t, k = top_k_index.shape
        ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
        sizes = torch.bincount(ids, minlength=e + 1)[:e]
        safe = ids.clamp(max=e - 1)
        x = hidden_states[perm // k].to(gate_up_proj.dtype)
        h = ragged_dot(x, gate_up_proj if is_transposed else gate_up_proj.transpose(1, 2), sizes)
        if gate_up_proj_bias is not None:
            h = h + gate_up_proj_bias[safe]
        if gate_fn is not None:
            h = gate_fn(h)
        elif has_gate:
            g, u = h.chunk(2, -1) if is_concatenated else (h[..., ::2], h[..., 1::2])
            h = act(g) * u
        else:
            h = act(h)
        out = ragged_dot(h.to(down_proj.dtype), down_proj if is_transposed else down_proj.transpose(1, 2), sizes)
        if down_proj_bias is not None:
            out = out + down_proj_bias[safe]
        if post_fn is not None:
            out = post_fn(out)
        w = top_k_weights.reshape(-1)[perm].masked_fill(ids >= e, 0.0)
        out = (out * w.unsqueeze(-1)).masked_fill((ids >= e)[:, None], 0.0)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        return out[inverse].view(t, k, -1).sum(dim=1).to(hidden_states.dtype)

    return moe_experts


#: The layout attributes transformers' use_experts_implementation puts on an experts module: what a function in
#: transformers' experts-function convention reads.
TRANSFORMERS_LAYOUT = ("has_gate", "is_concatenated", "is_transposed", "has_bias")


def experts_function_fits(module: torch.nn.Module, site: ExpertsSite) -> str:
    """Why a kernel in transformers' experts-function convention cannot serve this block ("" if it can): such a
    function reads the module's transformers layout attributes and dense weights, nothing kernelize hands it."""
    missing = [a for a in TRANSFORMERS_LAYOUT if not isinstance(getattr(module, a, None), bool)]
    if missing:
        return ("an experts_forward kernel (transformers' experts-function convention) reads the layout "
                f"transformers' use_experts_implementation records, and {site.class_name} has no "
                f"{', '.join(missing)}")
    if site.layout is not None and site.layout.weights != "dense":
        return (f"an experts_forward kernel gets the block's own weights, and these are {site.layout.weights} "
                "(kernel-hub's moe_experts contract runs those)")
    return ""


def experts_function_call(kernel: ModuleType) -> ExpertsCall:
    """The kernel path for a kernel in transformers' experts-function convention: its experts_forward on the block
    itself, as transformers would call it."""
    fn = kernel.experts_forward

    def call(module: torch.nn.Module, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return fn(module, hidden, index, weights)

    return call


def make_call(kernel: ModuleType, layout: ExpertsLayout, convention: str = "moe_experts") -> ExpertsCall:
    """The kernel path for one expert block: reads the block's weights at call time (so .to(), loading
    new weights and training updates are all seen) and its own gate / activation / post-norm. A block
    whose weights kernelize packed (packing.py) runs the kernel's packed-weights entry instead. convention:
    plan.experts_convention's answer ("experts_forward": the kernel's transformers experts function)."""
    if convention == "experts_forward":
        return experts_function_call(kernel)
    moe = getattr(kernel, "moe_experts", None)
    if moe is None:
        moe = _generic_moe(kernel.ragged_dot)
    moe_packed = getattr(kernel, "moe_experts_packed", None)
    up_name, down_name = packing.weight_names(layout)

    def call(module: torch.nn.Module, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gated = layout.has_gate
        act = getattr(module, "act_fn", None)
        kwargs: dict[str, Any] = {
            "is_transposed": layout.is_transposed,
            "is_concatenated": layout.is_concatenated,
            "has_gate": gated,
            "act": F.silu if act is None else act,
        }
        if gated and not _is_default_gate(module):
            kwargs["gate_fn"] = module._apply_gate
        if layout.has_bias:
            kwargs["gate_up_proj_bias"] = module.gate_up_proj_bias if gated else module.up_proj_bias
            kwargs["down_proj_bias"] = module.down_proj_bias
        if layout.has_post_expert_norm:
            kwargs["post_fn"] = module.post_expert_norm
        quantized = quantize.weights_for(module)  # int8 / fp8 expert weights (quantize.py)
        if quantized is not None:
            w_up, w_down, extra = quantized
            return moe(hidden, index, weights, w_up, w_down, **{**kwargs, **extra})
        holders = packing.active_holders(module) if moe_packed is not None else None
        if holders is not None:
            if torch.compiler.is_compiling():  # the packed call as one opaque op (packed_op.py)
                return packed_op.packed_experts(hidden, index, weights, packing.record_of(module).compile_handle)
            del kwargs["is_transposed"]  # the packed weights know their layout
            return moe_packed(hidden, index, weights, holders[up_name], holders[down_name], **kwargs)
        return moe(hidden, index, weights, getattr(module, up_name), getattr(module, down_name), **kwargs)

    return call


SWITCH_ATTR = "set_experts_implementation"


def _user_switch(model: torch.nn.Module, experts_implementation: str | dict[str, str] | None) -> Any:
    """Instance `set_experts_implementation` of a kernelized model: the user's later choice wins. Leaving
    "kernel_hub" unpacks the packed blocks first (their dense weights are meta placeholders while packed, and the
    implementation chosen reads them); restore() still gives back what the model ran before kernelize."""
    requested = (experts_implementation if not isinstance(experts_implementation, dict)
                 else experts_implementation.get("", None))
    if requested != IMPLEMENTATION_NAME:
        for module in model.modules():
            if packing.record_of(module) is not None:
                packing.unpack_module(module)
    return type(model).set_experts_implementation(model, experts_implementation)


def honour_user_switch(model: torch.nn.Module) -> None:
    """Give the kernelized `model` the instance switch above (a bound method: deepcopy rebinds it to the copy)."""
    model.__dict__[SWITCH_ATTR] = types.MethodType(_user_switch, model)


def drop_user_switch(model: torch.nn.Module) -> None:
    if isinstance(model.__dict__.get(SWITCH_ATTR), types.MethodType):
        model.__dict__.pop(SWITCH_ATTR)
