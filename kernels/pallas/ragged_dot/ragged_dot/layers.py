"""Layer classes in Hugging Face kernels' convention, for `kernels.kernelize` with a LayerRepository pointing here.

HF kernels replaces the `forward` of a module whose class transformers marked `use_kernel_forward_from_hub(NAME)`
with the forward of the class NAME found here, bound to the original module: a forward reads only the replaced
module's own attributes, and a class carries no constructor and no members beyond `has_backward` /
`can_torch_compile` (HF kernels refuses others), so the helpers below are module functions.

What this build serves, and why: transformers 5.24 marked GptOssMLP "MegaBlocksMoeMLP"; transformers 5.25 marks no
MoE layer with a hub name (GptOssMLP lost its mark). 5.25 instead plugs MoE kernels in through a KernelConfig that
maps a model's own class name to `<repo>:<KernelClass>` and a `<KernelClass>Layout` companion in this module, which
transformers puts in that class's place when it builds the model (`register_patch_mapping`). So:

  MoEExperts        transformers' experts modules (Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, GPT-OSS, ...):
                    forward(hidden[T, H], top_k_index[T, K], top_k_weights[T, K]) -> [T, H] on this package's
                    `moe_experts` (two ragged dots) with the module's own weights, biases, gate (`_apply_gate`, e.g.
                    GPT-OSS's clamped SwiGLU), activation and post-expert norm, in the layout transformers'
                    `use_experts_implementation` records (is_transposed, is_concatenated, has_gate, has_bias,
                    has_post_expert_norm).
  MoEExpertsLayout  its companion: built from the model config with the experts class's parameter names and shapes
                    (checkpoints load unchanged); its forward is MoEExperts' computation.
  MegaBlocksMoeMLP  GptOssMLP as a whole (its own router, then the expert block as above), for a module marked
                    "MegaBlocksMoeMLP" by hand (transformers 5.24 did).
A module without a layout these compute (no `router` where one is needed, quantized experts without dense
`gate_up_proj`, shapes that disagree) raises `UnsupportedLayout` naming what is missing: they never compute numbers
for a layout they do not know.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import torch
from torch import nn

#: The layout flags transformers' `use_experts_implementation` sets on every experts instance.
LAYOUT_FLAGS = ("is_transposed", "is_concatenated", "has_gate", "has_bias", "has_post_expert_norm")


class UnsupportedLayout(TypeError):
    """The replaced module is not in a layout this layer computes; its message names what to fix."""


#: What each layer class serves, for its refusals.
_SERVES = {
    "MegaBlocksMoeMLP": "GPT-OSS's MoE MLP layout (a `router` returning (logits, scores[T,K], indices[T,K]) and "
                        "`experts` carrying transformers' use_experts_implementation layout with dense float weights)",
    "MoEExperts": "transformers' experts modules (3-D expert weights with the use_experts_implementation layout "
                  "flags, dense float weights) and MoEExpertsLayout",
}


def _refuse(module: nn.Module, what: str, layer: str = "MegaBlocksMoeMLP") -> UnsupportedLayout:
    return UnsupportedLayout(
        f"kernel-hub/ragged-dot-tpu layers.{layer} cannot serve {type(module).__name__}: {what}. It serves "
        f"{_SERVES[layer]}; map this layer elsewhere or leave it unkernelized")


def _weight(module: nn.Module, experts: nn.Module, name: str, layer: str = "MegaBlocksMoeMLP") -> torch.Tensor:
    w = getattr(experts, name, None)
    if not isinstance(w, torch.Tensor) or w.ndim != 3 or not w.is_floating_point():
        raise _refuse(module, f"experts.{name} is not a dense floating [experts, in, out] tensor "
                              f"(got {type(w).__name__}{'' if w is None else getattr(w, 'shape', '')})", layer)
    return w


def experts_layout(module: nn.Module, hidden: int, *, experts: nn.Module | None = None,
                   layer: str = "MegaBlocksMoeMLP") -> dict[str, Any]:
    """Read and check the experts' layout against the hidden size -> moe_experts' weight arguments. Pure reading:
    raises UnsupportedLayout (naming the attribute) before anything is computed. `experts`: the experts module
    itself where `module` is one (MoEExperts), else `module.experts`."""
    _refuse_here = functools.partial(_refuse, layer=layer)
    experts = getattr(module, "experts", None) if experts is None else experts
    if not isinstance(experts, nn.Module):
        raise _refuse_here(module, "it has no `experts` submodule")
    missing = [f for f in LAYOUT_FLAGS if not isinstance(getattr(experts, f, None), bool)]
    if missing:
        raise _refuse_here(module, f"its experts ({type(experts).__name__}) lack the layout flags {missing}")
    flags = {f: getattr(experts, f) for f in LAYOUT_FLAGS}
    up = _weight(module, experts, "gate_up_proj" if flags["has_gate"] else "up_proj", layer)
    down = _weight(module, experts, "down_proj", layer)
    e = up.shape[0]
    up_in, up_out = (up.shape[1], up.shape[2]) if flags["is_transposed"] else (up.shape[2], up.shape[1])
    down_in, down_out = (down.shape[1], down.shape[2]) if flags["is_transposed"] else (down.shape[2], down.shape[1])
    inter = up_out // 2 if flags["has_gate"] else up_out
    if (up_in != hidden or down_out != hidden or down_in != inter or down.shape[0] != e
            or (flags["has_gate"] and up_out % 2)):
        raise _refuse_here(module, f"expert weights {tuple(up.shape)} / {tuple(down.shape)} do not fit hidden size "
                                   f"{hidden} (is_transposed={flags['is_transposed']})")
    args: dict[str, Any] = {"gate_up_proj": up, "down_proj": down, "is_transposed": flags["is_transposed"],
                            "is_concatenated": flags["is_concatenated"], "has_gate": flags["has_gate"]}
    if flags["has_bias"]:
        up_bias = getattr(experts, "gate_up_proj_bias" if flags["has_gate"] else "up_proj_bias", None)
        down_bias = getattr(experts, "down_proj_bias", None)
        if (not isinstance(up_bias, torch.Tensor) or tuple(up_bias.shape) != (e, up_out)
                or not isinstance(down_bias, torch.Tensor) or tuple(down_bias.shape) != (e, hidden)):
            raise _refuse_here(module, f"has_bias is set but the expert biases are not [{e}, {up_out}] and "
                                       f"[{e}, {hidden}]")
        args.update(gate_up_proj_bias=up_bias, down_proj_bias=down_bias)
    gate = getattr(experts, "_apply_gate", None)
    act = getattr(experts, "act_fn", None)
    if flags["has_gate"] and callable(gate):
        args["gate_fn"] = gate  # the experts' own gate (GPT-OSS: clamped SwiGLU on interleaved halves)
    elif callable(act):
        args["act"] = act
    else:
        raise _refuse_here(module, "its experts have neither `_apply_gate` nor `act_fn`")
    if flags["has_post_expert_norm"]:
        norm = getattr(experts, "post_expert_norm", None)
        if not callable(norm):
            raise _refuse_here(module, "has_post_expert_norm is set but experts.post_expert_norm is missing")
        args["post_fn"] = norm
    return args


def route(module: nn.Module, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's own router on [T, H] -> (scores[T, K], indices[T, K]), checked."""
    router = getattr(module, "router", None)
    if not isinstance(router, nn.Module):
        raise _refuse(module, "it has no `router` submodule")
    out = router(flat)
    if not isinstance(out, tuple) or len(out) != 3:
        raise _refuse(module, f"its router returned {type(out).__name__}, not (logits, scores, indices)")
    _, scores, indices = out
    t = flat.shape[0]
    if (not isinstance(indices, torch.Tensor) or indices.ndim != 2 or indices.shape[0] != t
            or indices.is_floating_point() or not isinstance(scores, torch.Tensor)
            or tuple(scores.shape) != tuple(indices.shape)):
        raise _refuse(module, "its router's scores and indices are not both [tokens, top_k] (indices integer)")
    return scores, indices


