"""Ragged paged attention in NumPy float64, one sequence and one query at a time: the oracle the kernel and its CPU
paths are checked against. Written for clarity, not speed; shares no code with the implementations.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_E4M3_MAX = 448.0


def _e4m3_rows(x: np.ndarray, scale: float) -> np.ndarray:
    """What an fp8 cache holds for rows x, read back in float64: x / scale saturated to e4m3's range, rounded."""
    import ml_dtypes

    return np.clip(x / scale, -_E4M3_MAX, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale


def reference_ragged_paged_attention(
    queries: Any,
    keys: Any,
    values: Any,
    k_cache: Any,
    v_cache: Any,
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    num_seqs: int | None = None,
    *,
    sinks: Any = None,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    causal: bool = True,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out [T, Hq, D], k_cache, v_cache) in float64, the caches with every sequence's new rows written.

    Sequence i's new tokens are rows cu_q_lens[i]:cu_q_lens[i+1] of queries/keys/values; they take positions
    kv_lens[i] - q_len .. kv_lens[i] - 1 of the sequence, position p living in page page_indices[i, p // P] at
    slot p % P. Query j sees positions <= its own (causal) and > its own - sliding_window; sinks add one logit per
    query head to the softmax denominator only. Rows of padding tokens and of queries that see nothing are 0.

    float8_e4m3fn caches are dequantized here (stored x -> x * scale, k_scale / v_scale default 1.0) and the new rows
    quantized as stored (x / scale clipped to +-448, rounded to e4m3 by ml_dtypes); the caches come back dequantized.
    """
    q = np.asarray(queries, np.float64)
    k_new, v_new = np.asarray(keys, np.float64), np.asarray(values, np.float64)
    kc, vc = np.array(k_cache, np.float64), np.array(v_cache, np.float64)
    if str(np.asarray(k_cache).dtype) == "float8_e4m3fn":
        ks, vs = (1.0 if x is None else float(x) for x in (k_scale, v_scale))
        kc, vc = kc * ks, vc * vs
        k_new, v_new = _e4m3_rows(k_new, ks), _e4m3_rows(v_new, vs)
    lens, table, cu = (np.asarray(x).astype(np.int64) for x in (kv_lens, page_indices, cu_q_lens))
    n = len(lens) if num_seqs is None else int(num_seqs)
    tokens, hq, d = q.shape
    hkv, page = kc.shape[2], kc.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    out = np.zeros((tokens, hq, d))
    for i in range(n):
        start, stop = int(cu[i]), int(cu[i + 1])
        kv_len = int(lens[i])
        first = kv_len - (stop - start)
        for j, t in enumerate(range(start, stop)):  # the cache update
            pos = first + j
            kc[table[i, pos // page], pos % page] = k_new[t]
            vc[table[i, pos // page], pos % page] = v_new[t]
        ks = np.stack([kc[table[i, p // page], p % page] for p in range(kv_len)]) if kv_len else np.zeros((0, hkv, d))
        vs = np.stack([vc[table[i, p // page], p % page] for p in range(kv_len)]) if kv_len else np.zeros((0, hkv, d))
        for j, t in enumerate(range(start, stop)):
            own = first + j
            seen = [p for p in range(kv_len) if (not causal or p <= own)
                    and (sliding_window is None or p > own - sliding_window)]
            for h in range(hq):
                logits = np.array([q[t, h] @ ks[p, h // group] for p in seen]) * scale
                if soft_cap is not None:
                    logits = soft_cap * np.tanh(logits / soft_cap)
                extra = [] if sinks is None else [float(np.asarray(sinks, np.float64)[h])]
                if not seen:
                    continue
                top = max([*logits, *extra])
                weights = np.exp(logits - top)
                denom = weights.sum() + sum(math.exp(s - top) for s in extra)
                out[t, h] = sum(w * vs[p, h // group] for w, p in zip(weights, seen, strict=True)) / denom
    return out, kc, vc
