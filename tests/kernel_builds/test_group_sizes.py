"""group_sizes that no routing produces: concrete values that are negative or sum past M raise one ValueError naming
`group_sizes` on every entry and implementation; traced values (under jit) give every implementation the same
result, the contract's semantics (docs/kernel-contract.md): a negative size counts as 0, rows go to groups in
order, a group reaching past M is cut there. Checked against a NumPy loop written here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_hub as kh

M, K, N = 50, 128, 128  # M not a multiple of any tile
BAD = [[-5, 20, 30, 19], [30, 30, 30, 30], [0, 0, 51, 0]]
TRACED = [[-5, 20, 30, 19], [10, -3, 20, 10], [30, 30, 30, 30], [0, 0, 70, 0], [50, 0, 0, 0], [0, 0, 0, 0],
          [-7, -1, 60, 4]]


RD_LOAD = {"version": 1, "backend": "cpu"}  # the JAX build (conftest.py rd)


def numpy_contract(lhs: np.ndarray, rhs: np.ndarray, sizes: list[int]) -> np.ndarray:
    """The contract in float64: clamp at 0, rows in group order, cut at M; rows past the end are zero."""
    a, b = lhs.astype(np.float64), rhs.astype(np.float64)
    out, start = np.zeros((a.shape[0], b.shape[2])), 0
    for g, size in enumerate(sizes):
        end = min(start + max(size, 0), a.shape[0])
        out[start:end] = a[start:end] @ b[g]
        start = end
    return out


@pytest.fixture(scope="module")
def tokamax():
    pytest.importorskip("tokamax")
    return kh.get_kernel("kernel-hub/tokamax-ragged-dot", backend="cpu")


def _inputs(dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((M, K), np.float32)
    rhs = rng.standard_normal((4, K, N), np.float32)
    return jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype)


def _jax_calls(rd, tokamax):
    cfg = rd.RaggedDotConfig(tm=32, tk=128, tn=128)
    yield "pallas", lambda a, b, g: rd.ragged_dot(a, b, g, implementation="pallas", interpret=True, config=cfg)
    yield "cpu", lambda a, b, g: rd.ragged_dot(a, b, g, implementation="cpu")
    yield "cpu_overflow", lambda a, b, g: rd.ragged_dot(a, b, g, implementation="cpu",
                                                        config=rd.RaggedDotConfig(cpu_capacity=8))
    yield "xla", lambda a, b, g: rd.ragged_dot(a, b, g, implementation="xla")
    yield "tokamax", lambda a, b, g: tokamax.ragged_dot(a, b, g)


@pytest.mark.parametrize("sizes", BAD, ids=["negative", "sum_past_m", "one_group_past_m"])
def test_concrete_bad_sizes_raise_one_value_error_on_every_jax_implementation(rd, tokamax, sizes):
    lhs, rhs = _inputs("float32")
    for name, call in _jax_calls(rd, tokamax):
        with pytest.raises(ValueError, match="group_sizes") as err:
            call(lhs, rhs, jnp.asarray(sizes, jnp.int32))
        assert ("non-negative" in str(err.value)) == (min(sizes) < 0), (name, err.value)


@pytest.mark.parametrize("sizes", BAD, ids=["negative", "sum_past_m", "one_group_past_m"])
@pytest.mark.parametrize("implementation", ["torch", "jax"])
def test_concrete_bad_sizes_raise_on_the_torch_entry(sizes, implementation):
    torch = pytest.importorskip("torch")
    rd_t = kh.get_kernel("kernel-hub/ragged-dot-tpu", version=1, framework="torch", backend="cpu")
    lhs, rhs = torch.randn(M, K), torch.randn(4, K, N)
    with pytest.raises(ValueError, match="group_sizes"):
        rd_t.ragged_dot(lhs, rhs, torch.tensor(sizes, dtype=torch.int32), implementation=implementation)


def test_sizes_without_values_are_normalised_on_the_torch_entry():
    torch = pytest.importorskip("torch")
    rd_t = kh.get_kernel("kernel-hub/ragged-dot-tpu", version=1, framework="torch", backend="cpu")
    module = __import__("sys").modules[rd_t.ragged_dot.__module__]
    sizes = torch.tensor([-5, 20, 30, 19])
    assert module._checked_group_sizes(sizes.to("meta"), M).shape == (4,)
    with pytest.raises(ValueError, match="group_sizes"):
        module._checked_group_sizes(sizes, M)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_traced_sizes_give_every_implementation_the_contracts_result(rd, tokamax, dtype):
    lhs, rhs = _inputs(dtype, seed=1)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for name, call in _jax_calls(rd, tokamax):
        jitted = jax.jit(call)
        for sizes in TRACED:
            out = np.asarray(jitted(lhs, rhs, jnp.asarray(sizes, jnp.int32)), np.float64)
            expected = numpy_contract(np.asarray(lhs, np.float32), np.asarray(rhs, np.float32), sizes)
            assert np.isfinite(out).all(), (name, sizes)
            scale = max(1.0, float(np.abs(expected).max()))
            assert float(np.abs(out - expected).max()) <= tol * scale, (name, sizes)
