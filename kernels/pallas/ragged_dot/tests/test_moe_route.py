"""moe_route (interpreted Pallas and the XLA path) against NumPy float64: the top k by logits (ties to the lower
expert) and the softmax over those k, at Qwen3-30B-A3B's router (128 experts, top 8) and a small one, bf16 and f32,
tokens past the kernel's block; a stacked weight read at a layer (concrete, traced, clamped); NaN logits give NaN
weights; bad operands get one ValueError naming what to fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd

from kernel_hub.verify.numerics import relative_error, tolerance


def _reference(x, w, k):
    logits = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # stable: the lower expert first on ties
    top = np.take_along_axis(logits, ids, 1)
    p = np.exp(top - top[:, :1])
    return ids, p / p.sum(1, keepdims=True), logits


def _f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize(("tokens", "hidden", "experts", "k", "dtype"), [
    (64, 256, 128, 8, "bfloat16"),  # Qwen3-30B-A3B's routing (hidden cut for the interpreter)
    (300, 128, 16, 2, "float32"),   # tokens past the 256-token block
    (5, 128, 8, 8, "float32"),      # k = every expert
])
def test_matches_float64_reference(impl, tokens, hidden, experts, k, dtype):
    rng = np.random.default_rng(tokens + experts)
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), dtype)
    w = jnp.asarray(rng.standard_normal((hidden, experts)) / np.sqrt(hidden), dtype)
    ids, wts = rd.moe_route(x, w, top_k=k, implementation=impl)
    assert rd.last_implementation()[0] == impl
    assert ids.shape == wts.shape == (tokens, k) and ids.dtype == jnp.int32 and wts.dtype == jnp.float32
    want_ids, want_w, logits = _reference(_f64(x), _f64(w), k)
    # the picks agree wherever the k-th and (k+1)-th logits are apart by more than the inputs' rounding
    srt = -np.sort(-logits, 1)
    clear = (srt[:, k - 1] - srt[:, k] > 1e-3) if k < experts else np.ones(tokens, bool)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(np.sort(np.asarray(ids)[clear], 1), np.sort(want_ids[clear], 1))
    assert relative_error(np.asarray(wts)[clear], want_w[clear]) <= tolerance(dtype)
    np.testing.assert_allclose(np.asarray(wts).sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_ties_go_to_the_lower_expert_and_nan_stays_nan(impl):
    x = jnp.ones((3, 128), jnp.float32)
    w = jnp.zeros((128, 16), jnp.float32).at[:, 5].set(1.0).at[:, 9].set(1.0).at[:, 2].set(0.5)
    x = x.at[2, 0].set(jnp.nan)
    ids, wts = rd.moe_route(x, w, top_k=3, implementation=impl)
    np.testing.assert_array_equal(np.asarray(ids)[:2], [[5, 9, 2], [5, 9, 2]])
    np.testing.assert_allclose(np.asarray(wts)[0], np.exp([0, 0, -64]) / np.exp([0, 0, -64]).sum(), rtol=1e-6)
    assert np.isnan(np.asarray(wts)[2]).all() and np.all((np.asarray(ids)[2] >= 0) & (np.asarray(ids)[2] < 16))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_layer_reads_its_router_of_a_stack(impl):
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((16, 128)), jnp.float32)
    stack = jnp.asarray(rng.standard_normal((6, 128, 32)), jnp.float32)
    got = rd.moe_route(x, stack, top_k=4, layer=4, implementation=impl)
    one = rd.moe_route(x, stack[4], top_k=4, implementation=impl)
    for a, b in zip(got, one, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    traced = jax.jit(lambda i: rd.moe_route(x, stack, top_k=4, layer=i, implementation=impl)[0])
    np.testing.assert_array_equal(np.asarray(traced(jnp.int32(4))), np.asarray(got[0]))
    last = rd.moe_route(x, stack[5], top_k=4, implementation=impl)[0]
    np.testing.assert_array_equal(np.asarray(traced(jnp.int32(11))), np.asarray(last))  # clamped


@pytest.mark.parametrize(("x", "w", "kw", "match"), [
    ((4, 128), (64, 16), {"top_k": 2}, "x must be"),
    ((4, 128), (128, 16), {"top_k": 17}, "top_k must be"),
    ((4, 128), (128, 16), {"top_k": 2, "layer": 0}, "stacked over layers"),
    ((4, 128), (3, 128, 16), {"top_k": 2, "layer": 3}, r"layer must be in \[0, 3\)"),
])
def test_bad_operands_name_what_to_fix(x, w, kw, match):
    with pytest.raises(ValueError, match=match):
        rd.moe_route(jnp.ones(x), jnp.ones(w), **kw)


def test_no_tokens():
    ids, wts = rd.moe_route(jnp.zeros((0, 128)), jnp.ones((128, 16)), top_k=2)
    assert ids.shape == wts.shape == (0, 2)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize(("tokens", "dtype", "layers", "scaled"), [
    (64, "bfloat16", 20, False),   # Qwen3's post-attention norm + router, weights stacked over layers
    (300, "float32", None, True),  # tokens past the block, one layer, a per-expert scale (Gemma 4)
])
def test_the_norm_before_the_router_in_the_same_call(impl, tokens, dtype, layers, scaled):
    """moe_route(x, w, residual=r, norm_weight=n, expert_scale=s) -> (ids, weights, RMSNorm_n(x + r), x + r):
    the sum rounded to the dtype, the norm against float64, the routing of the normalised rows as moe_route gives
    it for them alone, each weight times its expert's scale."""
    rng = np.random.default_rng(tokens)
    arr = lambda shape, scale=1.0, shift=0.0: jnp.asarray(rng.standard_normal(shape) * scale + shift, dtype)
    h, e, k = 256, 64, 4
    lead = () if layers is None else (layers,)
    x, r = arr((tokens, h), 2.0), arr((tokens, h))
    w, nw = arr((*lead, h, e), h ** -0.5), arr((*lead, h), 0.3, 1.0)
    sc = jnp.asarray(rng.uniform(0.5, 2.0, (*lead, e)), jnp.float32) if scaled else None
    at = None if layers is None else 13
    pick = (lambda a: a) if layers is None else (lambda a: a[13])
    ids, wts, y, total = rd.moe_route(x, w, top_k=k, layer=at, norm_weight=nw, residual=r, expert_scale=sc,
                                      eps=1e-6, implementation=impl)
    assert rd.last_implementation()[0] == impl and y.dtype == total.dtype == x.dtype
    want_total = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(total, np.float32), np.asarray(want_total, np.float32))
    t64 = _f64(want_total)
    ref_y = t64 / np.sqrt(np.mean(t64 * t64, axis=1, keepdims=True) + 1e-6) * _f64(pick(nw))
    assert relative_error(np.asarray(y, np.float32), ref_y) <= tolerance(dtype)
    alone_ids, alone_w = rd.moe_route(y, pick(w), top_k=k, implementation=impl)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(alone_ids))
    factor = np.asarray(pick(sc))[np.asarray(ids)] if scaled else 1.0
    np.testing.assert_allclose(np.asarray(wts), np.asarray(alone_w) * factor, rtol=1e-6)
    # y is what the router read: its float64 routing picks the same experts where the picks are clear
    want_ids, _, logits = _reference(_f64(y), _f64(pick(w)), k)
    srt = -np.sort(-logits, 1)
    clear = srt[:, k - 1] - srt[:, k] > 1e-3
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(np.sort(np.asarray(ids)[clear], 1), np.sort(want_ids[clear], 1))


@pytest.mark.parametrize(("change", "match"), [
    ({"residual": jnp.zeros((4, 128)), "norm_weight": None}, "residual needs norm_weight="),
    ({"residual": jnp.zeros((3, 128))}, "residual needs norm_weight= and x's shape"),
    ({"norm_weight": jnp.ones(64)}, r"norm_weight must be \[128\]"),
    ({"expert_scale": jnp.ones(8)}, r"expert_scale must be \[16\]"),
    ({"eps": -1.0}, "eps must be >= 0"),
])
def test_bad_norm_operands_name_what_to_fix(change, match):
    kw = {"top_k": 2, "norm_weight": jnp.ones(128), "residual": jnp.zeros((4, 128))}
    kw.update(change)
    with pytest.raises(ValueError, match=f"moe_route: {match}"):
        rd.moe_route(jnp.zeros((4, 128)), jnp.zeros((128, 16)), **kw)
