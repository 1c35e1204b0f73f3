"""Operand checks for a ragged dot, shared by the ragged-dot kernels' entries (other packages link this file)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def check_operands(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any
                   ) -> tuple[jax.Array, jax.Array, jax.Array, jnp.dtype]:
    """(lhs, rhs, int32 group_sizes, output dtype), or a ValueError/TypeError naming the bad operand."""
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    group_sizes = jnp.asarray(group_sizes)
    if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"ragged_dot wants lhs [M,K] and rhs [G,K,N]; got {lhs.shape} and {rhs.shape}")
    if group_sizes.shape != (rhs.shape[0],):
        raise ValueError(f"group_sizes must have shape ({rhs.shape[0]},), got {group_sizes.shape}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"group_sizes must be integers, got {group_sizes.dtype}")
    out_dtype = jnp.dtype(preferred_element_type if preferred_element_type is not None else lhs.dtype)
    return lhs, rhs, group_sizes.astype(jnp.int32), out_dtype
