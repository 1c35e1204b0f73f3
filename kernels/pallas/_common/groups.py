"""Group arithmetic every ragged dot shares: rows are grouped contiguously, in group order."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_bounds(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """(starts, ends) of each group's rows, clamped to [0, m]: rows are grouped contiguously in order."""
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    return starts, ends
