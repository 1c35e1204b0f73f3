"""ragged_dot(layer=) on weights stacked over layers [L, G, K, N]: every implementation equals the f32 HIGHEST
reference on rhs[layer], for the first and the last layer, traced layers included; the Pallas path never slices
the stack."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from ragged_dot_testutil import dense_reference

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

LAYERS = 3
SHAPES = [
    ("random", 96, 128, 128, [20, 7, 33, 0, 36]),
    ("empty_groups", 64, 128, 128, [0, 30, 0, 0, 34, 0]),
    ("one_group_all_rows", 64, 128, 128, [0, 0, 64, 0]),
    ("rows_past_sum", 80, 128, 128, [10, 0, 25, 5]),
    ("k_n_not_tile_multiple", 77, 200, 136, [30, 40, 7]),
]
PALLAS_CFG = rd.RaggedDotConfig(tm=32, tk=128, tn=128)


def _inputs(m, k, n, sizes, dtype, seed):
    rng = np.random.default_rng(seed)
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dt)
    stack = jnp.asarray(rng.standard_normal((LAYERS, len(sizes), k, n), dtype=np.float32) / np.sqrt(k), dt)
    return lhs, stack, jnp.asarray(sizes, jnp.int32)


def _call(impl, lhs, stack, gs, layer, **kw):
    if impl == "pallas":
        kw.update(interpret=True, config=kw.get("config", PALLAS_CFG))
    return rd.ragged_dot(lhs, stack, gs, implementation=impl, layer=layer, **kw)


@pytest.mark.parametrize("layer", [0, LAYERS - 1])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("impl", ["cpu", "xla", "pallas"])
def test_stacked_matches_reference_of_that_layer(impl, shape, dtype, layer):
    _, m, k, n, sizes = shape
    lhs, stack, gs = _inputs(m, k, n, sizes, dtype, seed=7 * layer + len(sizes))
    out = _call(impl, lhs, stack, gs, layer)
    assert out.shape == (m, n) and out.dtype == lhs.dtype
    expected = dense_reference(lhs, stack[layer], gs)
    other = dense_reference(lhs, stack[(layer + 1) % LAYERS], gs)
    assert rel_error(out, expected) <= TOL[dtype]
    if sum(sizes):  # the right layer, not another one
        assert rel_error(out, other) > TOL[dtype]
    assert not np.asarray(out[min(sum(sizes), m):], np.float32).any()


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_traced_layer_in_a_scan(impl):
    """The decode step's use: a scan whose counter picks the layer of a closed-over stack."""
    lhs, stack, gs = _inputs(64, 128, 128, [0, 30, 0, 34], "float32", seed=3)

    @jax.jit
    def all_layers(lhs, stack, gs):
        def body(_, layer):
            return None, _call(impl, lhs, stack, gs, layer)
        return jax.lax.scan(body, None, jnp.arange(LAYERS, dtype=jnp.int32))[1]

    outs = all_layers(lhs, stack, gs)
    for layer in range(LAYERS):
        assert rel_error(outs[layer], dense_reference(lhs, stack[layer], gs)) <= TOL["float32"]


def test_several_experts_per_step():
    lhs, stack, gs = _inputs(64, 128, 128, [5, 0, 27, 0, 32, 0], "bfloat16", seed=5)
    cfg = rd.RaggedDotConfig(tm=32, tk=128, tn=128, experts_per_step=2)
    out = _call("pallas", lhs, stack, gs, jnp.int32(1), config=cfg)
    assert rel_error(out, dense_reference(lhs, stack[1], gs)) <= TOL["bfloat16"]


def test_pallas_never_slices_the_stack():
    lhs, stack, gs = _inputs(64, 128, 128, [30, 34], "bfloat16", seed=1)
    jaxpr = jax.make_jaxpr(lambda s, i: _call("pallas", lhs, s, gs, i))(stack, jnp.int32(1))
    text = str(jaxpr)
    assert "pallas_call" in text
    slicing = ("dynamic_slice", "gather", "slice[")
    four_d = f"bf16[{LAYERS},2,128,128]"
    for line in text.splitlines():  # no op takes the whole stack apart
        if four_d in line and any(s in line for s in slicing):
            pytest.fail(f"the stack is sliced: {line.strip()}")


@pytest.mark.parametrize("bad", ["layer_out_of_range", "unstacked_rhs", "float_layer", "quantized"])
def test_bad_stacked_operands_raise(bad):
    lhs, stack, gs = _inputs(32, 128, 128, [16, 16], "float32", seed=2)
    kw = {"layer": 1}
    if bad == "layer_out_of_range":
        kw["layer"] = LAYERS
    elif bad == "unstacked_rhs":
        stack = stack[0]
    elif bad == "float_layer":
        kw["layer"] = 1.0
    else:
        kw["rhs_scale"] = jnp.ones((LAYERS, 2, 1, 128), jnp.float32)
    with pytest.raises(ValueError, match="layer"):
        rd.ragged_dot(lhs, stack, gs, implementation="xla", **kw)


def _kernel_names(jaxpr) -> list[str]:
    """The pallas_call names in a jaxpr, nested jaxprs (jit, custom_vjp) included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":  # a name given to pallas_call, else the kernel function's
            given = eqn.params.get("name_and_src_info") or eqn.params.get("name")
            body = getattr(getattr(eqn.params.get("jaxpr"), "debug_info", None), "func_name", None)
            out.append(str(given or body).split(" ")[0])
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", v)
            if hasattr(inner, "eqns"):
                out += _kernel_names(inner)
    return out


def test_stacked_kernel_keeps_its_name():
    """A profile or a cost walk names the stacked call as the unstacked one: the same kernel."""
    lhs, stack, gs = _inputs(64, 128, 128, [30, 34], "bfloat16", seed=4)
    stacked = _kernel_names(jax.make_jaxpr(lambda s: _call("pallas", lhs, s, gs, jnp.int32(1)))(stack).jaxpr)
    plain = _kernel_names(jax.make_jaxpr(lambda w: rd.ragged_dot(lhs, w, gs, implementation="pallas",
                                                                 interpret=True, config=PALLAS_CFG))(stack[1]).jaxpr)
    assert len(stacked) == 1 and stacked == plain and "without" not in stacked[0], (stacked, plain)
