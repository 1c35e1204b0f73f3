"""Quantized weights (rhs_scale=): every JAX implementation against a float64 NumPy reference of the dequantized
weights (quant_testutil.py quantizes in NumPy, independent of the kernel), at the tails (empty groups, a group of
one row, one group holding every row, rows past the groups, K and N not multiples of 128), bf16 and f32; gradients
in lhs only; one ValueError naming the argument for bad scales; NaN/inf scales refused eagerly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from quant_testutil import quantize, quantized_inputs, reference

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error

# (name, M, K, N, group sizes)
SHAPES = [
    ("empty_one_row_past_sum", 70, 256, 256, [0, 1, 45, 0, 20]),  # 4 rows past the groups
    ("one_group_all_rows_k_n_ragged", 48, 200, 136, [0, 48, 0]),  # K, N not multiples of 128
]
FORMATS = ["int8", "fp8"]
DTYPES = ["float32", "bfloat16"]


def _call(impl: str, lhs, q, s, gs, k: int, n: int):
    if impl == "pallas":  # fast interpret mode, whole-dim tiles where K or N is no multiple of 128
        cfg = rd.RaggedDotConfig(tm=32, tk=128 if k % 128 == 0 else k, tn=128 if n % 128 == 0 else n)
        return rd.ragged_dot(lhs, q, gs, rhs_scale=s, implementation="pallas", interpret=True, config=cfg)
    return rd.ragged_dot(lhs, q, gs, rhs_scale=s, implementation=impl)


@pytest.mark.parametrize("impl", ["xla", "cpu", "pallas"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name,m,k,n,sizes", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward_matches_float64_dequantized(name, m, k, n, sizes, fmt, dtype, impl):
    (lhs, q, s, gs), (lhs64, w64) = quantized_inputs(m, k, n, sizes, fmt, dtype, seed=len(name))
    out = _call(impl, lhs, q, s, gs, k, n)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (m, n)
    assert rd.last_implementation()[0] == impl
    ref = reference(lhs64, w64, sizes)
    err = relative_error(out, ref)
    assert err <= TOL[dtype], f"{impl} {fmt} {dtype}: relative error {err:.2e}"
    assert not np.asarray(out.astype(jnp.float32))[sum(sizes):].any(), "rows past the groups must be zero"


@pytest.mark.parametrize("impl", ["xla", "cpu", "pallas"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gradient_in_lhs_only(fmt, impl):
    m, k, n, sizes = 40, 256, 128, [10, 0, 1, 25]
    (lhs, q, s, gs), (_, w64) = quantized_inputs(m, k, n, sizes, fmt, "float32", seed=3)
    dout = np.random.default_rng(4).standard_normal((m, n))
    loss = lambda a, sc, w: jnp.sum(_call(impl, a, w, sc, gs, k, n) * jnp.asarray(dout, jnp.float32))
    d_lhs, d_scale = jax.grad(loss, argnums=(0, 1))(lhs, s, q)
    want = np.zeros((m, k))
    start = 0
    for g, size in enumerate(sizes):
        want[start:start + size] = dout[start:start + size] @ w64[g].T
        start += size
    assert relative_error(d_lhs, want) <= TOL["float32"]
    assert d_scale.shape == s.shape and not np.asarray(d_scale).any(), "scales are frozen: zero cotangent"
    if fmt == "fp8":  # a float weight dtype jax.grad accepts: zero too
        d_w = jax.grad(loss, argnums=2)(lhs, s, q)
        assert not np.asarray(d_w.astype(jnp.float32)).any()


def test_bad_scales_name_the_argument():
    (lhs, q8, s8, gs), _ = quantized_inputs(16, 256, 128, [8, 8], "int8", "bfloat16")
    (_, qf, sf, _), _ = quantized_inputs(16, 256, 128, [8, 8], "fp8", "bfloat16")
    bad = [
        (dict(rhs=q8, rhs_scale=None), "rhs of dtype int8 needs rhs_scale"),
        (dict(rhs=q8, rhs_scale=s8.astype(jnp.bfloat16)), r"rhs_scale must be float32 \[G, 1, N\]"),
        (dict(rhs=q8, rhs_scale=s8[:, :, :64]), r"rhs_scale must be float32 \[G, 1, N\] = \[2, 1, 128\]"),
        (dict(rhs=qf, rhs_scale=s8), r"rhs_scale must be float32 \[G, ceil\(K/128\), ceil\(N/128\)\] = \[2, 2, 1\]"),
        (dict(rhs=q8.astype(jnp.bfloat16), rhs_scale=s8), "rhs_scale is for quantized rhs"),
        (dict(rhs=q8, rhs_scale=s8.at[1, 0, 5].set(jnp.nan)),
         r"rhs_scale holds NaN or inf \(first at index \[1, 0, 5\]"),
        (dict(rhs=qf, rhs_scale=sf.at[0, 1, 0].set(jnp.inf)), "rhs_scale holds NaN or inf"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            rd.ragged_dot(lhs, kw["rhs"], gs, rhs_scale=kw["rhs_scale"], implementation="xla")
    with pytest.raises(ValueError, match="lhs must be bfloat16 or float32"):
        rd.ragged_dot(lhs.astype(jnp.float16), q8, gs, rhs_scale=s8, implementation="xla")


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_nan_scale_under_jit_poisons_only_its_experts_rows(impl):
    """Under jit the scales are traced and cannot be checked: a NaN scale reaches exactly its expert's rows."""
    m, k, n, sizes = 32, 128, 128, [8, 16, 8]
    (lhs, q, s, gs), _ = quantized_inputs(m, k, n, sizes, "int8", "float32")
    s = s.at[1, 0, 3].set(jnp.nan)
    out = np.asarray(jax.jit(lambda sc: _call(impl, lhs, q, sc, gs, k, n))(s))
    assert np.isnan(out[8:24, 3]).all()
    assert np.isfinite(np.delete(out, 3, axis=1)).all() and np.isfinite(out[:8]).all() and np.isfinite(out[24:]).all()


