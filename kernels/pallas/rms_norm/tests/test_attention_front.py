"""attention_front (interpreted Pallas and the XLA path) against the NumPy float64 reference: the residual add, the
input norm, the q/k/v projection and the q/k norms with the rotary embedding, at the seed models' fronts (Qwen3's
4 + 1 heads of 128; Gemma 4's sliding 2 + 1 of 256 with normed values, global 2 + 1 of 512 with keys = values),
rows past the row tile, bf16 and f32, weights stacked over layers or not; the same numbers as the three ops it
fuses, one kernel in the jaxpr, gradients, NaN kept to its row, bad operands refused with one message."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import rms_norm as rn
from rms_norm.reference import reference_attention_front

from kernel_hub.verify.numerics import relative_error, tolerance

TILES = rn.RMSNormConfig(block_rows=16)
EPS = 1e-6
#: (implementation, rows, hidden, q heads, kv heads, head_dim, rotary dims, values, keys are values, dtype,
#:  residual, stacked layers or None)
CASES = [
    ("pallas", 37, 256, 4, 1, 128, 128, "raw", False, "bfloat16", True, 20),       # Qwen3's front, 3 row tiles
    ("pallas", 5, 384, 2, 1, 256, 256, "normed", False, "float32", True, None),    # Gemma 4 sliding
    ("pallas", 16, 200, 2, 1, 512, 128, "normed", True, "bfloat16", False, 3),     # Gemma 4 global, hidden % 128
    ("xla", 9, 256, 4, 2, 64, 64, "raw", False, "float32", True, 20),              # the XLA path: any head_dim
]


def _bf16_round(a: np.ndarray) -> np.ndarray:
    return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)


def _f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _inputs(rows, hidden, nq, nkv, d, kav, dtype, layers, seed):
    rng = np.random.default_rng(seed)
    heads = nq + nkv * (1 if kav else 2)
    lead = () if layers is None else (layers,)
    arr = lambda a: jnp.asarray(np.asarray(a, np.float32), dtype)
    return {"x": arr(rng.standard_normal((rows, hidden)) * 2.0), "residual": arr(rng.standard_normal((rows, hidden))),
            "norm_weight": arr(1.0 + 0.3 * rng.standard_normal((*lead, hidden))),
            "wqkv": arr(rng.standard_normal((*lead, hidden, heads * d)) / np.sqrt(hidden)),
            "q_weight": arr(1.0 + 0.3 * rng.standard_normal((*lead, d))),
            "k_weight": arr(1.0 + 0.3 * rng.standard_normal((*lead, d))),
            "positions": rng.integers(0, 256, rows).astype(np.int32)}


def _call(a, d, rot, nq, nkv, values, kav, impl, residual, layer, **kw):
    cos, sin = rn.rope_tables(jnp.asarray(a["positions"]), d, 1e6, rot)
    return rn.attention_front(a["x"], a["norm_weight"], a["wqkv"], a["q_weight"], a["k_weight"], cos, sin,
                              q_heads=nq, kv_heads=nkv, eps=EPS, values=values, keys_are_values=kav, rotary_dims=rot,
                              residual=a["residual"] if residual else None, layer=layer, implementation=impl,
                              config=TILES, **kw)


@pytest.mark.parametrize(("impl", "rows", "hidden", "nq", "nkv", "d", "rot", "values", "kav", "dtype", "residual",
                          "layers"), CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}+{c[4]}x{c[5]}-{c[7]}{'-kv' if c[8] else ''}-{c[9]}"
                              f"{'-residual' if c[10] else ''}{'' if c[11] is None else f'-layers{c[11]}'}"
                              for c in CASES])
def test_matches_float64_reference(impl, rows, hidden, nq, nkv, d, rot, values, kav, dtype, residual, layers):
    a = _inputs(rows, hidden, nq, nkv, d, kav, dtype, layers, seed=rows * hidden + d)
    at = None if layers is None else layers - 1
    out = _call(a, d, rot, nq, nkv, values, kav, impl, residual, at)
    assert rn.last_implementation()[0] == impl
    assert [o.shape for o in out] == [(rows, nq, d), (rows, nkv, d), (rows, nkv, d)] + ([(rows, hidden)] * residual)
    assert all(o.dtype == jnp.dtype(dtype) for o in out)
    pick = (lambda w: _f64(w)) if layers is None else (lambda w: _f64(w)[at])
    want = reference_attention_front(
        _f64(a["x"]), pick(a["norm_weight"]), pick(a["wqkv"]), pick(a["q_weight"]), pick(a["k_weight"]),
        a["positions"], q_heads=nq, kv_heads=nkv, eps=EPS, theta=1e6, rotary_dims=rot, values=values,
        keys_are_values=kav, residual=_f64(a["residual"]) if residual else None,
        round_to=_bf16_round if dtype == "bfloat16" else None)
    for got, ref in zip(out, want, strict=True):
        err = relative_error(np.asarray(got, np.float32), ref)
        assert err <= tolerance(dtype), err


def test_same_numbers_as_the_three_ops_it_fuses():
    """rms_norm(residual=) -> the projection -> qk_norm_rope, each its own call, on f32: the fused call agrees to
    f32 rounding (the same arithmetic, one schedule)."""
    a = _inputs(24, 256, 4, 1, 128, False, "float32", 4, seed=11)
    fused = _call(a, 128, 128, 4, 1, "raw", False, "pallas", True, 2)
    xn, total = rn.rms_norm(a["x"], a["norm_weight"], eps=EPS, residual=a["residual"], layer=2,
                            implementation="xla")
    qkv = jnp.dot(xn, a["wqkv"][2], precision=jax.lax.Precision.HIGHEST)
    cos, sin = rn.rope_tables(jnp.asarray(a["positions"]), 128, 1e6)
    apart = (*rn.qk_norm_rope(qkv, a["q_weight"], a["k_weight"], cos, sin, q_heads=4, kv_heads=1, eps=EPS, layer=2,
                              implementation="xla"), total)
    for got, want in zip(fused, apart, strict=True):
        assert relative_error(got, want) <= 2e-6


def test_one_kernel_and_no_dot_outside():
    a = _inputs(64, 256, 4, 1, 128, False, "bfloat16", 48, seed=3)
    cos, sin = rn.rope_tables(jnp.asarray(a["positions"]), 128, 1e6)
    fn = lambda x, r, w, i: rn.attention_front(x, a["norm_weight"], w, a["q_weight"], a["k_weight"], cos, sin,
                                               q_heads=4, kv_heads=1, eps=EPS, residual=r, layer=i,
                                               implementation="pallas")
    jaxpr = jax.make_jaxpr(fn)(a["x"], a["residual"], a["wqkv"], jnp.int32(7)).jaxpr
    outside = _outer_primitives(jaxpr)
    assert outside.count("pallas_call") == 1
    assert not {"dot_general", "gather"} & set(outside), outside
    assert not any(e.primitive.name == "add" and e.outvars[0].aval.size > 1 for e in _eqns(jaxpr))  # scalars only
    # the projection's layer is the one slice, fused into the kernel's operand (no copy of the layer, and never
    # the whole stack handed over for XLA to stage into VMEM)
    assert outside.count("dynamic_slice") == 1
    call = _find(jaxpr, "pallas_call")
    fused = call.params["compiler_params"].allow_input_fusion
    assert sum(fused) == 1 and len(fused) == len(call.invars)
    assert call.invars[list(fused).index(True)].aval.shape == (256, 6 * 128)


def _eqns(jaxpr) -> list:
    """Every equation outside the kernels (nested jaxprs walked, kernel bodies not)."""
    out = []
    for eqn in jaxpr.eqns:
        out.append(eqn)
        if eqn.primitive.name != "pallas_call":
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                out += _eqns(sub)
    return out


def _find(jaxpr, name: str):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            return eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            if (found := _find(sub, name)) is not None:
                return found
    return None


def _outer_primitives(jaxpr) -> list[str]:
    """The primitives a jaxpr runs outside its kernels: nested jaxprs (jit, custom_vjp) walked, kernel bodies not."""
    out = []
    for eqn in jaxpr.eqns:
        out.append(eqn.primitive.name)
        if eqn.primitive.name == "pallas_call":
            continue
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out += _outer_primitives(sub)
    return out


def test_pallas_gradient_is_the_xla_arithmetics():
    a = _inputs(20, 256, 4, 1, 128, False, "float32", None, seed=4)
    cos, sin = rn.rope_tables(jnp.asarray(a["positions"]), 128, 1e4)
    rng = np.random.default_rng(9)
    dys = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((20, 4, 128), (20, 1, 128), (20, 1, 128),
                                                                       (20, 256))]
    grads = {}
    for impl in ("pallas", "xla"):
        def loss(x, r, nw, w, impl=impl):
            out = rn.attention_front(x, nw, w, a["q_weight"], a["k_weight"], cos, sin, q_heads=4, kv_heads=1,
                                     eps=EPS, residual=r, implementation=impl, config=TILES)
            return sum(jnp.sum(o * dy) for o, dy in zip(out, dys, strict=True))
        grads[impl] = jax.grad(loss, argnums=(0, 1, 2, 3))(a["x"], a["residual"], a["norm_weight"], a["wqkv"])

    def unfused(x, r, nw, w):  # the same loss through the three separate ops (jax differentiates them)
        xn, total = rn.rms_norm(x, nw, eps=EPS, residual=r, implementation="xla")
        q, k, v = rn.qk_norm_rope(jnp.dot(xn, w, precision=jax.lax.Precision.HIGHEST), a["q_weight"],
                                  a["k_weight"], cos, sin, q_heads=4, kv_heads=1, eps=EPS, implementation="xla")
        return sum(jnp.sum(o * dy) for o, dy in zip((q, k, v, total), dys, strict=True))

    want = jax.grad(unfused, argnums=(0, 1, 2, 3))(a["x"], a["residual"], a["norm_weight"], a["wqkv"])
    for ours, theirs, ref in zip(grads["pallas"], grads["xla"], want, strict=True):
        assert np.all(np.isfinite(np.asarray(ours)))
        assert relative_error(ours, theirs) <= 1e-6 and relative_error(ours, ref) <= 1e-4
        assert float(jnp.max(jnp.abs(ours))) > 0


def test_nan_stays_in_its_row():
    a = _inputs(37, 256, 4, 1, 128, False, "float32", None, seed=5)
    a["x"] = a["x"].at[20, 3].set(jnp.nan)
    q, k, v, total = _call(a, 128, 128, 4, 1, "raw", False, "pallas", True, None)
    for o in (q, k, v, total):
        bad = np.isnan(np.asarray(o)).reshape(37, -1).any(axis=1)
        assert bad[20] and bad.sum() == 1


def test_empty_rows_and_head_dim_off_the_lanes():
    a = _inputs(0, 256, 4, 1, 128, False, "bfloat16", None, seed=6)
    q, k, v, total = _call(a, 128, 128, 4, 1, "raw", False, "pallas", True, None)
    assert (q.shape, k.shape, v.shape, total.shape) == ((0, 4, 128), (0, 1, 128), (0, 1, 128), (0, 256))
    a = _inputs(8, 256, 2, 1, 64, False, "float32", None, seed=7)
    with pytest.raises(NotImplementedError, match="multiple of 128"):
        _call(a, 64, 64, 2, 1, "raw", False, "pallas", True, None)
    _call(a, 64, 64, 2, 1, "raw", False, ("pallas", "xla"), True, None)
    name, why = rn.last_implementation()
    assert name == "xla" and "multiple of 128" in why


@pytest.mark.parametrize(("change", "match"), [
    ({"wqkv": jnp.zeros((256, 5 * 128))}, "wqkv must hold 6 heads"),
    ({"wqkv": jnp.zeros((256, 6 * 128), jnp.bfloat16)}, "wqkv must have x's dtype"),
    ({"norm_weight": jnp.ones(128)}, "x must be \\[T, H\\]"),
    ({"residual": jnp.zeros((4, 128))}, "residual must have x's shape"),
    ({"layer": 0}, "every weight must be stacked"),
    ({"cos": jnp.ones((3, 128))}, "cos must have shape"),
    ({"eps": -1.0}, "eps must be >= 0"),
])
def test_bad_operands_name_what_to_fix(change, match):
    kw = {"x": jnp.zeros((4, 256)), "norm_weight": jnp.ones(256), "wqkv": jnp.zeros((256, 6 * 128)),
          "q_weight": jnp.ones(128), "k_weight": jnp.ones(128), "cos": jnp.ones((4, 128)), "sin": jnp.zeros((4, 128)),
          "q_heads": 4, "kv_heads": 1, "eps": EPS, "residual": jnp.zeros((4, 256))}
    kw.update(change)
    with pytest.raises(ValueError, match=f"attention_front: .*{match}"):
        rn.attention_front(**kw)
