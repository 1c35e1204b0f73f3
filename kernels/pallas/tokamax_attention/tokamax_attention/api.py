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

    The query sits at position kv_len-1, so causal is implied by kv_lengths: without a window Tokamax
    gets the lengths natively; a window needs the explicit mask."""
    q = jnp.asarray(q)
    if q.ndim != 3:
        raise ValueError(f"decode_attention wants q [B,Hq,D], got {q.shape}")
    out = flash_attention(
        q[:, :, None, :], k_cache, v_cache, causal=False, sm_scale=sm_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, sinks=sinks, q_lengths=jnp.ones((q.shape[0],), jnp.int32),
        kv_lengths=kv_lengths, implementation=implementation, interpret=interpret,
    )
    return out[:, :, 0, :]
