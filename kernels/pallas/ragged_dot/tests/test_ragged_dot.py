"""Forward and gradient correctness of every implementation against independent references."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from ragged_dot_testutil import dense_reference, make_inputs

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

# (name, M, K, N, group sizes): the edge cases every path must handle.
SHAPES = [
    ("random", 96, 128, 128, [20, 7, 33, 0, 36]),
    ("empty_groups", 64, 128, 128, [0, 30, 0, 0, 34, 0]),
    ("one_group_all_rows", 64, 128, 128, [0, 0, 64, 0]),
    ("first_group_all_rows", 64, 128, 128, [64, 0, 0]),
    ("last_group_all_rows", 64, 128, 128, [0, 0, 64]),
    ("rows_past_sum", 80, 128, 128, [10, 0, 25, 5]),
    ("all_empty", 48, 128, 128, [0, 0, 0]),
    ("m_not_tile_multiple", 77, 128, 128, [30, 40, 7]),
    ("k_n_not_tile_multiple", 64, 200, 136, [16, 16, 32]),
    ("single_group", 40, 128, 128, [40]),
]
DTYPES = ["float32", "bfloat16"]
# Pallas interpreted with big tiles (interpret cost grows with operand bytes x grid steps).
PALLAS_CFG = rd.RaggedDotConfig(tm=32, tk=128, tn=128)


def _call(impl: str, lhs, rhs, gs, **kw):
    if impl == "pallas":
        return rd.ragged_dot(lhs, rhs, gs, implementation="pallas", interpret=True, config=PALLAS_CFG, **kw)
    if impl == "cpu_small_capacity":  # forces the overflow loop on every group
        return rd.ragged_dot(lhs, rhs, gs, implementation="cpu", config=rd.RaggedDotConfig(cpu_capacity=8), **kw)
    return rd.ragged_dot(lhs, rhs, gs, implementation=impl, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("impl", ["cpu", "cpu_small_capacity", "xla", "pallas"])
def test_forward_matches_reference(impl, shape, dtype):
    _, m, k, n, sizes = shape
    lhs, rhs, gs = make_inputs(m, k, n, sizes, dtype, seed=zlib.crc32(f"{impl}{shape[0]}".encode()) % 1000)
    out = _call(impl, lhs, rhs, gs)
    assert out.shape == (m, n) and out.dtype == lhs.dtype
    expected = rd.reference_ragged_dot(lhs, rhs, gs)
    assert rel_error(out, expected) <= TOL[dtype]
    total = min(sum(sizes), m)
    assert not np.asarray(out[total:], np.float32).any(), "rows past sum(group_sizes) must be zero"


@pytest.mark.parametrize("impl", ["cpu", "pallas", "xla"])
def test_preferred_element_type(impl):
    lhs, rhs, gs = make_inputs(64, 128, 128, [20, 0, 44], "bfloat16")
    out = _call(impl, lhs, rhs, gs, preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32
    assert rel_error(out, rd.reference_ragged_dot(lhs, rhs, gs)) <= 1e-5  # f32 out: only input rounding


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_jit_with_traced_group_sizes(impl):
    lhs, rhs, _ = make_inputs(64, 128, 128, [0, 0, 0, 0], "float32")
    f = jax.jit(lambda a, b, s: _call(impl, a, b, s))
    for sizes in ([16, 16, 16, 16], [0, 64, 0, 0], [5, 0, 9, 0]):
        gs = jnp.asarray(sizes, jnp.int32)
        assert rel_error(f(lhs, rhs, gs), rd.reference_ragged_dot(lhs, rhs, gs)) <= 1e-4


def test_nan_never_passes():
    assert rel_error(np.array([[np.nan, 0.0]]), np.zeros((1, 2))) == float("inf")
    assert rel_error(np.array([[np.inf]]), np.ones((1, 1))) == float("inf")


GRAD_SHAPES = [
    ("random", 96, 128, 128, [20, 7, 33, 0, 36]),
    ("rows_past_sum_ragged", 77, 200, 136, [10, 0, 40, 5]),
    ("one_group", 64, 128, 128, [0, 64, 0]),
]


GRAD_CASES = [
    (impl, shape, dtype)
    for impl in ("cpu", "cpu_small_capacity", "pallas")
    for shape in GRAD_SHAPES
    for dtype in DTYPES
    if not (impl == "cpu_small_capacity" and dtype == "bfloat16")  # the loop is dtype-agnostic
]


@pytest.mark.parametrize(
    ("impl", "shape", "dtype"), GRAD_CASES, ids=[f"{i}-{s[0]}-{d}" for i, s, d in GRAD_CASES]
)
def test_gradients_match_dense_reference(impl, shape, dtype):
    _, m, k, n, sizes = shape
    lhs, rhs, gs = make_inputs(m, k, n, sizes, dtype, seed=7)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((m, n), dtype=np.float32))

    def loss(f):
        return lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * w)

    got = jax.grad(loss(lambda a, b: _call(impl, a, b, gs, preferred_element_type=jnp.float32)), (0, 1))(lhs, rhs)
    ref = jax.grad(loss(lambda a, b: dense_reference(a, b, gs)), (0, 1))(
        lhs.astype(jnp.float32), rhs.astype(jnp.float32)
    )
    for g_got, g_ref in zip(got, ref, strict=True):
        assert g_got.dtype == lhs.dtype
        assert rel_error(g_got, np.asarray(g_ref, np.float64)) <= TOL[dtype]
