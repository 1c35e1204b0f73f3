"""The RMSNorm forward arithmetic, written once in jnp for every kernel package that normalises rows (the rms_norm
package's kernels, and kernels that start with a norm, such as the MoE router): the Pallas kernel bodies on their
loaded tiles and the XLA paths on whole arrays, so they differ in schedule only.

Forms: zero_centered=False y = w * x_normed (Llama, Qwen, Mixtral, GPT-OSS, Gemma 4); zero_centered=True
y = (1 + w) * x_normed (Gemma 1-3). scale_after_cast: False multiplies in float32 and casts the product to x's dtype
once (Gemma's order); True casts x_normed to x's dtype first (Llama's order). x_normed = x * rsqrt(mean(x^2) + eps)
over the last axis, in float32 whatever the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def scale_of(w: jax.Array, zero_centered: bool) -> jax.Array:
    """The multiplier in float32: w, or 1 + w."""
    w = w.astype(jnp.float32)
    return 1.0 + w if zero_centered else w


def inv_rms(xf: jax.Array, eps: float) -> jax.Array:
    """rsqrt(mean(x^2) + eps) over the last axis, keepdims, float32."""
    return jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)


def forward(x: jax.Array, w: jax.Array, *, eps: float, zero_centered: bool = False,
            scale_after_cast: bool = False) -> jax.Array:
    """y in x's dtype; x [..., H], w [H] or [1, H]."""
    xf = x.astype(jnp.float32)
    n = xf * inv_rms(xf, eps)
    if scale_after_cast:
        n = n.astype(x.dtype).astype(jnp.float32)
    return (n * scale_of(w, zero_centered)).astype(x.dtype)
