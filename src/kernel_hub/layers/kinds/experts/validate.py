"""The moe_experts kind's validate job: a block's kernel call against its own implementation on VALIDATION_TOKENS
random tokens routed to random experts (a private generator; on a sharded block's local slices; training: the
gradients of the hidden states, routing weights and expert weights too), with the block's weights held so a kernel
that writes them is undone and refused (layers/layer_check.py's shared rules).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from ...layer_check import rel_error
from ...sharded import local_parameters
from ...weights_guard import check_output, held_weights
from .find import ExpertsLayout

VALIDATION_TOKENS = 16

if TYPE_CHECKING:
    from .contract import ExpertsCall


def experts_batch(layout: ExpertsLayout, top_k: int, dtype: torch.dtype, device: torch.device, seed: int):
    """(hidden, top_k_index, top_k_weights) for one expert block: VALIDATION_TOKENS tokens, random experts."""
    g = torch.Generator().manual_seed(seed)  # private generator: the user's RNG stream is untouched
    t, e = VALIDATION_TOKENS, layout.num_experts
    hidden = torch.randn(t, layout.hidden_size, generator=g).to(device, dtype)
    index = torch.argsort(torch.rand(t, e, generator=g), dim=1)[:, :top_k].to(device)
    weights = torch.softmax(torch.randn(t, top_k, generator=g), dim=-1).to(device, dtype)
    return hidden, index, weights


def _named_inputs(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"hidden_states": hidden, "top_k_index": index, "top_k_weights": weights}


def validate_layer(
    module: torch.nn.Module, layout: ExpertsLayout, call: ExpertsCall, reference: ExpertsCall, *, mode: str, top_k: int,
    seed: int = 0,
) -> float:
    """Largest relative error of the kernel against `reference` on a random batch of this block's shapes
    (training: the output and the gradients of hidden states, routing weights and expert weights)."""
    with local_parameters(module):  # a sharded block is checked on this rank's slices, as it runs
        return _validate_local(module, layout, call, reference, mode=mode, top_k=top_k, seed=seed)


def _validate_local(module: torch.nn.Module, layout: ExpertsLayout, call: ExpertsCall, reference: ExpertsCall, *,
                    mode: str, top_k: int, seed: int) -> float:
    weight = module.gate_up_proj if layout.has_gate else module.up_proj
    # the block's compute dtype (an FP8 model's weights are float8; its activations are not)
    hidden, index, weights = experts_batch(layout, top_k, getattr(torch, layout.dtype), weight.device, seed)
    if mode == "inference":
        with torch.no_grad():
            ref = reference(module, hidden, index, weights)
            # a kernel that wrote to any weight of the model or to its inputs is undone and refused
            with held_weights(module, inputs=_named_inputs(hidden, index, weights)):
                out = call(module, hidden, index, weights)
        check_output(out, ref, "the block")
        return rel_error(out, ref)
    params = [p for p in module.parameters(recurse=False) if p.requires_grad]
    g = torch.Generator().manual_seed(seed + 1)
    cotangent = None
    grads = []
    for fn in (reference, call):
        h = hidden.clone().requires_grad_(True)
        w = weights.clone().requires_grad_(True)
        # the kernel's forward and backward run with the block's weights held (undone and refused if written)
        with torch.enable_grad(), (held_weights(module, inputs=_named_inputs(h, index, w)) if fn is call
                                   else contextlib.nullcontext()):
            y = fn(module, h, index, w)
            if cotangent is None:
                cotangent = torch.randn(y.shape, generator=g).to(y.device, y.dtype)
            inputs = [h, w, *params]
            grads.append((y, torch.autograd.grad((y * cotangent).sum(), inputs, allow_unused=True)))
    (ref, ref_grads), (out, out_grads) = grads
    check_output(out, ref, "the block")
    errors = [rel_error(out, ref)] + [rel_error(a, b) for a, b in zip(out_grads, ref_grads, strict=True)]
    return max(errors)
