"""tokamax.dot_product_attention behind flash-attention-tpu's contract ([B, H, S, D], bottom-right causal).

  "mosaic"       Tokamax Pallas Mosaic flash attention (TPU; Mosaic GPU on sm90/sm100).
  "triton"       Tokamax Pallas Triton flash attention (CUDA/ROCm GPUs).
  "cudnn"        jax.nn's cuDNN attention through Tokamax (CUDA); never in a default order.
  "xla"          Tokamax's dense XLA attention: runs anywhere, memory quadratic in S.
  "xla_chunked"  Tokamax's query/key-chunked XLA attention: linear memory, usually slower.

Names are tried in the declared order; Tokamax's NotImplementedError moves to the next one and is kept in
the reason `last_implementation()` returns, together with how the mask was passed (masks.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import tokamax

from . import _dispatch
from .masks import explicit_mask, lengths, native_kwargs, plan_mask, rows_with_keys

IMPLEMENTATIONS: tuple[str, ...] = ("mosaic", "triton", "cudnn", "xla", "xla_chunked")

#: Declared order per backend (kernel.yaml `implementations` says the same; a test keeps them equal).
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("mosaic", "xla"),
    "cuda": ("triton", "mosaic", "xla"),
    "gpu": ("triton", "mosaic", "xla"),
    "rocm": ("triton", "xla"),
    "cpu": ("xla", "xla_chunked"),
}
_FALLBACK = ("xla", "xla_chunked")

_last: dict[str, str | None] = {"name": None, "reason": None}


def implementations_for(backend: str) -> tuple[str, ...]:
    """Implementations tried, in order, when none is named. Unknown backends get the portable ones."""
    return ORDER.get(backend.lower(), _FALLBACK)


def resolve_implementation(backend: str, implementation: str | Sequence[str] | None = None) -> tuple[str, str]:
    """(first name that can run on `backend`, trace of why), without calling Tokamax."""
    runnable, trace, source = _dispatch.resolve(ORDER, IMPLEMENTATIONS, backend, implementation, _FALLBACK,
                                                "attention")
    trace.append(f"{runnable[0]}: chosen ({source})")
    return runnable[0], "; ".join(trace)


def last_implementation() -> tuple[str | None, str | None]:
    """(name, reason) of the most recent call in this process (at trace time under jit)."""
    return _last["name"], _last["reason"]


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


def _check(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"expected 4-dim q, k, v [B,H,S,D], got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must match")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"batch/head_dim of q {q.shape} and k {k.shape} differ")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} must be a multiple of kv heads {k.shape[1]}")


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
) -> jax.Array:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D]; Hq a multiple of Hkv.

    Same meaning as kernel-hub/flash-attention-tpu: causal aligns bottom-right (query i sees keys
    <= i + kv_len - q_len, per sequence); sliding_window=W keeps the W most recent of those keys;
    q_lengths/kv_lengths [B] mark valid prefixes; rows with nothing to attend are 0. `sinks` raises
    NotImplementedError: Tokamax 0.0.12 has no attention sinks.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check(q, k, v)
    if sinks is not None:
        raise NotImplementedError("attention sinks: tokamax.dot_product_attention has no sinks argument; "
                                  "use kernel-hub/flash-attention-tpu for sinks")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    sq, skv = q.shape[2], k.shape[2]
    window = None if sliding_window is None else int(sliding_window)
    plan = plan_mask(sq, skv, causal=bool(causal), window=window,
                     has_lengths=q_lengths is not None or kv_lengths is not None)
    backend = jax.default_backend()
    runnable, trace, source = _dispatch.resolve(ORDER, IMPLEMENTATIONS, backend, implementation, _FALLBACK,
                                                "attention")
    _dispatch.ensure_flags_parsed()
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    call = lambda name: _run(
        q, k, v, q_lengths, kv_lengths, name=name, causal=bool(causal), sm_scale=scale, window=window,
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap), explicit=plan.mode == "explicit",
    )
    out, name, reason = _dispatch.run_in_order(runnable, trace, source, call, "attention",
                                               lambda _: f"mask {plan.mode}: {plan.why}")
    _last["name"], _last["reason"] = name, reason
    return out


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
        kv_lengths=kv_lengths, implementation=implementation,
    )
    return out[:, :, 0, :]
