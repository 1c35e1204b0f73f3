"""The validate job: a candidate layer's numbers, kernel against the layer's own forward, before any swap.

Why one module: every kind is checked the same way (fresh random inputs of the layer's own shapes and dtype from a
private generator, so the user's RNG stream is untouched; numerics.relative_error against what the layer computes
now; the dtype's tolerance from numerics.TOLERANCE; in training mode the gradients too), and the verdict is
plan.verdict's. The inputs each kind is checked on:

- moe_experts: VALIDATION_TOKENS tokens routed to random experts (`validate_layer`), on a sharded block's local slices;
- rms_norm: NORM_ROWS random rows, each of the kernel's forms (`norm_form_errors`);
- attention (transformers): two forwards of the whole model on random tokens, one left-padded (`model_forwards`);
  each layer's kernel call is compared in the attention adapter's probe mode while these run;
- attention (Diffusers): one call of the attention module on random hidden states of its widths
  (`diffusers_attention_call`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from ..numerics import TOLERANCE as TOLERANCES_BY_NAME
from ..numerics import relative_error
from .find import ExpertsLayout
from .plan import FORMS
from .sharded import local_parameters
from .weights_guard import check_output, held_weights

#: Relative error (numerics.relative_error of kernel vs default) allowed per dtype: numerics.TOLERANCE, by torch dtype.
TOLERANCE = {getattr(torch, name): tol for name, tol in TOLERANCES_BY_NAME.items()}
VALIDATION_TOKENS = 16
NORM_ROWS = 16
ATTENTION_BATCH, ATTENTION_TOKENS, ATTENTION_PAD = 2, 24, 5
DIFFUSERS_BATCH, DIFFUSERS_TOKENS, DIFFUSERS_ENCODER_TOKENS = 2, 24, 7

#: fn(module, hidden[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H]: an expert block's call.
ExpertsCall = Any


def tolerance_for(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, 1e-4)


def rel_error(out: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """numerics.relative_error, where a gradient may be None on both sides (0) or one (inf)."""
    if out is None and ref is None:
        return 0.0
    if out is None or ref is None:
        return math.inf
    return relative_error(out, ref)


def experts_batch(layout: ExpertsLayout, top_k: int, dtype: torch.dtype, device: Any, seed: int):
    """(hidden, top_k_index, top_k_weights) for one expert block: VALIDATION_TOKENS tokens, random experts."""
    g = torch.Generator().manual_seed(seed)  # private generator: the user's RNG stream is untouched
    t, e = VALIDATION_TOKENS, layout.num_experts
    hidden = torch.randn(t, layout.hidden_size, generator=g).to(device, dtype)
    index = torch.argsort(torch.rand(t, e, generator=g), dim=1)[:, :top_k].to(device)
    weights = torch.softmax(torch.randn(t, top_k, generator=g), dim=-1).to(device, dtype)
    return hidden, index, weights


def validate_layer(
    module: Any, layout: ExpertsLayout, call: ExpertsCall, reference: Any, *, mode: str, top_k: int,
    seed: int = 0,
) -> float:
    """Largest relative error of the kernel against `reference` on a random batch of this block's shapes
    (training: the output and the gradients of hidden states, routing weights and expert weights)."""
    with local_parameters(module):  # a sharded block is checked on this rank's slices, as it runs
        return _validate_local(module, layout, call, reference, mode=mode, top_k=top_k, seed=seed)


def _validate_local(module: Any, layout: ExpertsLayout, call: ExpertsCall, reference: Any, *, mode: str,
                    top_k: int, seed: int) -> float:
    weight = module.gate_up_proj if layout.has_gate else module.up_proj
    # the block's compute dtype (an FP8 model's weights are float8; its activations are not)
    hidden, index, weights = experts_batch(layout, top_k, getattr(torch, layout.dtype), weight.device, seed)
    if mode == "inference":
        with torch.no_grad():
            ref = reference(module, hidden, index, weights)
            with held_weights(module):  # a kernel that wrote to the block's weights is undone and refused
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
        with torch.enable_grad(), held_weights(module) if fn is call else contextlib.nullcontext():
            y = fn(module, h, index, w)
            if cotangent is None:
                cotangent = torch.randn(y.shape, generator=g).to(y.device, y.dtype)
            inputs = [h, w, *params]
            grads.append((y, torch.autograd.grad((y * cotangent).sum(), inputs, allow_unused=True)))
    (ref, ref_grads), (out, out_grads) = grads
    check_output(out, ref, "the block")
    errors = [rel_error(out, ref)] + [rel_error(a, b) for a, b in zip(out_grads, ref_grads, strict=True)]
    return max(errors)


def norm_form_errors(module: Any, kernel: Any, eps: float, mode: str, seed: int) -> list[float]:
    """Error of each plan.FORMS entry of the kernel's rms_norm against the module's current forward on random rows
    (training: the max with the gradients of x and weight); a form whose output dtype differs scores inf."""
    weight = module.weight
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(NORM_ROWS, weight.shape[0], generator=g) * 3.0).to(weight.device, weight.dtype)
    if mode != "training":
        with torch.no_grad():
            ref = module.forward(x)
            with held_weights(module):  # a kernel that wrote to the norm's weight is undone and refused
                outs = [kernel.rms_norm(x, weight, eps=eps, zero_centered=zc, scale_after_cast=sac)
                        for zc, sac in FORMS]
        return _form_scores(outs, ref, [rel_error(o, ref) if _fits(o, ref) else math.inf for o in outs])
    cot = torch.randn(NORM_ROWS, weight.shape[0], generator=g).to(weight.device, weight.dtype)

    def run(fn):
        xx = x.clone().requires_grad_(True)
        with torch.enable_grad():
            y = fn(xx)
            grads = torch.autograd.grad((y.float() * cot.float()).sum(), [xx, weight], allow_unused=True)
        return y, grads

    ref, ref_grads = run(module.forward)
    errors, outs = [], []
    for zc, sac in FORMS:
        with held_weights(module):
            out, grads = run(lambda t, zc=zc, sac=sac: kernel.rms_norm(t, weight, eps=eps, zero_centered=zc,
                                                                      scale_after_cast=sac))
        outs.append(out)
        if not _fits(out, ref):
            errors.append(math.inf)
            continue
        errs = [rel_error(out, ref)] + [rel_error(a, b) for a, b in zip(grads, ref_grads, strict=True)]
        errors.append(max(errs))
    return _form_scores(outs, ref, errors)


def _fits(out: Any, ref: torch.Tensor) -> bool:
    return isinstance(out, torch.Tensor) and out.dtype == ref.dtype and out.shape == ref.shape


def _form_scores(outs: list[Any], ref: torch.Tensor, errors: list[float]) -> list[float]:
    """`errors`, or KernelRefused naming what the kernel returned when no form gives the layer's dtype and shape."""
    if not any(_fits(o, ref) for o in outs):
        check_output(outs[0], ref, "the layer")
    return errors


