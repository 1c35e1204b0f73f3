"""A vmapped pallas_call: vmap prepends a grid dimension the kernel body does not see (its program_id(0) stays the
unbatched grid's first axis, as Mosaic lowers it). The walk charges the batched call as the unbatched one times the
batch, never reading the batch index where the body asks for its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tpu_cost_model.schedule import kernel_cost


def _first_step_dot(x):
    """[4 x 128, 128] -> the same: a dot on the first of 4 row blocks only, the other steps copy; the last step
    (num_programs - 1) adds one."""

    def body(x_ref, o_ref):
        i, n = pl.program_id(0), pl.num_programs(0)

        @pl.when(i == 0)
        def _():
            o_ref[...] = jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

        @pl.when(i > 0)
        def _():
            o_ref[...] = x_ref[...]

        @pl.when(i == n - 1)
        def _():
            o_ref[...] += 1

    return pl.pallas_call(body, grid=(4,), in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_a_vmapped_call_is_the_unbatched_one_times_the_batch():
    one = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    (single,) = kernel_cost(_first_step_dot, one, generation="v5e").calls
    (batched,) = kernel_cost(jax.vmap(_first_step_dot), jax.ShapeDtypeStruct((3, 512, 128), jnp.float32),
                             generation="v5e").calls
    dot = 2 * 128 * 128 * 128
    assert single.flops == dot and single.steps == 4  # one block's dot, not four
    assert batched.grid == (3, 4) and batched.steps == 12
    assert batched.flops == 3 * dot  # the first row block of each batch element; reading the batch index as the
    # body's axis would charge all four blocks of batch element 0
    assert batched.read_bytes == 3 * single.read_bytes and batched.vpu_elems == 3 * single.vpu_elems
    assert batched.vpu_elems > 0  # the last step's add, reached in every element
