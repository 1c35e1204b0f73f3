"""Torch-facing entry of the flash-attention kernel (the package __init__ of the torch-* builds).

`flash_attention(q[B,Hq,Sq,D], k[B,Hkv,Skv,D], v, ...)` has the JAX entry's contract on torch tensors:
bottom-right causal alignment, sliding window, logits soft-cap, sinks in the softmax denominator,
per-sequence q/kv lengths, rows with nothing to attend = 0. On CPU it runs torch-native (torch_cpu.py;
jax is never imported, so the torch-cpu build runs where only torch is installed); elsewhere, or with
implementation="jax", it bridges to the JAX package function (torch_bridge.py). Both differentiable.
"""

from __future__ import annotations

import math

import torch

from .torch_cpu import attention_torch

__all__ = ["describe", "flash_attention", "implementation_for"]

IMPLEMENTATIONS = ("torch", "jax")


def implementation_for(device: torch.device | str) -> str:
    """The implementation flash_attention picks for tensors on `device`."""
    return "torch" if torch.device(device).type == "cpu" else "jax"


def describe(device: torch.device | str) -> str:
    """Human-readable name of what runs on `device` (for reports)."""
    if implementation_for(device) == "torch":
        return "torch-native masked attention (f32 softmax)"
    return "jax flash_attention via " + ("DLPack" if torch.device(device).type == "cuda" else "torch_tpu jax_op")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sliding_window: int | None) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-dim q, k, v; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must match")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"batch/head_dim of q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} must be a multiple of kv heads {k.shape[1]}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    q_lengths: torch.Tensor | None = None,
    kv_lengths: torch.Tensor | None = None,
    implementation: str | None = None,
) -> torch.Tensor:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D] (see the JAX entry's docstring).

    implementation: "torch" (native) or "jax" (the Pallas/XLA kernel through the bridge); None picks by
    device (implementation_for).
    """
    _check(q, k, v, sliding_window)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = None if sliding_window is None else int(sliding_window)
    cap = None if logits_soft_cap is None else float(logits_soft_cap)
    impl = implementation or implementation_for(q.device)
    if impl == "torch":
        return attention_torch(q, k, v, causal=bool(causal), sm_scale=scale, sliding_window=window,
                               logits_soft_cap=cap, sinks=sinks, q_lengths=q_lengths, kv_lengths=kv_lengths)
    if impl == "jax":
        from .torch_bridge import attention_jax

        return attention_jax(q, k, v, sinks=sinks, q_lengths=q_lengths, kv_lengths=kv_lengths, causal=bool(causal),
                             sm_scale=scale, sliding_window=window, logits_soft_cap=cap)
    raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLEMENTATIONS}")
