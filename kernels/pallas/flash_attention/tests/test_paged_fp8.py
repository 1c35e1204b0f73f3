"""fp8 (float8_e4m3fn) KV caches of ragged paged attention against float64 NumPy: the kernel on the stored cache
(dequantized in NumPy) within the float tolerance, the quantized attention within e4m3's error bound of the float
attention (and a wrong scale outside it), saturating stores, and the chips that refuse fp8."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flash_attention import paged as paged_mod
from flash_attention.paged_cases import SMALL, PagedScenario, features, paged_inputs
from flash_attention.paged_quant import fp8_refusal
from flash_attention.paged_v3 import fuse_kv_cache

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
#: e4m3 keeps 3 mantissa bits: rounding a normal value errs by at most half an ulp, 2**-4 of it; below the smallest
#: normal (2**-6) the subnormal spacing is 2**-9, so the absolute error there is at most 2**-10 (times the scale).
E4M3_REL, E4M3_ABS = 2.0**-4, 2.0**-10
#: Quantized attention against float attention, as relative_error (max abs error over max |expected|): one e4m3 ulp,
#: 2**-3, twice the per-element rounding: one 2**-4 for the values' rounding, one for the logits' rounding moving the
#: softmax weights (measured 0.04-0.064 on these N(0, 1) problems; docs/paged-attention.md).
FP8_TOL = 2.0**-3

#: Pages of 32 (whole fp8 sublane tiles for the kernel): SMALL's features (window, empty sequence, padding, lengths
#: off the page size, MQA soft cap and sinks, non-causal MHA), GQA mixing prefill and decode, and one sequence
#: holding every page of the cache.
SCENARIOS = {sc.name: sc for sc in (
    *(dataclasses.replace(s, page_size=32) for s in SMALL),
    PagedScenario("gqa4_mixed", ((1, 40), (17, 17), (6, 70)), hq=8, hkv=2, d=128, page_size=32, pages_per_seq=3),
    PagedScenario("one_sequence_every_page", ((5, 4 * 32 - 3),), hq=8, hkv=2, d=128, page_size=32, pages_per_seq=4,
                  spare_pages=0, soft_cap=20.0),
)}


def _fp8(x, scale: float) -> np.ndarray:
    return np.clip(np.asarray(x, np.float32) / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)


def _inputs(sc: PagedScenario, dtype: str, seed: int, ks: float, vs: float) -> dict:
    x = paged_inputs(sc, dtype, seed)
    x["float_k_cache"], x["float_v_cache"] = x["k_cache"], x["v_cache"]
    x["k_cache"], x["v_cache"] = jnp.asarray(_fp8(x["k_cache"], ks)), jnp.asarray(_fp8(x["v_cache"], vs))
    return x


def _dequantized(out, ks: float, vs: float) -> np.ndarray:
    o, kc, vc = out
    return np.concatenate([np.asarray(o, np.float64).ravel(), (np.asarray(kc).astype(np.float64) * ks).ravel(),
                           (np.asarray(vc).astype(np.float64) * vs).ravel()])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("impl", ["cpu", "xla", "pallas"])
def test_fp8_cache_matches_float64_reference_of_the_stored_cache(name: str, impl: str) -> None:
    sc = SCENARIOS[name]
    dtype = ("float32", "bfloat16")[(len(name) + len(impl)) % 2]  # both dtypes across the grid, one per case
    ks, vs = 0.37, 0.011  # odd scales: a scale applied twice or not at all shows
    x = _inputs(sc, dtype, seed=len(name) * 7 + len(impl), ks=ks, vs=vs)
    kw = dict(sinks=x["sinks"], **features(sc), k_scale=ks, v_scale=vs)
    out = fa.ragged_paged_attention(*(x[k] for k in ARGS), implementation=impl, **kw)
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), **kw)
    assert out[1].dtype == out[2].dtype == jnp.float8_e4m3fn  # stored quantized, never widened
    got, want = _dequantized(out, ks, vs), np.concatenate([np.ravel(r) for r in ref])
    assert np.isfinite(got).all()
    # the caches bit for bit: new rows quantized as NumPy's ml_dtypes does it
    n_out = np.asarray(out[0]).size
    np.testing.assert_array_equal(got[n_out:], want[n_out:])
    err = relative_error(got[:n_out], want[:n_out])
    assert err <= tolerance(dtype), f"{name} {impl} {dtype}: {err}"


def _e4m3_bound(x: dict, sc: PagedScenario, ks: float, vs: float, slack: float) -> np.ndarray:
    """[T, Hq, D]: how far attention on e4m3-rounded K/V may fall from attention on the float K/V.

    Per stored element |dk| <= E4M3_REL |k| + E4M3_ABS ks (same for v). A logit moves by at most
    e = sm_scale * sum_d |q_d| |dk_d|; with every logit moved by at most E, each softmax weight changes by a factor
    within exp(+-2E), so the weights move by at most exp(2E) - 1 in sum, and out = sum_j p_j v_j moves by at most
    max_j |dv_j| + (exp(2E) - 1) max_j |v_j|. E and the maxima are taken over every position of the query's
    sequence (a superset of what it sees, so still a bound). `slack` adds the float arithmetic's own error."""
    q = np.asarray(x["queries"], np.float64)
    tokens, hq, d = q.shape
    hkv, ps = sc.hkv, sc.page_size
    kc, vc = (np.asarray(x[n], np.float64) for n in ("float_k_cache", "float_v_cache"))
    knew, vnew = (np.asarray(x[n], np.float64) for n in ("keys", "values"))
    bound = np.zeros((tokens, hq, d))
    cu, lens, table = x["cu_q_lens"], x["kv_lens"], x["page_indices"]
    for i in range(x["num_seqs"]):
        first = lens[i] - (cu[i + 1] - cu[i])
        k = np.stack([kc[table[i, p // ps], p % ps] for p in range(lens[i])])
        v = np.stack([vc[table[i, p // ps], p % ps] for p in range(lens[i])])
        k[first:], v[first:] = knew[cu[i]:cu[i + 1]], vnew[cu[i]:cu[i + 1]]
        dk, dv = E4M3_REL * np.abs(k) + E4M3_ABS * ks, E4M3_REL * np.abs(v) + E4M3_ABS * vs
        for t in range(cu[i], cu[i + 1]):
            for h in range(hq):
                e = (np.abs(q[t, h]) @ dk[:, h // (hq // hkv)].T).max() / np.sqrt(d)
                vh = np.abs(v[:, h // (hq // hkv)])
                bound[t, h] = dv[:, h // (hq // hkv)].max(0) + np.expm1(2 * e) * vh.max(0) + slack * vh.max(0)
    return bound


@pytest.mark.parametrize(("name", "dtype"), [("gqa4_mixed", "float32"), ("one_sequence_every_page", "bfloat16")])
def test_quantized_attention_within_e4m3_bound_and_a_wrong_scale_is_not(name: str, dtype: str) -> None:
    sc = SCENARIOS[name]
    ks, vs = 4.0 / 448, 4.0 / 448  # N(0, 1) data: |x| <= 4 uses e4m3's whole range
    x = _inputs(sc, dtype, seed=11, ks=ks, vs=vs)
    args = [x[k] for k in ARGS]
    # the float inputs, unquantized: what the fp8 cache approximates (its stored contents came from them)
    float_args = [x["float_k_cache"] if k == "k_cache" else x["float_v_cache"] if k == "v_cache" else x[k]
                  for k in ARGS]
    kw = features(sc)
    ideal = fa.reference_ragged_paged_attention(*float_args, **kw)[0]

    def run(k_scale: float, v_scale: float) -> np.ndarray:
        out = fa.ragged_paged_attention(*args, k_scale=k_scale, v_scale=v_scale, implementation="pallas", **kw)
        return np.asarray(out[0], np.float64)

    got = run(ks, vs)
    slack = 2.0**-6 if dtype == "bfloat16" else 1e-5  # bf16 output and probabilities: a few 2**-8 roundings
    assert np.isfinite(got).all()
    err = np.abs(got - ideal)
    bound = _e4m3_bound(x, sc, ks, vs, slack)
    assert (err <= bound).all(), f"{dtype}: worst excess {(err - bound).max()}"
    rel = relative_error(got, ideal)
    assert rel <= FP8_TOL, rel
    for wrong in (run(ks, vs * 1.5), run(ks * 2, vs)):  # a scale off by 1.5x (values) or 2x (keys)
        rel_wrong = relative_error(wrong, ideal)
        assert rel_wrong > 2 * FP8_TOL and rel_wrong > 4 * rel, (rel, rel_wrong)


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_overflowing_rows_saturate_never_nan(impl: str) -> None:
    sc = SCENARIOS["gqa4_mixed"]
    x = _inputs(sc, "float32", seed=5, ks=1.0, vs=1.0)
    sign = np.where(np.arange(x["keys"].size).reshape(x["keys"].shape) % 2, 1.0, -1.0)
    x["keys"] = jnp.asarray(1e6 * sign, jnp.float32)  # far past e4m3's 448
    x["values"] = jnp.asarray(-3e38 * sign, jnp.float32)
    out, kc, vc = fa.ragged_paged_attention(*(x[k] for k in ARGS), implementation=impl)
    for cache in (kc, vc):
        c = np.asarray(cache).astype(np.float32)
        assert np.isfinite(c).all()
        assert np.abs(c).max() == 448.0
    assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize(("kind", "refused"), [
    ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"), ("TPU v4", "v4"),
    ("TPU v6 lite", None), ("TPU7x", None), ("cpu", None), (None, None),
])
def test_chips_without_fp8_refuse_it(kind, refused) -> None:
    why = fp8_refusal(kind)
    if refused is None:
        assert why is None
    else:
        assert refused in why and kind in why and "bfloat16" in why


def test_the_entry_refuses_fp8_on_v5e_with_one_clear_error(monkeypatch) -> None:
    sc = SCENARIOS["gqa4_mixed"]
    x = _inputs(sc, "bfloat16", seed=1, ks=1.0, vs=1.0)
    monkeypatch.setattr(paged_mod, "device_kind_of", lambda *a: "TPU v5 lite")
    with pytest.raises(ValueError, match=r"TPU v5 lite.*v5e.*bfloat16"):
        fa.ragged_paged_attention(*(x[k] for k in ARGS), implementation="pallas")
    bf16 = [x["float_k_cache"] if k == "k_cache" else x["float_v_cache"] if k == "v_cache" else x[k] for k in ARGS]
    out = fa.ragged_paged_attention(*bf16, implementation="cpu")  # a bf16 cache still runs there
    assert out[1].dtype == jnp.bfloat16


@pytest.mark.parametrize(("kw", "match"), [
    ({"k_scale": 0.0}, "k_scale"), ({"v_scale": float("nan")}, "v_scale"), ({"k_scale": float("inf")}, "k_scale"),
    ({"v_scale": "big"}, "v_scale"), ({"k_scale": True}, "k_scale"),
])
def test_bad_scales_are_one_clear_error(kw: dict, match: str) -> None:
    x = _inputs(SCENARIOS["gqa4_mixed"], "float32", seed=2, ks=1.0, vs=1.0)
    with pytest.raises(ValueError, match=match):
        fa.ragged_paged_attention(*(x[k] for k in ARGS), implementation="cpu", **kw)


def test_scales_with_a_float_cache_and_mixed_cache_dtypes_are_refused() -> None:
    x = _inputs(SCENARIOS["gqa4_mixed"], "float32", seed=3, ks=1.0, vs=1.0)
    floats = [x["float_k_cache"] if k == "k_cache" else x["float_v_cache"] if k == "v_cache" else x[k] for k in ARGS]
    with pytest.raises(ValueError, match="float8_e4m3fn caches only"):
        fa.ragged_paged_attention(*floats, implementation="cpu", k_scale=0.5)
    mixed = [x["float_k_cache"] if k == "k_cache" else x[k] for k in ARGS]
    with pytest.raises(ValueError, match="float32, float32, float32, float32, float8_e4m3fn"):
        fa.ragged_paged_attention(*mixed, implementation="cpu")


def test_v3_face_takes_an_fp8_fused_cache() -> None:
    sc = SCENARIOS["gqa4_mixed"]
    ks, vs = 0.25, 0.5
    x = _inputs(sc, "bfloat16", seed=4, ks=ks, vs=vs)
    fused = fuse_kv_cache(x["k_cache"], x["v_cache"], jnp.zeros(
        (sc.num_pages, sc.page_size, 2 * sc.hkv, 1, sc.d), jnp.float8_e4m3fn))
    dist = np.array([0, 0, x["num_seqs"]], np.int32)
    out, cache = fa.ragged_paged_attention_v3(
        x["queries"], x["keys"], x["values"], fused, x["kv_lens"], x["page_indices"].reshape(-1), x["cu_q_lens"],
        dist, sm_scale=1 / np.sqrt(sc.d), implementation="cpu", k_scale=ks, v_scale=vs)
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), k_scale=ks, v_scale=vs)[0]
    assert cache.dtype == jnp.float8_e4m3fn
    assert relative_error(np.asarray(out, np.float64), ref) <= tolerance("bfloat16")
