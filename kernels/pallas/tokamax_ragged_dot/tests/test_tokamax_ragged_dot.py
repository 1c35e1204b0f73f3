"""The wrapper against the NumPy reference, its dispatch trace, and its metadata (no kernel_hub import)."""

from __future__ import annotations

import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokamax_ragged_dot as trd
from tokamax_ragged_dot._vendor.ragged_reference import reference_ragged_dot_grads

from kernel_hub.package.metadata import load_metadata
from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

KERNEL_DIR = Path(__file__).resolve().parents[1]

# (name, M, K, N, group sizes): the edge cases of ragged-dot-tpu's tests.
SHAPES = [
    ("random", 96, 128, 128, [20, 7, 33, 0, 36]),
    ("empty_groups", 64, 128, 128, [0, 30, 0, 0, 34, 0]),
    ("one_group_all_rows", 64, 128, 128, [0, 0, 64, 0]),
    ("rows_past_sum", 80, 128, 128, [10, 0, 25, 5]),
    ("all_empty", 48, 128, 128, [0, 0, 0]),
    ("m_not_tile_multiple", 77, 200, 136, [30, 40, 7]),
]


def make_inputs(m: int, k: int, n: int, sizes: list[int], dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dt)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n), dtype=np.float32) / np.sqrt(k), dt)
    return lhs, rhs, jnp.asarray(sizes, jnp.int32)


# The default path (hub_cpu on CPU) gets every shape; Tokamax's xla oracle path a few (it densifies).
RUNS = [(None, s) for s in SHAPES] + [("xla", s) for s in SHAPES if s[0] in ("random", "m_not_tile_multiple")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("impl", "shape"), RUNS, ids=[f"{i or 'default'}-{s[0]}" for i, s in RUNS])
def test_forward_matches_reference(impl, shape, dtype):
    name, m, k, n, sizes = shape
    lhs, rhs, gs = make_inputs(m, k, n, sizes, dtype, seed=zlib.crc32(f"{impl}{name}{dtype}".encode()) % 997)
    out = trd.ragged_dot(lhs, rhs, gs, implementation=impl)
    assert out.shape == (m, n) and out.dtype == lhs.dtype
    assert rel_error(out, trd.reference_ragged_dot(lhs, rhs, gs)) <= TOL[dtype]
    assert not np.asarray(out[min(sum(sizes), m):], np.float32).any(), "rows past sum(group_sizes) must be zero"
    assert trd.last_implementation()[0] == ("hub_cpu" if impl is None else "xla")


def test_cpu_default_is_the_hub_path_and_says_so():
    lhs, rhs, gs = make_inputs(16, 128, 128, [8, 8], "float32", seed=0)
    trd.ragged_dot(lhs, rhs, gs)
    name, reason = trd.last_implementation()
    assert name == "hub_cpu" and "kernel-hub CPU path" in reason and "default order for cpu" in reason
    trd.ragged_dot(lhs, rhs, gs, implementation="xla")
    assert "densifies" in trd.last_implementation()[1]


def test_preferred_element_type():
    lhs, rhs, gs = make_inputs(64, 128, 128, [20, 0, 44], "bfloat16", seed=1)
    for impl in (None, "xla"):
        out = trd.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32, implementation=impl)
        assert out.dtype == jnp.float32
        assert rel_error(out, trd.reference_ragged_dot(lhs, rhs, gs)) <= 1e-5


def test_jit_with_traced_group_sizes():
    lhs, rhs, _ = make_inputs(64, 128, 128, [0, 0, 0, 0], "float32", seed=2)
    f = jax.jit(lambda a, b, s: trd.ragged_dot(a, b, s))
    for sizes in ([16, 16, 16, 16], [0, 64, 0, 0], [5, 0, 9, 0]):
        gs = jnp.asarray(sizes, jnp.int32)
        assert rel_error(f(lhs, rhs, gs), trd.reference_ragged_dot(lhs, rhs, gs)) <= 1e-4


