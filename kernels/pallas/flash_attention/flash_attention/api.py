"""Public entry points: one function per op, several implementations behind it (the kernel contract,
docs/kernel-contract.md), chosen by the platform the operands live on.

Implementations: "pallas" (the TPU kernels; compiled on a TPU, interpreted elsewhere unless interpret=False), "cpu"
(query-chunked XLA with static band skipping, the fast path on CPU) and "xla" (dense masked XLA, runs anywhere and
is differentiable). flash_attention and decode_attention share one dispatch, so `last_implementation()` reports
whichever ran last.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._vendor.dispatch import Dispatch
from ._vendor.interpret import pallas_remark, run_dispatch
from ._vendor.shapes import check_attention
from .config import (
    AttentionConfig,
    block_for,
    default_config,
    device_kind_of,
    kv_transposed,
    round_up,
    sub_block,
    vmem_plan,
)
from .cpu import cpu_attention, xla_attention, xla_decode_attention
from .pallas_decode import DecodeStatic, decode_forward
from .pallas_flash import FlashStatic, flash_attention_padded

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "cpu", "xla")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {"tpu": ("pallas", "xla"), "cpu": ("cpu", "xla"), "cuda": ("xla",),
                                     "gpu": ("xla",)}


_DISPATCH = Dispatch("attention", IMPLEMENTATIONS, ORDER, ("xla",), remark=pallas_remark)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


def _lengths(x: Any, batch: int, full: int) -> jax.Array:
    return jnp.full((batch,), full, jnp.int32) if x is None else jnp.clip(jnp.asarray(x, jnp.int32), 0, full)


def _vmem(x: jax.Array) -> dict[str, Any]:
    """The VMEM budget and limit of the chip the call runs on (config.vmem_plan)."""
    budget, limit, _ = vmem_plan(device_kind_of(x))
    return {"vmem_budget_bytes": budget, "vmem_limit_bytes": limit}


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
                     vmem_limit_bytes=config.vmem_limit_bytes,
                     heads_per_block=math.gcd(config.heads_per_block, hq // hkv),
                     chunk_q=sub_block(bq, config.chunk_q), chunk_kv=sub_block(bk, config.chunk_kv),
                     bwd_block_q=sub_block(bq, config.bwd_block_q), bwd_block_kv=sub_block(bk, config.bwd_block_kv))
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
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
) -> jax.Array:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D]; Hq a multiple of Hkv.

    causal aligns bottom-right (query i sees keys <= i + kv_len - q_len, per sequence); sliding_window=W
    keeps the W most recent of those keys; sinks [Hq] are per-head logits that join the softmax
    denominator; q_lengths/kv_lengths [B] mark valid prefixes, rows with nothing to attend are 0.
    Differentiable in q, k, v and sinks on every implementation.

    implementation / interpret: the kernel contract (see ragged_dot and docs/kernel-contract.md): a name or a
    sequence tried in order; interpret None compiles on a TPU and interprets elsewhere, False always lowers to
    Mosaic, a pltpu.InterpretParams with detect_races raises RaceDetectedError on a race.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    window, scale, cap = check_attention(q.shape, k.shape, v.shape, sliding_window=sliding_window, sm_scale=sm_scale,
                                         logits_soft_cap=logits_soft_cap)
    cfg = config or default_config(q.shape[2], k.shape[2], q.shape[3], q.dtype, group=q.shape[1] // k.shape[1],
                                   **_vmem(q))
    run = lambda impl, mode: _prefill(q, k, v, sinks, q_lengths, kv_lengths, impl=impl, causal=bool(causal),
                                      sm_scale=scale, window=window, soft_cap=cap, config=cfg, interpret=mode)
    return run_dispatch(_DISPATCH, implementation, interpret, (q, k, v), run, "the attention kernel")


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
    transposed = kv_transposed(s, d) if config.decode_kv_transposed is None else config.decode_kv_transposed
    st = DecodeStatic(sm_scale=sm_scale, window=window, soft_cap=soft_cap, has_sinks=sinks is not None,
                      block_kv=bk, interpret=interpret, vmem_limit_bytes=config.vmem_limit_bytes,
                      kv_transposed=transposed)
    snk = jnp.zeros((hq,), jnp.float32) if sinks is None else jnp.asarray(sinks, jnp.float32)
    if transposed:  # the same bytes when XLA's layout already keeps S minor (see pallas_decode)
        k_cache, v_cache, axis = jnp.swapaxes(k_cache, 2, 3), jnp.swapaxes(v_cache, 2, 3), 3
    else:
        axis = 2
    out = decode_forward(
        q.reshape(b, hkv, hq // hkv, d), _pad_axis(k_cache, axis, s_pad), _pad_axis(v_cache, axis, s_pad),
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
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
) -> jax.Array:
    """One new query per sequence, q[B,Hq,D], against caches [B,Hkv,S,D] holding kv_lengths[B] valid
    positions (the query's own key included, last) -> [B,Hq,D]. Forward only."""
    q, k_cache, v_cache = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    window, scale, cap = check_attention(q.shape, k_cache.shape, v_cache.shape, sliding_window=sliding_window,
                                         sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, decode=True)
    cfg = config or default_config(1, k_cache.shape[2], q.shape[-1], q.dtype, kv_heads=k_cache.shape[1],
                                   group=q.shape[1] // k_cache.shape[1], window=window, **_vmem(k_cache))
    run = lambda impl, mode: _decode(q, k_cache, v_cache, kv_lengths, sinks, impl=impl, sm_scale=scale,
                                     window=window, soft_cap=cap, config=cfg, interpret=mode)
    return run_dispatch(_DISPATCH, implementation, interpret, (q, k_cache, v_cache), run, "the attention kernel")