def _first_tensor(out: Any) -> torch.Tensor | None:
    """A model output's main tensor (logits, else last_hidden_state, else its first tensor field)."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    values = out.values() if hasattr(out, "values") else out if isinstance(out, tuple | list) else (out,)
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def model_forwards(model: Any, device: Any) -> list[torch.Tensor | None]:
    """Two forwards on random tokens: no padding (the mask-free path) and left padding in row 1; their outputs."""
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    x = torch.randint(min(3, vocab - 1), vocab, (ATTENTION_BATCH, ATTENTION_TOKENS), generator=g).to(device)
    mask = torch.ones_like(x)
    mask[1, :ATTENTION_PAD] = 0
    rows = mask.bool()  # real tokens (a padded row's output is not part of the check)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # a training-mode model draws the same dropout
        torch.manual_seed(0)
        plain = _first_tensor(model(input_ids=x, use_cache=False))
        padded = _first_tensor(model(input_ids=x, attention_mask=mask, use_cache=False))
    if padded is not None and padded.shape[:2] == rows.shape:
        padded = padded[rows]
    return [plain, padded]


def dtype_device(module: Any) -> tuple[torch.dtype, torch.device]:
    p = next(module.parameters(), None)
    return (p.dtype, p.device) if p is not None else (torch.float32, torch.device("cpu"))


def diffusers_attention_call(module: Any, encoder: int | None, seed: int) -> None:
    """Run a Diffusers attention module on random hidden states of its own widths (no mask: the kernel's main
    path), with encoder states of width `encoder` when given."""
    to_q = getattr(module, "to_q", None)
    if not isinstance(to_q, torch.nn.Linear):
        raise ValueError("no to_q projection to size a validation batch")
    dtype, device = dtype_device(module)
    g = torch.Generator().manual_seed(seed)  # private generator: the user's RNG stream is untouched
    kwargs = {}
    if encoder is not None:
        kwargs["encoder_hidden_states"] = torch.randn(DIFFUSERS_BATCH, DIFFUSERS_ENCODER_TOKENS, encoder,
                                                      generator=g).to(device, dtype)
    hidden = torch.randn(DIFFUSERS_BATCH, DIFFUSERS_TOKENS, to_q.in_features, generator=g).to(device, dtype)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        module(hidden, **kwargs)