def test_hub_cpu_gradients():
    lhs, rhs, gs = make_inputs(77, 128, 136, [10, 0, 40, 5], "float32", seed=3)
    dout = jnp.asarray(np.random.default_rng(4).standard_normal((77, 136), dtype=np.float32))
    d_lhs, d_rhs = jax.grad(lambda a, b: jnp.sum(trd.ragged_dot(a, b, gs) * dout), argnums=(0, 1))(lhs, rhs)
    ref_lhs, ref_rhs = reference_ragged_dot_grads(lhs, rhs, gs, dout)
    assert rel_error(d_lhs, ref_lhs) <= 1e-4 and rel_error(d_rhs, ref_rhs) <= 1e-4


def test_nan_input_is_not_hidden():
    lhs, rhs, gs = make_inputs(32, 128, 128, [16, 16], "float32", seed=5)
    out = trd.ragged_dot(lhs.at[3, 0].set(jnp.nan), rhs, gs)
    assert rel_error(out, trd.reference_ragged_dot(lhs, rhs, gs)) == float("inf")


@pytest.mark.parametrize(
    ("backend", "expected"), [("tpu", "mosaic"), ("cuda", "triton"), ("cpu", "hub_cpu"), ("metal", "xla")]
)
def test_resolve_follows_the_declared_order(backend, expected):
    assert trd.resolve_implementation(backend)[0] == expected


def test_resolve_rejects_with_a_reason():
    with pytest.raises(NotImplementedError, match=r"mosaic: skipped, needs tpu/cuda/gpu \(platform is cpu\)"):
        trd.resolve_implementation("cpu", "mosaic")
    with pytest.raises(NotImplementedError, match="interpret= must be None or False"):
        trd.resolve_implementation("tpu", "mosaic", interpret=True)
    assert trd.resolve_implementation("tpu", "mosaic", interpret=False)[0] == "mosaic"
    name, reason = trd.resolve_implementation("cpu", ["triton", "xla"])
    assert name == "xla" and "triton: skipped" in reason and "densifies" in reason
    known = "mosaic, triton, xla, hub_cpu"
    with pytest.raises(ValueError, match=f"unknown ragged_dot implementation .pallas.; known: {known}"):
        trd.resolve_implementation("cpu", "pallas")


def test_tokamax_refusal_moves_to_the_next_and_is_reported(monkeypatch):
    """Tokamax's NotImplementedError for a shape hands over to the next name, and the reason keeps its words."""
    from tokamax_ragged_dot import api

    real = api._run

    def refusing(lhs, rhs, gs, *, name, out_dtype):
        if name == "hub_cpu":
            raise NotImplementedError("RaggedDot inputs must be >= 128")
        return real(lhs, rhs, gs, name=name, out_dtype=out_dtype)

    monkeypatch.setattr(api, "_run", refusing)
    lhs, rhs, gs = make_inputs(16, 128, 128, [8, 8], "float32", seed=6)
    out = trd.ragged_dot(lhs, rhs, gs, implementation=("hub_cpu", "xla"))
    assert rel_error(out, trd.reference_ragged_dot(lhs, rhs, gs)) <= TOL["float32"]
    name, reason = trd.last_implementation()
    assert name == "xla"
    assert reason.startswith("hub_cpu: skipped, refused at call: RaggedDot inputs must be >= 128; xla: chosen")


def test_metadata_pins_the_validated_pair():
    for variant in load_metadata(KERNEL_DIR).variants:
        assert dict(variant.requires) == {"jax": "==0.10.2", "tokamax": "==0.0.12"}


def test_hub_cpu_is_the_vendored_shared_path():
    """The CPU path is the shared grouped matmul ragged-dot-tpu runs too, vendored (one copy to maintain)."""
    from tokamax_ragged_dot._vendor import cpu_gmm

    assert "cpu_gmm.py" in load_metadata(KERNEL_DIR).vendor
    assert not (KERNEL_DIR / "tokamax_ragged_dot" / "_vendor").exists()  # assembled, never checked in
    assert trd.api.cpu_gmm is cpu_gmm
