"""The attention front of a q/k-normed model (Qwen3, Gemma 3/4): each head RMS-normalised over its head_dim, scaled by
its weight, then rotated (rotary position embedding, halves style), written once in jnp and used by the Pallas kernel
body on its loaded tiles and by the XLA path on whole arrays, so the two differ in schedule only.

Rotary tables are full-width: `rope_tables(positions, head_dim, theta, rotary_dims)` gives cos and sin [T, head_dim]
with cos on both halves of the rotated dims and 1 past them, sin negated on the first half, +sin on the second and 0
past them. Then rotating x is one expression over the whole head, x * cos + swap(x) * sin, where swap exchanges the
two halves of the rotated dims (what it puts past them meets sin = 0): the products and sums of the usual
a * cos - b * sin, b * cos + a * sin, with no lane-unaligned slicing inside a kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .formula import inv_rms

#: How the V heads leave the op: passed through, or RMS-normalised with unit weight (Gemma 4's scale-free v norm).
VALUE_MODES = ("raw", "normed")


def rope_tables(positions: jax.Array, head_dim: int, theta: float, rotary_dims: int | None = None
                ) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) float32 [T, head_dim] for integer positions [T]: frequencies theta^(-2i / rotary_dims) over the
    first rotary_dims dims (default head_dim), laid out over the whole head as the module docstring says."""
    rot = head_dim if rotary_dims is None else int(rotary_dims)
    if rot <= 0 or rot % 2 or rot > head_dim:
        raise ValueError(f"rotary_dims must be even and in (0, head_dim={head_dim}], got {rot}")
    inv = 1.0 / theta ** (jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
    ang = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv[None, :]
    c, s = jnp.cos(ang), jnp.sin(ang)
    rest = (ang.shape[0], head_dim - rot)
    cos = jnp.concatenate([c, c, jnp.ones(rest, jnp.float32)], axis=-1)
    sin = jnp.concatenate([-s, s, jnp.zeros(rest, jnp.float32)], axis=-1)
    return cos, sin


def swap_halves(x: jax.Array, half: int, roll=None) -> jax.Array:
    """x with lanes [0, half) taking x[half:2 * half] and lanes [half, 2 * half) taking x[0:half] (past them: what
    the rolls bring, which rope_tables' sin = 0 cancels). `roll(x, shift)` rotates the last axis toward higher
    indices (jnp.roll's direction; the kernel passes the TPU lane rotate)."""
    roll = roll or (lambda a, shift: jnp.roll(a, shift, axis=-1))
    d = x.shape[-1]
    lane = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.where(lane < half, roll(x, d - half), roll(x, half))


def norm_rope_head(x: jax.Array, w: jax.Array | None, cos: jax.Array, sin: jax.Array, *, eps: float, half: int,
                   roll=None) -> jax.Array:
    """One head [..., D] normalised (times w when given) and rotated, in float32."""
    xf = x.astype(jnp.float32)
    n = xf * inv_rms(xf, eps)
    if w is not None:
        n = n * w.astype(jnp.float32)
    return n * cos + swap_halves(n, half, roll) * sin


def unit_norm(x: jax.Array, eps: float) -> jax.Array:
    """x [..., D] RMS-normalised with unit weight, in float32."""
    xf = x.astype(jnp.float32)
    return xf * inv_rms(xf, eps)
