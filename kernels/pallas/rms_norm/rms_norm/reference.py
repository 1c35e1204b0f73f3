"""NumPy float64 references of RMSNorm and its gradients, independent of the kernels (no jax, no torch).

The casts of the kernels' dtype policy are applied where they happen in transformers: `scale_after_cast` rounds the
normalised x to the input's dtype before scaling (given as `round_to`, a function, so bf16 rounding stays here
without a framework); the final rounding to the output dtype is left to the comparison's tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def reference_rms_norm(x: np.ndarray, w: np.ndarray, *, eps: float, zero_centered: bool = False,
                       round_to: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """float64 RMSNorm over the last axis; `round_to` rounds x_normed first (Llama's cast-before-scale order)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if round_to is not None:
        n = np.asarray(round_to(n), np.float64)
    return n * ((1.0 + w) if zero_centered else w)


def reference_rms_norm_grads(x: np.ndarray, w: np.ndarray, dy: np.ndarray, *, eps: float,
                             zero_centered: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) of sum(dy * rms_norm(x, w)) in float64, derived by hand from y_j = s_j x_j / rms."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    h = x.shape[-1]
    s = (1.0 + w) if zero_centered else w
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    g = dy * s
    # d(x_j / rms)/dx_i = delta_ij / rms - x_i x_j / (h rms^3)
    dx = g / rms - x * np.sum(g * x, axis=-1, keepdims=True) / (h * rms ** 3)
    dw = np.sum((dy * x / rms).reshape(-1, h), axis=0)
    return dx, dw


def reference_qk_norm_rope(qkv: np.ndarray, q_weight: np.ndarray, k_weight: np.ndarray, positions: np.ndarray, *,
                           q_heads: int, kv_heads: int, eps: float, theta: float, rotary_dims: int | None = None,
                           values: str = "raw", keys_are_values: bool = False
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (q, k, v) [T, heads, D]: per-head RMSNorm, then rotary on the first rotary_dims dims in the halves
    style (pairs i and i + rotary_dims / 2 rotated by position x theta^(-2i / rotary_dims)), from positions."""
    x = np.asarray(qkv, np.float64)
    t = x.shape[0]
    x = x.reshape(t, q_heads + kv_heads * (1 if keys_are_values else 2), -1)
    d = x.shape[-1]
    rot = d if rotary_dims is None else rotary_dims
    half = rot // 2
    ang = np.asarray(positions, np.float64)[:, None] * theta ** (-np.arange(half) * 2.0 / rot)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rotate(h: np.ndarray) -> np.ndarray:
        a, b = h[..., :half], h[..., half:rot]
        return np.concatenate([a * c - b * s, b * c + a * s, h[..., rot:]], axis=-1)

    q = rotate(reference_rms_norm(x[:, :q_heads], q_weight, eps=eps))
    raw = x[:, q_heads:q_heads + kv_heads]
    k = rotate(reference_rms_norm(raw, k_weight, eps=eps))
    src = raw if keys_are_values else x[:, q_heads + kv_heads:]
    v = reference_rms_norm(src, np.ones(d), eps=eps) if values == "normed" else src
    return q, k, v


def reference_attention_front(x: np.ndarray, norm_weight: np.ndarray, wqkv: np.ndarray, q_weight: np.ndarray,
                              k_weight: np.ndarray, positions: np.ndarray, *, q_heads: int, kv_heads: int,
                              eps: float, theta: float, residual: np.ndarray | None = None,
                              zero_centered: bool = False, rotary_dims: int | None = None, values: str = "raw",
                              keys_are_values: bool = False,
                              round_to: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """float64 (q, k, v) and, with a residual, the sum x + residual (rounded by `round_to`, as a bf16 residual
    stream is): the input RMSNorm of the sum, its projection by wqkv [H, heads x D], then reference_qk_norm_rope."""
    total = np.asarray(x, np.float64)
    if residual is not None:
        total = total + np.asarray(residual, np.float64)
        if round_to is not None:
            total = np.asarray(round_to(total), np.float64)
    qkv = reference_rms_norm(total, norm_weight, eps=eps, zero_centered=zero_centered) @ np.asarray(wqkv, np.float64)
    out = reference_qk_norm_rope(qkv, q_weight, k_weight, positions, q_heads=q_heads, kv_heads=kv_heads, eps=eps,
                                 theta=theta, rotary_dims=rotary_dims, values=values, keys_are_values=keys_are_values)
    return (*out, total) if residual is not None else out
