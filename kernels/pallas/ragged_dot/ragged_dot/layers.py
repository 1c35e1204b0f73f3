"""Layer classes in Hugging Face kernels' convention, for `kernels.kernelize` with a LayerRepository pointing here.

HF kernels replaces the `forward` of a module whose class transformers marked `use_kernel_forward_from_hub(NAME)`
with the forward of the class NAME found here, bound to the original module: a forward reads only the replaced
module's own attributes, and a class carries no constructor and no members beyond `has_backward` /
`can_torch_compile` (HF kernels refuses others), so the helpers below are module functions.

What this build serves, and why only that: transformers 5.24 marks one Mixture-of-Experts layer with a hub name,
"MegaBlocksMoeMLP" (GptOssMLP: a `router` submodule and an `experts` submodule; forward(hidden_states) ->
(hidden_states, router_scores)). Qwen3-MoE, Mixtral and the other MoE families reach their experts through
transformers' ExpertsInterface, whose names are fixed inside transformers (no repository hook), and the only other
router name, "SoftmaxTopKRouter", is a top-k softmax with no grouped matmul in it. So:

  MegaBlocksMoeMLP  the module's own router picks each token's experts and weights; the expert block runs on this
                    package's `moe_experts` (two ragged dots) with the experts' own weights, biases, gate
                    (`_apply_gate`, e.g. GPT-OSS's clamped SwiGLU), activation and post-expert norm, in the layout
                    transformers' `use_experts_implementation` records on the experts (is_transposed,
                    is_concatenated, has_gate, has_bias, has_post_expert_norm). A module without that layout (no
                    `router`, quantized experts without dense `gate_up_proj`, shapes that disagree) raises
                    `UnsupportedLayout` naming what is missing: it never computes numbers for a layout it does not
                    know.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

#: The layout flags transformers' `use_experts_implementation` sets on every experts instance.
LAYOUT_FLAGS = ("is_transposed", "is_concatenated", "has_gate", "has_bias", "has_post_expert_norm")


class UnsupportedLayout(TypeError):
    """The replaced module is not in a layout this layer computes; its message names what to fix."""


def _refuse(module: nn.Module, what: str) -> UnsupportedLayout:
    return UnsupportedLayout(
        f"kernel-hub/ragged-dot-tpu layers.MegaBlocksMoeMLP cannot serve {type(module).__name__}: {what}. It serves "
        "GPT-OSS's MoE MLP layout (a `router` returning (logits, scores[T,K], indices[T,K]) and `experts` carrying "
        "transformers' use_experts_implementation layout with dense float weights); map this layer elsewhere or "
        "leave it unkernelized")


def _weight(module: nn.Module, experts: nn.Module, name: str) -> torch.Tensor:
    w = getattr(experts, name, None)
    if not isinstance(w, torch.Tensor) or w.ndim != 3 or not w.is_floating_point():
        raise _refuse(module, f"experts.{name} is not a dense floating [experts, in, out] tensor "
                              f"(got {type(w).__name__}{'' if w is None else getattr(w, 'shape', '')})")
    return w


def experts_layout(module: nn.Module, hidden: int) -> dict[str, Any]:
    """Read and check the experts' layout against the hidden size -> moe_experts' weight arguments. Pure reading:
    raises UnsupportedLayout (naming the attribute) before anything is computed."""
    experts = getattr(module, "experts", None)
    if not isinstance(experts, nn.Module):
        raise _refuse(module, "it has no `experts` submodule")
    missing = [f for f in LAYOUT_FLAGS if not isinstance(getattr(experts, f, None), bool)]
    if missing:
        raise _refuse(module, f"its experts ({type(experts).__name__}) lack the layout flags {missing}")
    flags = {f: getattr(experts, f) for f in LAYOUT_FLAGS}
    up = _weight(module, experts, "gate_up_proj" if flags["has_gate"] else "up_proj")
    down = _weight(module, experts, "down_proj")
    e = up.shape[0]
    up_in, up_out = (up.shape[1], up.shape[2]) if flags["is_transposed"] else (up.shape[2], up.shape[1])
    down_in, down_out = (down.shape[1], down.shape[2]) if flags["is_transposed"] else (down.shape[2], down.shape[1])
    inter = up_out // 2 if flags["has_gate"] else up_out
    if (up_in != hidden or down_out != hidden or down_in != inter or down.shape[0] != e
            or (flags["has_gate"] and up_out % 2)):
        raise _refuse(module, f"expert weights {tuple(up.shape)} / {tuple(down.shape)} do not fit hidden size "
                              f"{hidden} (is_transposed={flags['is_transposed']})")
    args: dict[str, Any] = {"gate_up_proj": up, "down_proj": down, "is_transposed": flags["is_transposed"],
                            "is_concatenated": flags["is_concatenated"], "has_gate": flags["has_gate"]}
    if flags["has_bias"]:
        up_bias = getattr(experts, "gate_up_proj_bias" if flags["has_gate"] else "up_proj_bias", None)
        down_bias = getattr(experts, "down_proj_bias", None)
        if (not isinstance(up_bias, torch.Tensor) or tuple(up_bias.shape) != (e, up_out)
                or not isinstance(down_bias, torch.Tensor) or tuple(down_bias.shape) != (e, hidden)):
            raise _refuse(module, f"has_bias is set but the expert biases are not [{e}, {up_out}] and [{e}, {hidden}]")
        args.update(gate_up_proj_bias=up_bias, down_proj_bias=down_bias)
    gate = getattr(experts, "_apply_gate", None)
    act = getattr(experts, "act_fn", None)
    if flags["has_gate"] and callable(gate):
        args["gate_fn"] = gate  # the experts' own gate (GPT-OSS: clamped SwiGLU on interleaved halves)
    elif callable(act):
        args["act"] = act
    else:
        raise _refuse(module, "its experts have neither `_apply_gate` nor `act_fn`")
    if flags["has_post_expert_norm"]:
        norm = getattr(experts, "post_expert_norm", None)
        if not callable(norm):
            raise _refuse(module, "has_post_expert_norm is set but experts.post_expert_norm is missing")
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
