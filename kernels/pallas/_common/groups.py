"""Group arithmetic every ragged dot shares: rows are grouped contiguously, in group order.

The semantics of sizes no concrete check could refuse (traced under jit): a negative size counts as 0, groups take
rows in order, and a group reaching past M rows is cut at M (later groups get none). jax.lax.ragged_dot differs for
negative sizes (it lays groups on the raw running sum, so a negative size shifts later groups back over earlier
rows); every entry here normalises first (normalize_group_sizes), so all implementations agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_bounds(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """(starts, ends) of each group's rows, clamped to [0, m]: rows are grouped contiguously in order."""
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    return starts, ends


def normalize_group_sizes(group_sizes: jax.Array, m: int) -> jax.Array:
    """The sizes every implementation runs on: each in [0, M], in order, summing to at most M (see the module)."""
    starts, ends = group_bounds(group_sizes, m)
    return ends - starts
