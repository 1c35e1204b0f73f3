"""A Pallas call on a megacore chip (v4, v5p: two TensorCores run as one device) runs on both cores only when its
grid has a parallel dimension of more than one step: with none (all "arbitrary", or no grid) it runs on one core, at
half the chip's MXU rate. The same call on a one-core chip (v6e) costs the same either way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.tpu.chips import chip
from tpu_cost_model.schedule import kernel_cost
from tpu_cost_model.schedule_grid import splits_across_cores

M = K = N = 2048
T = 512


def _matmul(semantics):
    def kernel(x_ref, y_ref, o_ref, acc):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc[...] = jnp.zeros_like(acc)

        acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = acc[...].astype(o_ref.dtype)

    params = None if semantics is None else pltpu.CompilerParams(dimension_semantics=semantics)
    return lambda x, y: pl.pallas_call(
        kernel, grid=(M // T, N // T, K // T),
        in_specs=[pl.BlockSpec((T, T), lambda i, j, k: (i, k)), pl.BlockSpec((T, T), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((T, T), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype), scratch_shapes=[pltpu.VMEM((T, T), jnp.float32)],
        compiler_params=params)(x, y)


def _seconds(semantics, generation: str) -> float:
    x = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    return kernel_cost(_matmul(semantics), x, jax.ShapeDtypeStruct((K, N), jnp.bfloat16),
                       generation=generation).seconds(chip(generation))


@pytest.mark.parametrize("unsplit", [None, ("arbitrary", "arbitrary", "arbitrary")])
def test_an_unsplit_grid_runs_on_one_core_of_a_megacore(unsplit):
    split = ("parallel", "parallel", "arbitrary")
    one, both = _seconds(unsplit, "v5p"), _seconds(split, "v5p")
    assert 1.4 < one / both < 2.0  # compute-bound: the MXU work at half the rate; step and fixed costs the same
    assert _seconds(unsplit, "v6e") == pytest.approx(_seconds(split, "v6e"))


def test_which_grids_split():
    params = lambda *s: pltpu.CompilerParams(dimension_semantics=s)
    assert splits_across_cores(params("parallel", "arbitrary"), (4, 8))
    assert not splits_across_cores(params("parallel", "arbitrary"), (1, 8))  # one step: nothing to split
    assert not splits_across_cores(params("arbitrary",), (16,))
    assert not splits_across_cores(None, (16,)) and not splits_across_cores(params(), ())


def test_a_vmapped_grid_splits_on_its_batch_and_aligns_the_kernels_semantics():
    """vmap's grid dimensions come first and are parallel; the semantics given name the kernel's own dimensions."""
    params = lambda *s: pltpu.CompilerParams(dimension_semantics=s)
    assert splits_across_cores(params("arbitrary",), (3, 16), vmapped=(0,))  # the batch splits
    assert splits_across_cores(params("parallel", "arbitrary"), (1, 4, 8), vmapped=(0,))  # the kernel's own
    assert not splits_across_cores(params("arbitrary", "parallel"), (1, 4, 1), vmapped=(0,))
