"""Public entry points: one function per op, several implementations behind it, chosen by backend.

Implementations: "pallas" (the TPU kernels; interpreted off-TPU), "cpu" (query-chunked XLA with static
band skipping, the fast path on CPU) and "xla" (dense masked XLA, runs anywhere and is differentiable).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from .config import AttentionConfig, block_for, default_config, round_up
from .cpu import cpu_attention, xla_attention, xla_decode_attention
from .interpret import raise_if_races, resolve_interpret
from .pallas_decode import DecodeStatic, decode_forward
from .pallas_flash import FlashStatic, flash_attention_padded

_IMPLEMENTATIONS = {"tpu": ("pallas", "xla"), "cpu": ("cpu", "xla"), "cuda": ("xla",), "gpu": ("xla",)}


def implementations_for(backend: str) -> tuple[str, ...]:
    """Implementations that run on a backend, best first."""
    return _IMPLEMENTATIONS.get(backend, ("xla",))


def _pick(implementation: str | None) -> str:
    if implementation is None:
        return implementations_for(jax.default_backend())[0]
    if implementation not in ("pallas", "cpu", "xla"):
        raise ValueError(f"unknown implementation {implementation!r}; expected pallas, cpu or xla")
    return implementation


def _check(q: jax.Array, k: jax.Array, v: jax.Array, seq_axis: bool) -> None:
    nd = 4 if seq_axis else 3
    if q.ndim != nd or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"expected q with {nd} dims and 4-dim k/v, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must match")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"batch/head_dim of q {q.shape} and k {k.shape} differ")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} must be a multiple of kv heads {k.shape[1]}")


def _lengths(x: Any, batch: int, full: int) -> jax.Array:
    return jnp.full((batch,), full, jnp.int32) if x is None else jnp.clip(jnp.asarray(x, jnp.int32), 0, full)


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    if x.shape[axis] == size:
        return x
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pads)


@functools.partial(
    jax.jit,
    static_argnames=("impl", "causal", "sm_scale", "window", "soft_cap", "config", "interpret"),
)
def _prefill(q, k, v, sinks, q_lengths, kv_lengths, *, impl, causal, sm_scale, window, soft_cap, config, interpret):
    b, hq, sq, _ = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    common = dict(causal=causal, sm_scale=sm_scale, sliding_window=window, logits_soft_cap=soft_cap, sinks=sinks,
                  q_lengths=q_lengths, kv_lengths=kv_lengths)
    if impl == "xla":
        return xla_attention(q, k, v, **common)
    if impl == "cpu":
        return cpu_attention(q, k, v, block_q=config.cpu_block_q, **common)
    bq, sq_pad = block_for(sq, config.block_q)
    bk, skv_pad = block_for(skv, config.block_kv)
    st = FlashStatic(causal=causal, sm_scale=sm_scale, window=window, soft_cap=soft_cap, has_sinks=sinks is not None,
                     block_q=bq, block_kv=bk, group=hq // hkv, interpret=interpret,
                     vmem_limit_bytes=config.vmem_limit_bytes)
    snk = jnp.zeros((hq,), jnp.float32) if sinks is None else jnp.asarray(sinks, jnp.float32)
    out = flash_attention_padded(
        st, _pad_axis(q, 2, sq_pad), _pad_axis(k, 2, skv_pad), _pad_axis(v, 2, skv_pad), snk,
        _lengths(q_lengths, b, sq), _lengths(kv_lengths, b, skv),
    )
    return out[:, :, :sq]


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    q_lengths: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    implementation: str | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
) -> jax.Array:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D]; Hq a multiple of Hkv.

    causal aligns bottom-right (query i sees keys <= i + kv_len - q_len, per sequence); sliding_window=W
    keeps the W most recent of those keys; sinks [Hq] are per-head logits that join the softmax
    denominator; q_lengths/kv_lengths [B] mark valid prefixes, rows with nothing to attend are 0.
    Differentiable in q, k, v and sinks on every implementation.
    """
    _check(q, k, v, seq_axis=True)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    impl = _pick(implementation)
    interp = resolve_interpret(interpret) if impl == "pallas" else False
    cfg = config or default_config(q.shape[2], k.shape[2], q.shape[3], q.dtype)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = _prefill(
        q, k, v, sinks, q_lengths, kv_lengths, impl=impl, causal=bool(causal), sm_scale=scale,
        window=None if sliding_window is None else int(sliding_window),
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap), config=cfg, interpret=interp,
    )
    return raise_if_races(interp, out)


def _decode_block(s: int, block: int) -> tuple[int, int]:
    """(block, padded cache length): a block that divides the cache avoids copying it to pad."""
    if s <= block:
        return s, s
    for t in range(block - block % 128, 127, -128):
        if s % t == 0:
            return t, s
    t = round_up(block, 128)
    return t, round_up(s, t)


@functools.partial(jax.jit, static_argnames=("impl", "sm_scale", "window", "soft_cap", "config", "interpret"))
def _decode(q, k_cache, v_cache, kv_lengths, sinks, *, impl, sm_scale, window, soft_cap, config, interpret):
    b, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    if impl in ("cpu", "xla"):
        return xla_decode_attention(q, k_cache, v_cache, kv_lengths, sm_scale=sm_scale, sliding_window=window,
                                    logits_soft_cap=soft_cap, sinks=sinks)
    bk, s_pad = _decode_block(s, config.decode_block_kv)
    st = DecodeStatic(sm_scale=sm_scale, window=window, soft_cap=soft_cap, has_sinks=sinks is not None,
                      block_kv=bk, interpret=interpret, vmem_limit_bytes=config.vmem_limit_bytes)
    snk = jnp.zeros((hq,), jnp.float32) if sinks is None else jnp.asarray(sinks, jnp.float32)
    out = decode_forward(
        q.reshape(b, hkv, hq // hkv, d), _pad_axis(k_cache, 2, s_pad), _pad_axis(v_cache, 2, s_pad),
        _lengths(kv_lengths, b, s), snk.reshape(hkv, hq // hkv), st,
    )
    return out.reshape(b, hq, d)


def decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    kv_lengths: jax.Array,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    implementation: str | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
) -> jax.Array:
    """One new query per sequence, q[B,Hq,D], against caches [B,Hkv,S,D] holding kv_lengths[B] valid
    positions (the query's own key included, last) -> [B,Hq,D]. Forward only."""
    _check(q, k_cache, v_cache, seq_axis=False)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    impl = _pick(implementation)
    interp = resolve_interpret(interpret) if impl == "pallas" else False
    cfg = config or default_config(1, k_cache.shape[2], q.shape[-1], q.dtype)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = _decode(
        q, k_cache, v_cache, kv_lengths, sinks, impl=impl, sm_scale=scale,
        window=None if sliding_window is None else int(sliding_window),
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap), config=cfg, interpret=interp,
    )
    return raise_if_races(interp, out)
