"""Operands of a ragged dot for the JAX entries (ragged-dot-tpu, the Tokamax wrapper): one check, one dtype policy.

Group sizes: concrete values that are negative or sum past M raise one ValueError naming `group_sizes`; traced ones
are normalised (groups.normalize_group_sizes), so every implementation computes the same thing.

Dtype policy (the torch entries follow it too): the result has `preferred_element_type`, else lhs's dtype; lhs and
rhs of different dtypes are computed in their promoted dtype (bf16 x f32 -> f32); group sizes become int32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .group_sizes import check_group_sizes
from .groups import normalize_group_sizes
from .shapes import check_ragged_dot_shapes


def check_operands(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any
                   ) -> tuple[jax.Array, jax.Array, jax.Array, jnp.dtype]:
    """(lhs, rhs, int32 group_sizes, output dtype), or a ValueError/TypeError naming the bad operand."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    check_ragged_dot_shapes(lhs.shape, rhs.shape, group_sizes.shape)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"group_sizes must be integers, got {group_sizes.dtype}")
    if not isinstance(group_sizes, jax.core.Tracer):
        check_group_sizes(np.asarray(group_sizes).tolist(), lhs.shape[0])
    out_dtype = jnp.dtype(preferred_element_type if preferred_element_type is not None else lhs.dtype)
    return lhs, rhs, normalize_group_sizes(group_sizes.astype(jnp.int32), lhs.shape[0]), out_dtype
