"""An AttentionInterface function for transformers, registered by hand under a name of your own.

(transformers' hub attention by repo id, `attn_implementation="kernel-hub/flash-attention-tpu"`, loads
flash_attn_api.py's functions instead; it never reaches a function named after a colon in a flash-named repo.)
Registered with FlashAttention-2's mask function, it gets None when no token is padding, else the 2-D [batch, keys]
padding mask.
This function reads the calling attention module's own attributes and kwargs (`is_causal`, `scaling`,
`sliding_window`, `softcap`, `s_aux` sinks) and runs this package's `flash_attention` (q/k/v [B, H, S, D], GQA
without repeating K/V), returning ([B, S, H, D], None) like transformers' own functions.

Masks: none, or one contiguous run of real tokens per sequence at either end (right padding in a prefill; left
padding, as generation pads, in a prefill or a cached step: the keys, and in a prefill the queries, are rolled so the
real tokens come first and the kernel's per-sequence lengths cover them; the output is rolled back, padding query
rows come out 0). Anything else (holes in the mask, attention dropout, a value head size other than the query's)
raises `UnsupportedAttentionCall` naming it: this function never computes numbers for a call it cannot express.
"""

from __future__ import annotations

from typing import Any

import torch


class UnsupportedAttentionCall(ValueError):
    """An attention call this kernel cannot compute exactly; the message names what to change."""


def _refuse(module: Any, what: str) -> UnsupportedAttentionCall:
    return UnsupportedAttentionCall(
        f"kernel-hub/flash-attention-tpu attention_forward cannot run this {type(module).__name__} call: {what}. Use "
        "another attn_implementation for it (or kernel_hub.kernelize, which falls back per call)")


def _run(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(first real index, real count) per sequence of a [B, S] boolean mask, and whether each row's real tokens are
    one contiguous run."""
    s = mask.shape[1]
    idx = torch.arange(s, device=mask.device)
    count = mask.sum(-1)
    first = torch.where(mask, idx, s).amin(-1).clamp(max=s)
    run = (idx[None] >= first[:, None]) & (idx[None] < (first + count)[:, None])
    return first, count, bool((run == mask).all())


def _roll(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x[B, H, S, D] with sequence b rolled left by shift[b] (position j takes j + shift)."""
    s = x.shape[2]
    index = (torch.arange(s, device=x.device)[None] + shift[:, None]) % s  # [B, S]
    return torch.gather(x, 2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' AttentionInterface call on the kernel: q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] -> [B, Sq, Hq, D]."""
    from . import flash_attention  # the package's entry: the build's one dispatch records the call

    if dropout:
        raise _refuse(module, f"attention dropout {dropout} (the kernel has none; call model.eval())")
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise _refuse(module, f"head sizes q {query.shape[-1]}, k {key.shape[-1]}, v {value.shape[-1]} differ")
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True)) if causal is None else bool(causal)
    window = None if sliding_window is None else int(sliding_window)
    cap = softcap if softcap else None  # transformers follows flash-attn: a softcap of 0 means none
    options = dict(causal=causal, sm_scale=scaling, sliding_window=window, logits_soft_cap=cap, sinks=s_aux)
    sq, skv = query.shape[2], key.shape[2]
    if attention_mask is None:
        return flash_attention(query, key, value, **options).transpose(1, 2).contiguous(), None
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (query.shape[0], skv):
        raise _refuse(module, f"a {tuple(attention_mask.shape)} mask (expected FlashAttention-2's [batch, keys] "
                              "padding mask)")
    first, count, contiguous = _run(attention_mask.bool())
    if not contiguous or not bool((count > 0).all()):
        raise _refuse(module, "a padding mask whose real tokens are not one contiguous run per sequence")
    left = bool((first + count == skv).all())  # real tokens end each row: left padding (or none)
    if not left and not (bool((first == 0).all()) and sq == skv):
        raise _refuse(module, "right padding in a cached step (the new tokens would not end the keys)")
    k, v = (_roll(key, first), _roll(value, first)) if left else (key, value)
    if sq == skv:
        q = _roll(query, first) if left else query
        out = flash_attention(q, k, v, q_lengths=count.to(torch.int32), kv_lengths=count.to(torch.int32), **options)
        out = _roll(out, (-first) % skv) if left else out
    else:
        if not bool((count >= sq).all()):
            raise _refuse(module, "a query token that is padding in a cached step")
        out = flash_attention(query, k, v, kv_lengths=count.to(torch.int32), **options)
    return out.transpose(1, 2).contiguous(), None
