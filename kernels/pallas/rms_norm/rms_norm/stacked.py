"""Norm weights stacked over a model's layers ([L, H]), read by the Pallas kernels at a scalar-prefetched layer.

A block's last two dims must be multiples of (8, 128) or the array's own, so a kernel cannot take one row of the
stack as its block: it takes the block of STACK_ROWS rows holding the layer (or the whole stack when it has fewer)
and picks the row in VMEM with a select and a sublane sum (no dynamic sublane index, which packed bf16 rows would
need).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

#: Rows of the weight stack one block holds: a bf16 tile's 16 sublanes.
STACK_ROWS = 16


def stack_rows(layers: int) -> int:
    """Rows per block of an [L, H] stack: STACK_ROWS, or all L when there are fewer (a block equal to the dim)."""
    return layers if layers <= STACK_ROWS else STACK_ROWS


def stack_spec(layers: int, width: int) -> pl.BlockSpec:
    """The block of the stack holding layer `l_ref[0]`, for a grid of any rank whose one scalar-prefetch operand
    (last in the index map's arguments) holds the layer."""
    rb = stack_rows(layers)
    return pl.BlockSpec((rb, width), lambda *grid_and_layer: (grid_and_layer[-1][0] // rb, 0))


def select_row(block: jax.Array, layer: jax.Array, layers: int) -> jax.Array:
    """[1, H] float32: the layer's row of its block (rows past the stack's end, garbage in a partial last block,
    are never summed: `where`, not a product)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, block.shape, 0)
    hit = rows == layer % stack_rows(layers)
    return jnp.sum(jnp.where(hit, block.astype(jnp.float32), 0.0), axis=0, keepdims=True)