def test_pallas_under_tpu_simulator_race_free():
    """The quantized kernel under the TPU simulator: race detection, NaN-filled fresh memory, two cores."""
    m, k, n, sizes = 48, 256, 256, [0, 20, 3, 25]
    for fmt in FORMATS:
        (lhs, q, s, gs), (lhs64, w64) = quantized_inputs(m, k, n, sizes, fmt, "float32", seed=7)
        cfg = rd.RaggedDotConfig(tm=16, tk=256, tn=128, experts_per_step=2)
        out = rd.run_race_checked(rd.ragged_dot, lhs, q, gs, rhs_scale=s, implementation="pallas",
                                  interpret=rd.race_checking_params(), config=cfg)
        assert relative_error(out, reference(lhs64, w64, sizes)) <= TOL["float32"]


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_moe_experts_quantized_one_device(impl):
    rng = np.random.default_rng(5)
    t, h, i, e, k = 11, 128, 128, 8, 2
    x = rng.standard_normal((t, h)).astype(np.float32)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    ids[:, 0] = 3  # one expert in every token's top-k; some experts get no token
    w = rng.random((t, k)).astype(np.float32)
    for fmt in FORMATS:
        qg, sg, gu64 = quantize(rng.standard_normal((e, h, 2 * i)) / np.sqrt(h), fmt)
        qd, sd, d64 = quantize(rng.standard_normal((e, i, h)) / np.sqrt(i), fmt)
        ref = rd.reference_moe_experts(x, ids, w, gu64, d64)
        out = rd.moe_experts(jnp.asarray(x), ids, jnp.asarray(w), jnp.asarray(qg), jnp.asarray(qd),
                             w_gate_up_scale=jnp.asarray(sg), w_down_scale=jnp.asarray(sd), implementation=impl)
        assert relative_error(out, ref) <= TOL["float32"], fmt
        if impl != "cpu":  # the (w_gate, w_up) pair form once (each form is a compilation)
            continue
        pair = rd.moe_experts(jnp.asarray(x), ids, jnp.asarray(w), (jnp.asarray(qg[..., :i]), jnp.asarray(qg[..., i:])),
                              jnp.asarray(qd), w_gate_up_scale=(jnp.asarray(sg[..., :sg.shape[2] // 2]),
                                                                jnp.asarray(sg[..., sg.shape[2] // 2:])),
                              w_down_scale=jnp.asarray(sd), implementation=impl)
        assert relative_error(pair, ref) <= TOL["float32"], fmt
    with pytest.raises(ValueError, match="w_down_scale must be float32"):
        rd.moe_experts(jnp.asarray(x), ids, jnp.asarray(w), jnp.asarray(qg), jnp.asarray(qd),
                       w_gate_up_scale=jnp.asarray(sg), w_down_scale=jnp.asarray(sg), implementation=impl)


def test_every_quantized_tpu_compile_case_traces_off_a_tpu():
    """Each case the TPU gate compiles (`validate --tpu ... --tag quantized`) builds and traces to shapes here: its
    imports resolve and its arguments fit the kernel, so a gate failure is the compiler's, never the case's."""
    from ragged_dot.quant_cases import quant_compile_cases

    cases = quant_compile_cases()
    assert any("moe" in c.name for c in cases)
    for case in cases:
        fn, args = case.build()
        assert jax.eval_shape(fn, *args) is not None, case.name
