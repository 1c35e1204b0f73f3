"""tokamax.dot_product_attention behind flash-attention-tpu's contract ([B, H, S, D], bottom-right causal).

  "mosaic"       Tokamax Pallas Mosaic flash attention (TPU; Mosaic GPU on sm90/sm100).
  "triton"       Tokamax Pallas Triton flash attention (CUDA/ROCm GPUs).
  "cudnn"        jax.nn's cuDNN attention through Tokamax (CUDA); never in a default order.
  "xla"          Tokamax's dense XLA attention: runs anywhere, memory quadratic in S.
  "xla_chunked"  Tokamax's query/key-chunked XLA attention: linear memory, usually slower.

Names are tried in the declared order (the kernel contract, docs/kernel-contract.md); Tokamax's NotImplementedError
moves to the next one and is kept in the reason `last_implementation()` returns, together with how the mask was
passed (masks.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import tokamax

from ._vendor.dispatch import Dispatch
from ._vendor.platform import platform_of
from ._vendor.shapes import check_attention
from ._vendor.tokamax_support import ensure_flags_parsed, tokamax_why_not
from .masks import explicit_mask, lengths, native_kwargs, plan_mask, rows_with_keys

IMPLEMENTATIONS: tuple[str, ...] = ("mosaic", "triton", "cudnn", "xla", "xla_chunked")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("mosaic", "xla"),
    "cuda": ("triton", "mosaic", "xla"),
    "gpu": ("triton", "mosaic", "xla"),
    "rocm": ("triton", "xla"),
    "cpu": ("xla", "xla_chunked"),
}

_DISPATCH = Dispatch("attention", IMPLEMENTATIONS, ORDER, ("xla", "xla_chunked"), why_not=tokamax_why_not)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


@functools.partial(jax.jit, static_argnames=("name", "causal", "sm_scale", "window", "soft_cap", "explicit"))
def _run(q, k, v, q_lengths, kv_lengths, *, name, causal, sm_scale, window, soft_cap, explicit):
    b, _, sq, _ = q.shape
    skv = k.shape[2]
    q_len, kv_len = lengths(q_lengths, b, sq), lengths(kv_lengths, b, skv)
    if explicit:
        kw: dict[str, Any] = {"mask": explicit_mask(q_len, kv_len, sq, skv, causal=causal, window=window)}
    else:
        kw = native_kwargs(skv, causal=causal, window=window, q_lengths=q_lengths, kv_lengths=kv_lengths)
    # f32 inputs get HIGHEST: TPU's default f32 dot rounds through bf16 passes.
    hi = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    out = tokamax.dot_product_attention(
        jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),  # Tokamax is [B, S, H, D]
        scale=sm_scale, logits_soft_cap=soft_cap, precision=hi, implementation=name, **kw,
    )
    keep = rows_with_keys(q_len, kv_len, sq, causal=causal, window=window)  # Tokamax gives mean(v) there
    return jnp.where(keep[:, None, :, None], jnp.swapaxes(out, 1, 2), 0).astype(q.dtype)


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
) -> jax.Array:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D]; Hq a multiple of Hkv.

    Same meaning as kernel-hub/flash-attention-tpu: causal aligns bottom-right (query i sees keys
    <= i + kv_len - q_len, per sequence); sliding_window=W keeps the W most recent of those keys;
    q_lengths/kv_lengths [B] mark valid prefixes; rows with nothing to attend are 0. `sinks` raises
    NotImplementedError: Tokamax 0.0.12 has no attention sinks. interpret: None or False (Tokamax's Pallas ops
    choose their own mode; any other value skips them).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    window, scale, cap = check_attention(q.shape, k.shape, v.shape, sliding_window=sliding_window, sm_scale=sm_scale,
                                         logits_soft_cap=logits_soft_cap)
    if sinks is not None:
        raise NotImplementedError("attention sinks: tokamax.dot_product_attention has no sinks argument; "
                                  "use kernel-hub/flash-attention-tpu for sinks")
    plan = plan_mask(q.shape[2], k.shape[2], causal=bool(causal), window=window,
                     has_lengths=q_lengths is not None or kv_lengths is not None)
    ensure_flags_parsed()
    call = lambda name: _run(q, k, v, q_lengths, kv_lengths, name=name, causal=bool(causal), sm_scale=scale,
                             window=window, soft_cap=cap, explicit=plan.mode == "explicit")
    return _DISPATCH.run(platform_of(q, k, v), implementation, interpret, call, note=f"mask {plan.mode}: {plan.why}")


@functools.partial(jax.jit, static_argnames=("name", "sm_scale", "window", "soft_cap"))
def _run_decode(rows, k, v, kv_lengths, *, name, sm_scale, window, soft_cap):
    """rows [B, Hkv, G, D]: each kv head's G query heads as G query rows, all at position kv_len - 1."""
    b, _, g, _ = rows.shape
    s = k.shape[2]
    kv_len = lengths(kv_lengths, b, s)
    if window is None:
        kw: dict[str, Any] = {"key_value_seq_lengths": kv_len}
    else:  # keys kv_len - W .. kv_len - 1, the same for every row
        j = jnp.arange(s, dtype=jnp.int32)[None, None, None, :]
        last = (kv_len - 1)[:, None, None, None]
        kw = {"mask": jnp.broadcast_to((j <= last) & (j > last - window), (b, 1, g, s))}
    hi = jax.lax.Precision.HIGHEST if rows.dtype == jnp.float32 else None
    out = tokamax.dot_product_attention(
        jnp.swapaxes(rows, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
        scale=sm_scale, logits_soft_cap=soft_cap, precision=hi, implementation=name, **kw,
    )
    return jnp.where((kv_len > 0)[:, None, None, None], jnp.swapaxes(out, 1, 2), 0).astype(rows.dtype)


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
) -> jax.Array:
    """One new query per sequence, q[B,Hq,D], against caches [B,Hkv,S,D] holding kv_lengths[B] valid
    positions (the query's own key included, last) -> [B,Hq,D].

    The G query heads that share a kv head go to Tokamax as G query rows of that head (multi-head attention
    over Hkv heads), so no implementation repeats the cache per query head: Tokamax's dense XLA path, which
    TPUs fall back to (its Mosaic kernel refuses key-length masks), would otherwise hold the cache repeated
    G times in f32 (9 GiB of temporaries for GPT-OSS at batch 64 over 8192 positions, and more than a v5e's
    16 GiB of HBM at Gemma 4's sliding-layer geometry). Lengths go natively; a window as an explicit
    [B, 1, G, S] mask."""
    q, k_cache, v_cache = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    window, scale, cap = check_attention(q.shape, k_cache.shape, v_cache.shape, sliding_window=sliding_window,
                                         sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, decode=True)
    if sinks is not None:
        raise NotImplementedError("attention sinks: tokamax.dot_product_attention has no sinks argument; "
                                  "use kernel-hub/flash-attention-tpu for sinks")
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    rows = q.reshape(b, hkv, hq // hkv, d)
    ensure_flags_parsed()
    call = lambda name: _run_decode(rows, k_cache, v_cache, kv_lengths, name=name, sm_scale=scale, window=window,
                                    soft_cap=cap).reshape(b, hq, d)
    note = "decode: query heads folded into rows per kv head; " + (
        "explicit [B,1,G,S] window mask" if window is not None else "kv lengths native")
    return _DISPATCH.run(platform_of(q, k_cache, v_cache), implementation, interpret, call, note=note)