def moe_mlp(module: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GptOssMLP's forward on the package's moe_experts (resolved through the package, so the build's one dispatch
    records the call): [B, S, H] -> ([B, S, H], router scores [B*S, K])."""
    if hidden_states.ndim != 3:
        raise _refuse(module, f"the input is {hidden_states.ndim}-D, not [batch, sequence, hidden]")
    b, s, h = hidden_states.shape
    args = experts_layout(module, h)
    flat = hidden_states.reshape(-1, h)
    scores, indices = route(module, flat)
    moe_experts = importlib.import_module(__package__).moe_experts
    out = moe_experts(flat, indices, scores, **args)
    return out.reshape(b, s, h), scores


class MegaBlocksMoeMLP(nn.Module):
    """transformers' "MegaBlocksMoeMLP" (GptOssMLP): router, then the expert block on two ragged dots."""

    has_backward = True
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_mlp(self, hidden_states)


def experts_call(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts call, (hidden[T, H], top_k_index[T, K], top_k_weights[T, K]) -> [T, H], on the
    package's moe_experts with the module's own weights and layout (resolved through the package, so the build's one
    dispatch records the call)."""
    if hidden_states.ndim != 2:
        raise _refuse(module, f"the input is {hidden_states.ndim}-D, not [tokens, hidden]", "MoEExperts")
    args = experts_layout(module, hidden_states.shape[1], experts=module, layer="MoEExperts")
    moe_experts = importlib.import_module(__package__).moe_experts
    return moe_experts(hidden_states, top_k_index, top_k_weights, **args)


class MoEExperts(nn.Module):
    """transformers' experts modules (`Qwen3MoeExperts`, `MixtralExperts`, ... or MoEExpertsLayout below): the
    expert block on two ragged dots. Map a model's experts class to it with transformers 5.25's
    `KernelConfig({"<Family>Experts": "kernel-hub/ragged-dot-tpu:MoEExperts"})` (MoEExpertsLayout takes the class's
    place), or with HF kernels' `kernelize` on any module marked "MoEExperts"."""

    has_backward = True
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return experts_call(self, hidden_states, top_k_index, top_k_weights)


# -- transformers 5.25's layout companion ---------------------------------------------------------------------------

#: Where transformers' configs keep each size, in the order tried (the MoE-specific name first).
_NUM_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
_INTERMEDIATE = ("moe_intermediate_size", "intermediate_size")
_ACT = ("hidden_act", "hidden_activation")


def _config_int(config: Any, names: tuple[str, ...]) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise UnsupportedLayout(f"MoEExpertsLayout: {type(config).__name__} has none of {list(names)} as a positive "
                            "integer; this model's experts are not in a layout MoEExperts computes")


def leave_patch_mapping(cls: type) -> list[str]:
    """Remove every entry of transformers' patch mapping (`register_patch_mapping`) that names `cls`, returning
    their keys. The build in progress keeps the class: transformers' `apply_patches` read the mapping on entry."""
    patching = sys.modules.get("transformers.monkey_patching")
    if patching is None:
        return []
    keys = [k for k, v in patching.get_patch_mapping().items() if v is cls]
    if keys:
        patching.unregister_patch_mapping(keys)
    return keys


def clamped_swiglu(gate_up: torch.Tensor, *, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's gate on interleaved (gate, up) columns: gate clamped above at `limit`, up to [-limit, limit],
    (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate_up[..., 0::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class MoEExpertsLayout(nn.Module):
    """The companion transformers 5.25 finds beside MoEExperts (integrations/hub_kernels.py: `<KernelClass>Layout`):
    with `use_kernels=True` and a KernelConfig mapping `"<Family>Experts"` to `kernel-hub/ragged-dot-tpu:MoEExperts`,
    transformers registers this class with `register_patch_mapping` in place of the model's experts class, builds
    the model with it, and HF kernels' `kernelize` then swaps its forward for MoEExperts' (`kernel_layer_name`).

    It is built from the model's config as transformers' experts classes are, with the same parameter names and
    shapes, so checkpoints load unchanged: gate-first concatenated `gate_up_proj[E, 2I, H]`, `down_proj[E, H, I]` and
    the config's activation (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V3, Gemma 4's text experts); GPT-OSS's
    layout where the config has `swiglu_limit` (`gate_up_proj[E, H, 2I]` interleaved with biases, `down_proj[E, I, H]`,
    the clamped SwiGLU). Its own forward is MoEExperts' computation, so the model is right before kernelize runs and
    wherever HF kernels keeps the original forward. A config it cannot read raises UnsupportedLayout at build.

    Its registration serves the one model build that asked for it: the first instance takes the class out of
    transformers' process-wide patch mapping (`leave_patch_mapping`), so a later plain `from_pretrained` builds the
    model's own experts class even where that KernelConfig call then failed (on CPU, its device check)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        super().__init__()
        leave_patch_mapping(type(self))  # first: a config refused below leaves nothing registered either
        experts, hidden = _config_int(config, _NUM_EXPERTS), _config_int(config, ("hidden_size",))
        inter = _config_int(config, _INTERMEDIATE)
        self.num_experts, self.hidden_dim, self.intermediate_dim = experts, hidden, inter
        self.has_gate, self.has_post_expert_norm = True, False
        if getattr(config, "swiglu_limit", None) is not None:  # GPT-OSS
            self.is_transposed, self.is_concatenated, self.has_bias = True, False, True
            self.gate_up_proj = nn.Parameter(torch.empty(experts, hidden, 2 * inter))
            self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * inter))
            self.down_proj = nn.Parameter(torch.empty(experts, inter, hidden))
            self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))
            self.alpha, self.limit = float(config.swiglu_alpha), float(config.swiglu_limit)
            self._apply_gate = functools.partial(clamped_swiglu, alpha=self.alpha, limit=self.limit)
            return
        self.is_transposed, self.is_concatenated, self.has_bias = False, True, False
        act = next((getattr(config, n) for n in _ACT if isinstance(getattr(config, n, None), str)), None)
        activations = importlib.import_module(__package__)._ACTIVATIONS
        if act not in activations:
            raise UnsupportedLayout(f"MoEExpertsLayout: activation {act!r} of {type(config).__name__} is not one of "
                                    f"{sorted(activations)}")
        self.act_fn = activations[act]
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inter))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return experts_call(self, hidden_states, top_k_index, top_k_weights)
