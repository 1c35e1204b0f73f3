"""Shared test helpers: inputs and a dense differentiable reference. The error metric and tolerances are
kernel-hub's own (kernel_hub.verify.numerics): tests are not shipped, so they may import the client."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def make_inputs(m: int, k: int, n: int, sizes: list[int], dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dt)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n), dtype=np.float32) / np.sqrt(k), dt)
    return lhs, rhs, jnp.asarray(sizes, jnp.int32)


def dense_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Per-group masked einsum in f32 HIGHEST: differentiable, independent of the kernels."""
    m = lhs.shape[0]
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    row = jnp.arange(m)[:, None]
    mask = ((row >= starts[None, :]) & (row < ends[None, :])).astype(jnp.float32)  # [M, G]
    per_group = jnp.einsum(
        "mk,gkn->gmn", lhs.astype(jnp.float32), rhs.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )
    return jnp.einsum("mg,gmn->mn", mask, per_group, precision=jax.lax.Precision.HIGHEST)
