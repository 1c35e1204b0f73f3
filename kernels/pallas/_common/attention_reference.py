"""NumPy float64 reference: per (batch, head) loops over explicit masks, sharing no code with the kernels.

Semantics every implementation follows:
  * query i of sequence b attends key j when i < q_len[b] and j < kv_len[b], and
    - causal: j <= i + (kv_len[b] - q_len[b])   (bottom-right alignment, as with a KV cache),
    - sliding_window=W: j > i + (kv_len[b] - q_len[b]) - W   (the W most recent keys, itself included);
  * logits = sm_scale * q.k, then cap * tanh(logits / cap) with a soft cap;
  * a sink logit (per query head) joins the softmax denominator and contributes no value;
  * rows with no key to attend (padding rows, or rows the mask empties) are 0.
"""

from __future__ import annotations

import numpy as np

from .arrays import to_f64


def reference_mask(
    q_len: int, kv_len: int, sq: int, skv: int, *, causal: bool, sliding_window: int | None
) -> np.ndarray:
    """[sq, skv] boolean mask for one sequence with q_len valid queries and kv_len valid keys."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    mask = (i < q_len) & (j < kv_len)
    pos = i + (kv_len - q_len)  # the query's position on the key axis
    if causal:
        mask &= j <= pos
    if sliding_window is not None:
        mask &= j > pos - sliding_window
    return mask


def reference_attention(
    q: object,
    k: object,
    v: object,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: object | None = None,
    q_lengths: object | None = None,
    kv_lengths: object | None = None,
) -> np.ndarray:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] in float64; see the module docstring."""
    q64, k64, v64 = to_f64(q), to_f64(k), to_f64(v)
    b, hq, sq, d = q64.shape
    hkv, skv = k64.shape[1], k64.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads {hq} must be a multiple of kv heads {hkv}")
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if sm_scale is None else float(sm_scale)
    qls = np.full(b, sq) if q_lengths is None else np.minimum(to_f64(q_lengths).astype(np.int64), sq)
    kls = np.full(b, skv) if kv_lengths is None else np.minimum(to_f64(kv_lengths).astype(np.int64), skv)
    sink64 = None if sinks is None else to_f64(sinks)
    out = np.zeros((b, hq, sq, v64.shape[-1]), dtype=np.float64)
    for bi in range(b):
        mask = reference_mask(int(qls[bi]), int(kls[bi]), sq, skv, causal=causal, sliding_window=sliding_window)
        for h in range(hq):
            logits = scale * (q64[bi, h] @ k64[bi, h // group].T)
            if logits_soft_cap is not None:
                logits = logits_soft_cap * np.tanh(logits / logits_soft_cap)
            logits = np.where(mask, logits, -np.inf)
            row_max = logits.max(axis=1, keepdims=True)
            if sink64 is not None:
                row_max = np.maximum(row_max, sink64[h])
            row_max = np.where(np.isfinite(row_max), row_max, 0.0)
            weights = np.where(mask, np.exp(logits - row_max), 0.0)
            denom = weights.sum(axis=1, keepdims=True)
            if sink64 is not None:
                denom = denom + np.exp(sink64[h] - row_max)
            denom = np.where(denom > 0, denom, 1.0)
            out[bi, h] = (weights / denom) @ v64[bi, h // group]
    return out


def reference_decode_attention(
    q: object,
    k_cache: object,
    v_cache: object,
    kv_lengths: object,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: object | None = None,
) -> np.ndarray:
    """One query per sequence, q[B,Hq,D], at position kv_len-1 of its cache: [B,Hq,D] in float64."""
    q64 = to_f64(q)[:, :, None, :]
    out = reference_attention(
        q64, k_cache, v_cache, causal=True, sm_scale=sm_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, sinks=sinks, q_lengths=np.ones(q64.shape[0], np.int64),
        kv_lengths=kv_lengths,
    )
    return out[:, :, 0, :]
