"""qk_norm_rope (interpreted Pallas and the XLA path) against the NumPy float64 reference on the seed models'
attention fronts: Qwen3's (4 query + 1 KV heads of 128, full rotary), Gemma 4's sliding layers (normed values, 256
wide) and global layers (keys = values, 512 wide, a quarter rotated), rows past the row tile, bf16 and f32; rope_tables
against float64 angles; a NaN stays in its row; bad operands get one ValueError naming what to fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rms_norm as rn

from kernel_hub.verify.numerics import relative_error, tolerance

TILES = rn.RMSNormConfig(block_rows=16)
EPS = 1e-6
#: (implementation, rows, q heads, kv heads, head_dim, rotary dims, values, keys are values, dtype)
CASES = [
    ("pallas", 37, 4, 1, 128, 128, "raw", False, "bfloat16"),   # Qwen3-30B-A3B on one of 8 devices; 3 row tiles
    ("pallas", 5, 2, 1, 256, 256, "normed", False, "float32"),  # Gemma 4 sliding
    ("pallas", 16, 2, 1, 512, 128, "normed", True, "bfloat16"),  # Gemma 4 global: keys = values, 1/4 rotated
    ("xla", 37, 4, 2, 64, 64, "raw", False, "float32"),         # the XLA path takes any head_dim
    ("xla", 9, 2, 1, 128, 32, "normed", True, "bfloat16"),
]


def _case(rows, nq, nkv, d, kav, dtype, seed):
    rng = np.random.default_rng(seed)
    heads = nq + nkv * (1 if kav else 2)
    qkv = jnp.asarray(rng.standard_normal((rows, heads * d)).astype(np.float32) * 3.0, dtype)
    qw = jnp.asarray((1.0 + 0.3 * rng.standard_normal(d)).astype(np.float32), dtype)
    kw = jnp.asarray((1.0 + 0.3 * rng.standard_normal(d)).astype(np.float32), dtype)
    positions = rng.integers(0, 256, rows).astype(np.int32)  # f32 angles stay exact to ~1e-5 rad here
    return qkv, qw, kw, positions


def _f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


@pytest.mark.parametrize(("impl", "rows", "nq", "nkv", "d", "rot", "values", "kav", "dtype"), CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}+{c[3]}x{c[4]}-rot{c[5]}-{c[6]}{'-kv' if c[7] else ''}-{c[8]}"
                              for c in CASES])
def test_matches_float64_reference(impl, rows, nq, nkv, d, rot, values, kav, dtype):
    qkv, qw, kw, pos = _case(rows, nq, nkv, d, kav, dtype, seed=rows * d + rot)
    cos, sin = rn.rope_tables(jnp.asarray(pos), d, 1e6, rot)
    q, k, v = rn.qk_norm_rope(qkv, qw, kw, cos, sin, q_heads=nq, kv_heads=nkv, eps=EPS, values=values,
                              keys_are_values=kav, rotary_dims=rot, implementation=impl, config=TILES)
    assert rn.last_implementation()[0] == impl
    assert (q.shape, k.shape, v.shape) == ((rows, nq, d), (rows, nkv, d), (rows, nkv, d))
    assert q.dtype == k.dtype == v.dtype == qkv.dtype
    want = rn.reference_qk_norm_rope(_f64(qkv), _f64(qw), _f64(kw), pos, q_heads=nq, kv_heads=nkv, eps=EPS,
                                     theta=1e6, rotary_dims=rot, values=values, keys_are_values=kav)
    for got, ref in zip((q, k, v), want, strict=True):
        assert relative_error(np.asarray(got, np.float32), ref) <= tolerance(dtype)


def test_pallas_and_xla_agree_and_differentiate():
    qkv, qw, kw, pos = _case(20, 4, 1, 128, False, "float32", seed=4)
    cos, sin = rn.rope_tables(jnp.asarray(pos), 128, 1e4)
    dys = [jnp.asarray(np.random.default_rng(i).standard_normal(s), jnp.float32)
           for i, s in enumerate(((20, 4, 128), (20, 1, 128), (20, 1, 128)))]
    grads, outs = {}, {}
    for impl in ("pallas", "xla"):
        def loss(a, b, c, impl=impl):
            out = rn.qk_norm_rope(a, b, c, cos, sin, q_heads=4, kv_heads=1, eps=EPS, implementation=impl,
                                  config=TILES)
            return sum(jnp.sum(o * dy) for o, dy in zip(out, dys, strict=True))
        outs[impl] = loss(qkv, qw, kw)
        grads[impl] = jax.grad(loss, argnums=(0, 1, 2))(qkv, qw, kw)
    assert abs(float(outs["pallas"]) - float(outs["xla"])) <= 1e-4 * abs(float(outs["xla"]))
    for ours, theirs in zip(grads["pallas"], grads["xla"], strict=True):
        assert np.all(np.isfinite(np.asarray(ours))) and relative_error(ours, theirs) <= 1e-5
    # the weights' gradients are not zero: they reach the loss through the norms
    assert float(jnp.max(jnp.abs(grads["xla"][1]))) > 0 and float(jnp.max(jnp.abs(grads["xla"][2]))) > 0


def test_rope_tables_match_float64_angles():
    pos = np.array([0, 1, 7, 100, 2047], np.int32)
    cos, sin = rn.rope_tables(jnp.asarray(pos), 256, 1e4, 64)
    ang = pos[:, None] * 1e4 ** (-np.arange(32) * 2.0 / 64)[None, :]
    np.testing.assert_allclose(np.asarray(cos)[:, :32], np.cos(ang), atol=5e-4)
    np.testing.assert_allclose(np.asarray(cos)[:, 32:64], np.cos(ang), atol=5e-4)
    np.testing.assert_allclose(np.asarray(sin)[:, :32], -np.sin(ang), atol=5e-4)
    np.testing.assert_allclose(np.asarray(sin)[:, 32:64], np.sin(ang), atol=5e-4)
    assert np.all(np.asarray(cos)[:, 64:] == 1.0) and np.all(np.asarray(sin)[:, 64:] == 0.0)
    with pytest.raises(ValueError, match="rotary_dims"):
        rn.rope_tables(jnp.asarray(pos), 128, 1e4, 130)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_nan_stays_in_its_row(impl):
    qkv, qw, kw, pos = _case(24, 2, 1, 128, False, "float32", seed=5)
    qkv = qkv.at[17, 3].set(jnp.nan)  # row 17's first query head, in the second 16-row tile
    cos, sin = rn.rope_tables(jnp.asarray(pos), 128, 1e4)
    q, k, v = rn.qk_norm_rope(qkv, qw, kw, cos, sin, q_heads=2, kv_heads=1, eps=EPS, implementation=impl,
                              config=TILES)
    q = np.asarray(q)
    assert np.isnan(q[17, 0]).all() and np.isfinite(np.delete(q, 17, axis=0)).all()
    assert np.isfinite(q[17, 1]).all() and np.isfinite(np.asarray(k)).all() and np.isfinite(np.asarray(v)).all()


def test_no_rows_gives_empty_outputs():
    z = jnp.zeros((0, 3 * 128), jnp.bfloat16)
    q, k, v = rn.qk_norm_rope(z, jnp.ones(128), jnp.ones(128), jnp.zeros((0, 128)), jnp.zeros((0, 128)),
                              q_heads=1, kv_heads=1, eps=EPS)
    assert (q.shape, k.shape, v.shape) == ((0, 1, 128), (0, 1, 128), (0, 1, 128))


def test_pallas_refuses_unaligned_heads_and_the_order_falls_back():
    qkv, qw, kw, pos = _case(8, 2, 1, 64, False, "float32", seed=6)
    cos, sin = rn.rope_tables(jnp.asarray(pos), 64, 1e4)
    args = (qkv, qw, kw, cos, sin)
    with pytest.raises(NotImplementedError, match="multiple of 128"):
        rn.qk_norm_rope(*args, q_heads=2, kv_heads=1, eps=EPS, implementation="pallas")
    rn.qk_norm_rope(*args, q_heads=2, kv_heads=1, eps=EPS, implementation=("pallas", "xla"))
    name, why = rn.last_implementation()
    assert name == "xla" and "multiple of 128" in why


@pytest.mark.parametrize(("change", "match"), [
    ({"qkv": jnp.zeros((4, 5 * 128))}, "qkv must hold 3 heads"),
    ({"q_weight": jnp.ones(64)}, "q_weight must have shape"),
    ({"cos": jnp.ones((3, 128))}, "cos must have shape"),
    ({"rotary_dims": 127}, "rotary_dims"),
    ({"values": "scaled"}, "values must be"),
    ({"q_heads": 0}, "q_heads and kv_heads"),
    ({"eps": -1.0}, "eps must be >= 0"),
])
def test_bad_operands_name_what_to_fix(change, match):
    kw = {"qkv": jnp.zeros((4, 3 * 128)), "q_weight": jnp.ones(128), "k_weight": jnp.ones(128),
          "cos": jnp.ones((4, 128)), "sin": jnp.zeros((4, 128)), "q_heads": 1, "kv_heads": 1, "eps": EPS}
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        rn.qk_norm_rope(**kw)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_layer_reads_the_norm_weights_of_a_stack(impl):
    qkv, _, _, pos = _case(20, 4, 1, 128, False, "bfloat16", seed=7)
    rng = np.random.default_rng(8)
    qs, ks = (jnp.asarray(1.0 + 0.3 * rng.standard_normal((18, 128)), jnp.bfloat16) for _ in range(2))
    cos, sin = rn.rope_tables(jnp.asarray(pos), 128, 1e6)
    kw = dict(q_heads=4, kv_heads=1, eps=EPS, implementation=impl, config=TILES)
    for at in (0, 17):  # the stack's first block of 16 rows, then its partial second one
        got = rn.qk_norm_rope(qkv, qs, ks, cos, sin, layer=at, **kw)
        one = rn.qk_norm_rope(qkv, qs[at], ks[at], cos, sin, **kw)
        for a, b in zip(got, one, strict=True):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    traced = jax.jit(lambda i: rn.qk_norm_rope(qkv, qs, ks, cos, sin, layer=i, **kw)[0])
    np.testing.assert_array_equal(np.asarray(traced(jnp.int32(17)), np.float32), np.asarray(got[0], np.float32))
    d_qs = jax.grad(lambda s: jnp.sum(rn.qk_norm_rope(qkv, s, ks, cos, sin, layer=5, **kw)[0].astype(jnp.float32)))(
        qs)
    assert float(jnp.max(jnp.abs(d_qs[5]))) > 0 and float(jnp.max(jnp.abs(jnp.delete(d_qs, 5, axis=0)))) == 0.0
    with pytest.raises(ValueError, match="stacked over layers"):
        rn.qk_norm_rope(qkv, qs, ks[:3], cos, sin, layer=0, **kw)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 18\)"):
        rn.qk_norm_rope(qkv, qs, ks, cos, sin, layer=18, **kw)
