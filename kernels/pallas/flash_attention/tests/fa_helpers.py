"""Shared test helpers: random inputs and a dense f32 JAX oracle for gradients. The error metric and tolerances
are kernel-hub's own (verify.numerics; NaN or Inf never passes): tests are not shipped, so they may import it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flash_attention._vendor.attention_reference import reference_mask


def make_inputs(rng: np.random.Generator, b: int, hq: int, hkv: int, sq: int, skv: int, d: int, dtype: str):
    def arr(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), dtype)

    return arr(b, hq, sq, d), arr(b, hkv, skv, d), arr(b, hkv, skv, d)


def dense_oracle(q, k, v, *, causal=False, sm_scale=None, sliding_window=None, logits_soft_cap=None, sinks=None,
                 q_lengths=None, kv_lengths=None):
    """Dense attention in f32 at HIGHEST precision with explicit K/V head repetition (differentiable)."""
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    ql = np.full(b, sq) if q_lengths is None else np.asarray(q_lengths)
    kl = np.full(b, skv) if kv_lengths is None else np.asarray(kv_lengths)
    mask = np.stack([reference_mask(int(ql[i]), int(kl[i]), sq, skv, causal=causal, sliding_window=sliding_window)
                     for i in range(b)])[:, None]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k = jnp.repeat(k, hq // hkv, axis=1)
    v = jnp.repeat(v, hq // hkv, axis=1)
    scale = sm_scale or 1.0 / np.sqrt(d)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * scale
    if logits_soft_cap:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    s = jnp.where(mask, s, -1e30)
    if sinks is not None:
        sink_col = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, None, None], (b, hq, sq, 1))
        s = jnp.concatenate([s, sink_col], axis=-1)
        mask = np.concatenate([mask, np.ones((b, 1, sq, 1), bool)], axis=-1)
    p = jax.nn.softmax(s, axis=-1)
    p = jnp.where(mask, p, 0.0)
    if sinks is not None:
        p = p[..., :-1]
    out = jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=jax.lax.Precision.HIGHEST)
    any_key = mask[..., :skv].any(-1, keepdims=True)
    return jnp.where(any_key, out, 0.0)


def kernel_name(eqn) -> str:
    """A pallas_call equation's kernel name (its `name=`, which this jax keeps on the body's debug info)."""
    name = eqn.params.get("name_and_src_info") or eqn.params.get("name")
    if name is None:
        name = eqn.params["jaxpr"].debug_info.func_name
    return str(name).split(" ")[0]
