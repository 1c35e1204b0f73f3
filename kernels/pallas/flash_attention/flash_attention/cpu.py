"""Plain-XLA attention: the "xla" path (one dense masked softmax, portable to every backend) and the
"cpu" path (the same math in query chunks that read only the keys their causal/window band reaches).

Both keep grouped-query heads grouped ([B, Hkv, G, ...]) so K and V are never repeated, compute logits
and softmax in f32, and are differentiated by JAX's autodiff (no custom backward needed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: exp(_MASKED - m) underflows, never NaN


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    # f32 operands need HIGHEST (XLA's default may use bf16 passes); bf16 x bf16 products are exact in f32.
    exact = a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
    precision = None if exact else jax.lax.Precision.HIGHEST
    return jnp.einsum(spec, a, b, precision=precision, preferred_element_type=jnp.float32)


def _lengths(lengths: jax.Array | None, batch: int, full: int) -> jax.Array:
    if lengths is None:
        return jnp.full((batch,), full, jnp.int32)
    return jnp.clip(jnp.asarray(lengths, jnp.int32), 0, full)


def _band_mask(
    rows: jax.Array, cols: jax.Array, q_len: jax.Array, kv_len: jax.Array, causal: bool, window: int | None
) -> jax.Array:
    """[B, 1, 1, R, C] mask of rows (query positions) x cols (key positions), bottom-right aligned."""
    r = rows[None, :, None]
    c = cols[None, None, :]
    ql = q_len[:, None, None]
    kl = kv_len[:, None, None]
    mask = (r < ql) & (c < kl)
    pos = r + (kl - ql)
    if causal:
        mask &= c <= pos
    if window is not None:
        mask &= c > pos - window
    return mask[:, None, None]


def _attend(
    q: jax.Array,  # [B, Hkv, G, R, D]
    k: jax.Array,  # [B, Hkv, C, D]
    v: jax.Array,
    mask: jax.Array,  # broadcastable to [B, Hkv, G, R, C]
    scale: float,
    soft_cap: float | None,
    sinks: jax.Array | None,  # [Hkv, G] f32
) -> jax.Array:
    s = _dot("bhgrd,bhcd->bhgrc", q, k) * scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    s = jnp.where(mask, s, _MASKED)
    m = jnp.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        m = jnp.maximum(m, sinks[None, :, :, None, None])
    m = jax.lax.stop_gradient(m)
    p = jnp.where(mask, jnp.exp(s - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.exp(sinks[None, :, :, None, None] - m)
    denom = jnp.where(denom > 0, denom, 1.0)  # rows with nothing to attend come out 0
    pv_dtype = v.dtype if v.dtype == jnp.bfloat16 else jnp.float32
    out = _dot("bhgrc,bhcd->bhgrd", p.astype(pv_dtype), v)
    return out / denom


def _grouped(q: jax.Array, hkv: int) -> jax.Array:
    b, hq, sq, d = q.shape
    if hq % hkv:
        raise ValueError(f"query heads {hq} must be a multiple of kv heads {hkv}")
    return q.reshape(b, hkv, hq // hkv, sq, d)


def _sinks(sinks: jax.Array | None, hkv: int) -> jax.Array | None:
    return None if sinks is None else jnp.asarray(sinks, jnp.float32).reshape(hkv, -1)


def xla_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    sm_scale: float,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    sinks: jax.Array | None,
    q_lengths: jax.Array | None,
    kv_lengths: jax.Array | None,
) -> jax.Array:
    """Dense masked attention: one [B, Hq, Sq, Skv] score tensor."""
    b, hq, sq, _ = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    mask = _band_mask(jnp.arange(sq), jnp.arange(skv), _lengths(q_lengths, b, sq), _lengths(kv_lengths, b, skv),
                      causal, sliding_window)
    out = _attend(_grouped(q, hkv), k, v, mask, sm_scale, logits_soft_cap, _sinks(sinks, hkv))
    return out.reshape(b, hq, sq, -1).astype(q.dtype)


def cpu_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    sm_scale: float,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    sinks: jax.Array | None,
    q_lengths: jax.Array | None,
    kv_lengths: jax.Array | None,
    block_q: int = 512,
) -> jax.Array:
    """Query chunks of block_q rows. Without per-sequence lengths the band is static, so each chunk
    slices only the keys it can see: causal prefill does about half the work of the dense path."""
    b, hq, sq, _ = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    qg = _grouped(q, hkv)
    snk = _sinks(sinks, hkv)
    q_len, kv_len = _lengths(q_lengths, b, sq), _lengths(kv_lengths, b, skv)
    static_band = q_lengths is None and kv_lengths is None
    offset = skv - sq
    outs = []
    for r0 in range(0, sq, block_q):
        r1 = min(r0 + block_q, sq)
        c0, c1 = 0, skv
        if static_band:
            if causal:
                c1 = max(0, min(skv, r1 - 1 + offset + 1))
            if sliding_window is not None:
                c0 = min(skv, max(0, r0 + offset - sliding_window + 1))
        if c1 <= c0:
            outs.append(jnp.zeros((b, hkv, hq // hkv, r1 - r0, v.shape[-1]), jnp.float32))
            continue
        mask = _band_mask(jnp.arange(r0, r1), jnp.arange(c0, c1), q_len, kv_len, causal, sliding_window)
        outs.append(_attend(qg[:, :, :, r0:r1], k[:, :, c0:c1], v[:, :, c0:c1], mask, sm_scale, logits_soft_cap,
                            snk))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
    return out.reshape(b, hq, sq, -1).astype(q.dtype)


def xla_decode_attention(
    q: jax.Array,  # [B, Hq, D]
    k_cache: jax.Array,  # [B, Hkv, S, D]
    v_cache: jax.Array,
    kv_lengths: jax.Array,  # [B]
    *,
    sm_scale: float,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    sinks: jax.Array | None,
) -> jax.Array:
    """One query per sequence at position kv_len-1: a dense pass over the cache, heads grouped."""
    b, hq, _ = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    kv_len = _lengths(kv_lengths, b, s)
    mask = _band_mask(jnp.zeros((1,), jnp.int32), jnp.arange(s), jnp.ones((b,), jnp.int32), kv_len, True,
                      sliding_window)
    out = _attend(_grouped(q[:, :, None, :], hkv), k_cache, v_cache, mask, sm_scale, logits_soft_cap,
                  _sinks(sinks, hkv))
    return out.reshape(b, hq, -1).astype(q.dtype)
