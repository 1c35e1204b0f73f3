"""Quantized weights for the tests, made in NumPy (independent of the kernel's own code), and the float64 weights
they stand for: int8 per (expert, output channel), float8_e4m3fn per 128x128 block (transformers' layout).
NumPy only at import (jax and ml_dtypes where used), so the torch tests and benches share the reference too."""

from __future__ import annotations

import numpy as np

BLOCK = 128


def block_expand(scale: np.ndarray, k: int, n: int) -> np.ndarray:
    """[G, ceil(K/128), ceil(N/128)] -> [G, K, N]: each block's scale over its weights."""
    return np.repeat(np.repeat(scale, BLOCK, axis=1), BLOCK, axis=2)[:, :k, :n]


def dequantize64(values: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """The float64 weights [G, K, N] that quantized `values` (as numbers) and their f32 scales stand for."""
    w, s = np.asarray(values, np.float64), np.asarray(scale, np.float64)
    return w * s if fmt == "int8" else w * block_expand(s, w.shape[1], w.shape[2])


def quantize(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quantized weights, f32 scales, the float64 weights they dequantize to) for w [G, K, N]."""
    g, k, n = w.shape
    if fmt == "int8":
        scale = (np.abs(w).max(axis=1, keepdims=True) / 127.0).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1.0), scale)
        q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        return q, scale, dequantize64(q, scale, fmt)
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    pad = np.zeros((g, kb * BLOCK, nb * BLOCK))
    pad[:, :k, :n] = np.abs(w)
    amax = pad.reshape(g, kb, BLOCK, nb, BLOCK).max(axis=(2, 4))
    scale = np.where(amax == 0, 1.0, amax / 448.0).astype(np.float32)
    import ml_dtypes

    q = (w / block_expand(scale, k, n)).astype(ml_dtypes.float8_e4m3fn)
    return q, scale, dequantize64(q, scale, fmt)


def quantized_inputs(m: int, k: int, n: int, sizes: list[int], fmt: str, dtype: str, seed: int = 0):
    """(lhs, q, scale, group_sizes) as jax arrays, and (lhs, w) in float64 for the reference."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dtype)
    w = rng.standard_normal((len(sizes), k, n)) / np.sqrt(k)
    q, scale, w64 = quantize(w, fmt)
    return (lhs, jnp.asarray(q), jnp.asarray(scale), jnp.asarray(sizes, jnp.int32)), \
        (np.asarray(lhs.astype(jnp.float32), np.float64), w64)


def reference(lhs64: np.ndarray, w64: np.ndarray, sizes: list[int]) -> np.ndarray:
    """float64 loop over groups: rows of group g times the dequantized w[g]; rows past the groups zero."""
    out = np.zeros((lhs64.shape[0], w64.shape[2]))
    start = 0
    for g, size in enumerate(sizes):
        out[start:start + size] = lhs64[start:start + size] @ w64[g]
        start += size
    return out
