"""The RMSNorm arithmetic, written once in jnp and used by every JAX implementation (the Pallas kernel bodies on
their loaded tiles, and the XLA paths on whole arrays), so the implementations differ in schedule only. The forward
(scale_of, inv_rms, forward) is the shared `_common/rms_formula.py`, vendored; the backward is this package's.

Forms (the two conventions transformers uses):
  zero_centered=False   y = w * x_normed                (Llama, Qwen, Mixtral, GPT-OSS, Gemma 4)
  zero_centered=True    y = (1 + w) * x_normed          (Gemma 1-3: weights stored around zero)
Order of the casts (scale_after_cast): False multiplies in float32 and casts the product to x's dtype once (Gemma's
order); True first casts x_normed to x's dtype and then multiplies (Llama's `weight * hidden.to(input_dtype)`): the
product of two bf16 values is exact in float32, so rounding it once to bf16 is what a bf16 multiply gives.
x_normed = x * rsqrt(mean(x^2, last axis) + eps), computed in float32 whatever the input dtype.

The backward treats the casts as identity (the usual convention): with s = w (or 1 + w), n = x_normed, r = rsqrt(..),
dx = r * (dy*s - n * mean(dy*s*n)) and dw = sum over rows of dy * n (the same for both forms).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._vendor.rms_formula import forward, inv_rms, scale_of


def backward(x: jax.Array, w: jax.Array, dy: jax.Array, *, eps: float,
             zero_centered: bool) -> tuple[jax.Array, jax.Array]:
    """(dx in float32 [..., H], dy * x_normed in float32 [..., H]: the rows' contributions to dw)."""
    xf = x.astype(jnp.float32)
    r = inv_rms(xf, eps)
    n = xf * r
    g = dy.astype(jnp.float32) * scale_of(w, zero_centered)
    dx = r * (g - n * jnp.mean(g * n, axis=-1, keepdims=True))
    return dx, dy.astype(jnp.float32) * n


__all__ = ["backward", "forward", "inv_rms", "scale_of"]
