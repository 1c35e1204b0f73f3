"""The attention kind's validate job: the inputs its layers are checked on (private generators, so the user's RNG
stream is untouched). transformers: two forwards of the whole model on random tokens, one left-padded
(`model_forwards`); each layer's kernel call is compared in the adapter's probe mode while these run. Diffusers: one
call of the attention module on random hidden states of its widths (`diffusers_attention_call`)."""

from __future__ import annotations

from typing import Any

import torch

from ...layer_check import dtype_device

ATTENTION_BATCH, ATTENTION_TOKENS, ATTENTION_PAD = 2, 24, 5
DIFFUSERS_BATCH, DIFFUSERS_TOKENS, DIFFUSERS_ENCODER_TOKENS = 2, 24, 7


def _first_tensor(out: Any) -> torch.Tensor | None:
    """A model output's main tensor (logits, else last_hidden_state, else its first tensor field)."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    values = out.values() if hasattr(out, "values") else out if isinstance(out, tuple | list) else (out,)
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def model_forwards(model: torch.nn.Module, device: torch.device) -> list[torch.Tensor | None]:
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


def diffusers_attention_call(module: torch.nn.Module, encoder: int | None, seed: int) -> None:
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
