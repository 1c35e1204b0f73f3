"""Dots are charged at the chip's MXU width: the array holds a W x W tile of the stationary operand (W = 128 on v4,
v5e, v5p; 256 on v6e, v7x), so a contraction or output narrower than W, or off its multiple, takes as long as the
next multiple. A kernel's walk is remembered per width, so one process modeling several chips never reuses a walk
charged for another's MXU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from tpu_cost_model.rates import MXU_WIDTH
from tpu_cost_model.schedule import kernel_cost


def _dot(m: int, k: int, n: int):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    fn = lambda x, y: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16))(x, y)
    return fn, args


def _flops(m: int, k: int, n: int, generation: str | None) -> float:
    fn, args = _dot(m, k, n)
    (call,) = kernel_cost(fn, *args, generation=generation).calls
    return call.flops


@pytest.mark.parametrize(("k", "n"), [(64, 512), (512, 64), (192, 384)])
def test_a_narrow_or_ragged_dot_takes_the_next_multiple_of_the_mxu(k, n):
    pad = lambda d, w: -(-d // w) * w
    for generation in ("v5e", "v6e", "v5p", "v7x"):
        w = MXU_WIDTH[generation]
        assert _flops(256, k, n, generation) == 2 * 256 * pad(k, w) * pad(n, w)
    assert _flops(256, k, n, None) == 2 * 256 * k * n  # no chip named: the dot's own FLOPs


def test_a_dot_on_whole_tiles_is_charged_its_flops_everywhere():
    assert {_flops(128, 512, 768, g) for g in ("v5e", "v6e", "v7x", None)} == {2 * 128 * 512 * 768}


def test_a_walk_is_not_reused_across_mxu_widths():
    narrow = [_flops(128, 64, 256, g) for g in ("v6e", "v5e", "v6e")]  # the same kernel and arguments
    assert narrow == [2 * 128 * 256 * 256, 2 * 128 * 128 * 256, 2 * 128 * 256 * 256]
