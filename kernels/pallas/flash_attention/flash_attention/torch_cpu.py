"""Torch-native attention with the package's semantics (see reference.py), for the torch-cpu build.

Masked softmax attention computed in float32 whatever the input dtype (so bf16 matches the kernels'
f32 accumulation), GQA without repeating K/V, sinks in the denominator, rows with nothing to attend
come out 0. Differentiable through torch autograd. Imports torch only: jax may be absent here.
"""

from __future__ import annotations

import torch


def length_mask(
    b: int, sq: int, skv: int, *, causal: bool, sliding_window: int | None,
    q_lengths: torch.Tensor | None, kv_lengths: torch.Tensor | None, device: torch.device,
) -> torch.Tensor:
    """[B, Sq, Skv] boolean mask, bottom-right aligned per sequence (reference_mask, batched)."""
    ql = torch.full((b,), sq, device=device) if q_lengths is None else q_lengths.to(device).long().clamp(0, sq)
    kl = torch.full((b,), skv, device=device) if kv_lengths is None else kv_lengths.to(device).long().clamp(0, skv)
    i = torch.arange(sq, device=device)[None, :, None]
    j = torch.arange(skv, device=device)[None, None, :]
    mask = (i < ql[:, None, None]) & (j < kl[:, None, None])
    pos = i + (kl - ql)[:, None, None]
    if causal:
        mask = mask & (j <= pos)
    if sliding_window is not None:
        mask = mask & (j > pos - sliding_window)
    return mask


def attention_torch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, sm_scale: float,
    sliding_window: int | None, logits_soft_cap: float | None, sinks: torch.Tensor | None,
    q_lengths: torch.Tensor | None, kv_lengths: torch.Tensor | None,
) -> torch.Tensor:
    """q[B,Hq,Sq,D], k/v[B,Hkv,Skv,D] -> [B,Hq,Sq,D] in q's dtype."""
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    g = hq // hkv
    qf = q.float().reshape(b, hkv, g * sq, d)
    logits = torch.matmul(qf, k.float().transpose(-1, -2)).reshape(b, hkv, g, sq, skv) * sm_scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
    mask = length_mask(b, sq, skv, causal=causal, sliding_window=sliding_window, q_lengths=q_lengths,
                       kv_lengths=kv_lengths, device=q.device)[:, None, None]
    logits = logits.masked_fill(~mask, float("-inf"))
    row_max = logits.amax(dim=-1, keepdim=True)
    sink = None
    if sinks is not None:
        sink = sinks.float().reshape(1, hkv, g, 1, 1)
        row_max = torch.maximum(row_max, sink)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    weights = torch.exp(logits - row_max)  # masked entries: exp(-inf) = 0
    denom = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - row_max)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    probs = (weights / denom).reshape(b, hkv, g * sq, skv)
    out = torch.matmul(probs, v.float()).reshape(b, hq, sq, v.shape[-1])
    return out.to(q.dtype)
