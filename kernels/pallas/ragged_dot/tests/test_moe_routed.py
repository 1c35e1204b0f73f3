"""moe_routed_experts: the residual add, the norm, the router and the experts as one op; its fused Pallas kernel
(interpret mode here) against a float64 NumPy layer built from scratch (the sum, the RMSNorm, the f64 logits' top k
and their softmax, each picked expert's gated MLP), on fresh random inputs: widths off the tiles, experts nobody
picks, one expert holding every row, a per-expert scale and a norm of the experts' own (Gemma 4), stacked layers
read at a traced layer, bf16 and f32; NaN kept to its row; the choice (plan_routing) with its reasons; bad
operands named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error

H, E, INTER, K = 128, 8, 40, 2  # I off the lane tile: the gate-first array's whole [H, 2I] block


def _f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _reference(x, r, nw, router, gu, down, k, scale=None, enw=None, eps=1e-6):
    """(out, total, the rows whose k-th and (k+1)-th logits are apart): the layer in float64 from the rounded sum."""
    total = _f64((x.astype(jnp.float32) + r.astype(jnp.float32)).astype(x.dtype)) if r is not None else _f64(x)
    rms = lambda w: total / np.sqrt(np.mean(total * total, 1, keepdims=True) + eps) * _f64(w)
    y = rms(nw)
    logits = y @ _f64(router)
    ids = np.argsort(-logits, 1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, 1)
    p = np.exp(top - top[:, :1])
    wts = p / p.sum(1, keepdims=True) * (_f64(scale)[ids] if scale is not None else 1.0)
    xin = y if enw is None else rms(enw)
    i = down.shape[1]
    g, d = _f64(gu), _f64(down)
    out = np.zeros_like(total)
    for t in range(total.shape[0]):
        for j in range(k):
            e = ids[t, j]
            hgu = xin[t] @ g[e]
            out[t] += wts[t, j] * ((_silu(hgu[:i]) * hgu[i:]) @ d[e])
    srt = -np.sort(-logits, 1)
    gap = 3e-2 if x.dtype == jnp.bfloat16 else 1e-3  # past the logits' rounding from the rows in x's dtype
    clear = srt[:, k - 1] - srt[:, k] > gap if k < logits.shape[1] else np.ones(len(total), bool)
    return out, total, clear


def _inputs(seed, t, dtype, layers=None, empty=False):
    rng = np.random.default_rng(seed)
    lead = () if layers is None else (layers,)
    arr = lambda shape, scale=1.0, shift=0.0: jnp.asarray(rng.standard_normal(shape) * scale + shift, dtype)
    x, r = arr((t, H), 2.0), arr((t, H))
    nw = arr((*lead, H), 0.2, 1.0)
    router = rng.standard_normal((*lead, H, E)) / np.sqrt(H) * 3.0
    if empty:  # experts 1 and 6 never win a slot
        router[..., [1, 6]] -= 50.0
    gu = arr((*lead, E, H, 2 * INTER), H ** -0.5)
    down = arr((*lead, E, INTER, H), INTER ** -0.5)
    return x, r, nw, jnp.asarray(router, dtype), gu, down, rng


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("t", "empty"), [(13, False), (16, True), (5, False), (33, False)])
def test_fused_kernel_matches_float64(dtype, t, empty):
    x, r, nw, router, gu, down, _ = _inputs(t * 7 + len(dtype), t, dtype, empty=empty)
    out, total = rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, residual=r, fuse=True,
                                       implementation="pallas", interpret=True)
    name, why = rd.last_implementation()
    assert name == "pallas" and "routing: one kernel" in why
    want, want_total, clear = _reference(x, r, nw, router, gu, down, K)
    assert out.shape == (t, H) and out.dtype == x.dtype and total.dtype == x.dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    np.testing.assert_array_equal(_f64(total), want_total)
    assert clear.mean() >= 0.6
    assert relative_error(np.asarray(out, np.float32)[clear], want[clear]) < TOL[dtype]


def test_one_expert_holding_every_row_and_the_two_op_path_agree():
    x, r, nw, router, gu, down, _ = _inputs(5, 24, "float32")
    xs = jnp.abs(x) + 0.1  # positive rows: expert 3's router column (1.0) tops every row, 5 (0.5) is second
    router = jnp.zeros_like(router).at[:, 3].set(1.0).at[:, 5].set(0.5)
    fused = rd.moe_routed_experts(xs, router, gu, down, top_k=1, norm_weight=jnp.abs(nw), residual=jnp.abs(r),
                                  fuse=True, implementation="pallas", interpret=True)
    two = rd.moe_routed_experts(xs, router, gu, down, top_k=1, norm_weight=jnp.abs(nw), residual=jnp.abs(r),
                                fuse=False, implementation="pallas", interpret=True)
    want, _, _ = _reference(xs, jnp.abs(r), jnp.abs(nw), router, gu, down, 1)
    for got in (fused[0], two[0]):
        assert relative_error(np.asarray(got), want) < TOL["float32"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma_form_scale_and_experts_own_norm_on_stacked_layers(dtype):
    """No residual (the stream already summed), a per-expert scale, the experts reading the stream under a norm of
    their own; weights stacked over 3 layers, read at a traced layer."""
    x, _, nw, router, gu, down, rng = _inputs(11, 20, dtype, layers=3)
    scale = jnp.asarray(rng.uniform(0.5, 2.0, (3, E)), jnp.float32)
    enw = jnp.asarray(rng.standard_normal((3, H)) * 0.2 + 1.0, dtype)
    run = jax.jit(lambda i: rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, expert_scale=scale,
                                                  expert_norm_weight=enw, layer=i, fuse=True,
                                                  implementation="pallas", interpret=True))
    (out,) = run(jnp.int32(2))
    want, _, clear = _reference(x, None, nw[2], router[2], gu[2], down[2], K, scale=scale[2], enw=enw[2])
    assert clear.mean() >= 0.6
    assert relative_error(np.asarray(out, np.float32)[clear], want[clear]) < TOL[dtype]
    (two,) = rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, expert_scale=scale,
                                   expert_norm_weight=enw, layer=2, implementation="xla")
    assert relative_error(np.asarray(two, np.float32)[clear], want[clear]) < TOL[dtype]


def test_nan_stays_in_its_row():
    x, r, nw, router, gu, down, _ = _inputs(3, 16, "float32")
    x = x.at[4, 7].set(jnp.nan)
    out, _ = rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, residual=r, fuse=True,
                                   implementation="pallas", interpret=True)
    bad = ~np.isfinite(np.asarray(out)).all(1)
    assert bad[4] and not np.delete(bad, 4).any()


def test_the_choice_and_its_reasons():
    """Fused where nearly every local expert is picked (Qwen3 at batch 64 on 8 devices), two ops where many stay
    unpicked (batch 1), off a TPU (unless asked), and a fused request that cannot run names why."""
    from ragged_dot._vendor.chips import CHIPS

    v6e = CHIPS["v6e"]
    fused, ti, why = rd.plan_routing(64, 2048, 768, 8, 128, 16, chip=v6e)
    assert fused and ti is not None and 768 % ti == 0 and "0.26 of 16" in why
    fused, ti, why = rd.plan_routing(1, 2048, 768, 8, 128, 16, chip=v6e)
    assert not fused and ti is None and "15.00 of 16" in why
    assert not rd.plan_routing(64, 2048, 768, 8, 128, 16, chip=None)[0]
    assert rd.plan_routing(64, 2048, 768, 8, 128, 16, chip=None, fuse=True)[0]
    assert not rd.plan_routing(64, 2048, 768, 8, 128, 16, chip=v6e, fuse=False)[0]
    with pytest.raises(ValueError, match="moe_routed_experts: fuse=True cannot run here: .*erf"):
        rd.plan_routing(64, 2048, 768, 8, 128, 16, chip=v6e, activation="gelu_exact", fuse=True)


def test_off_a_tpu_it_is_the_two_ops():
    x, r, nw, router, gu, down, _ = _inputs(2, 9, "float32")
    out, total = rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, residual=r)
    ids, wts, y, s = rd.moe_route(x, router, top_k=K, norm_weight=nw, residual=r)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(rd.moe_experts(y, ids, wts, gu, down)))
    np.testing.assert_array_equal(np.asarray(total), np.asarray(s))


@pytest.mark.parametrize(("change", "match"), [
    ({"router": (64, E)}, "x must be"),
    ({"down": (E + 1, INTER, H)}, "router's E=8"),
    ({"norm_weight": (64,)}, r"norm_weight must be \[128\]"),
    ({"expert_scale": (3,)}, r"expert_scale must be \[8\]"),
    ({"top_k": 9}, "top_k must be"),
])
def test_bad_operands_name_what_to_fix(change, match):
    x, r, nw, router, gu, down, _ = _inputs(1, 4, "float32")
    kw = {"top_k": K, "norm_weight": nw, "residual": r, "fuse": True, "implementation": "pallas", "interpret": True}
    if "router" in change:
        router = jnp.ones(change.pop("router"))
    if "down" in change:
        down = jnp.ones(change.pop("down"))
    for key in ("norm_weight", "expert_scale"):
        if key in change:
            kw[key] = jnp.ones(change.pop(key))
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        rd.moe_routed_experts(x, router, gu, down, **kw)


@pytest.mark.parametrize("fuse", [True, False])
def test_reduce_with_one_device_is_returned_as_is(fuse):
    """Without a mesh the partial sums are the sum; with the fused kernel and the two ops alike, after out."""
    x, r, nw, router, gu, down, rng = _inputs(4, 9, "float32")
    extra = jnp.asarray(rng.standard_normal((9, 24)), jnp.float32)
    out, total, summed = rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, residual=r,
                                               reduce_with=extra, fuse=fuse, implementation="pallas", interpret=True)
    np.testing.assert_array_equal(np.asarray(summed), np.asarray(extra))
    np.testing.assert_array_equal(np.asarray(total), np.asarray(x + r))
    want, _, clear = _reference(x, r, nw, router, gu, down, K)
    assert relative_error(np.asarray(out)[clear], want[clear]) < TOL["float32"]


def test_reduce_with_of_the_wrong_rows_names_what_to_fix():
    x, _, nw, router, gu, down, _ = _inputs(1, 4, "float32")
    with pytest.raises(ValueError, match=r"reduce_with must be \[1 x 4, N\]"):
        rd.moe_routed_experts(x, router, gu, down, top_k=K, norm_weight=nw, reduce_with=jnp.ones((8, 3)))


def _gelu(v):
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fuse", [True, False])
def test_the_whole_sandwich_block_with_a_shared_mlp(dtype, fuse):
    """Gemma 4's block after attention in one op: x under its own post-norm, added to the stream; the router, the
    experts and the shared MLP each reading the sum under its own norm; a per-expert scale; gelu (tanh); stacked
    over 2 layers at layer 1. Against float64: out, the new stream and the shared MLP's output."""
    x, r, nw, router, gu, down, rng = _inputs(21, 19, dtype, layers=2)
    arr = lambda shape, scale=1.0, shift=0.0: jnp.asarray(rng.standard_normal(shape) * scale + shift, dtype)
    xw, enw, snw = arr((2, H), 0.2, 1.0), arr((2, H), 0.2, 1.0), arr((2, H), 0.2, 1.0)
    scale = jnp.asarray(rng.uniform(0.5, 2.0, (2, E)), jnp.float32)
    sg, su, sd = arr((2, H, 24), H ** -0.5), arr((2, H, 24), H ** -0.5), arr((2, 24, H), 24 ** -0.5)
    out, total, shared = rd.moe_routed_experts(
        x, router, gu, down, top_k=K, norm_weight=nw, residual=r, expert_scale=scale, expert_norm_weight=enw,
        x_weight=xw, shared_experts=(sg, su, sd), shared_norm_weight=snw, activation="gelu", layer=1, fuse=fuse,
        implementation="pallas", interpret=True)
    f = lambda a: _f64(a)[1]
    eps = 1e-6
    rms = lambda v, w: v / np.sqrt(np.mean(v * v, 1, keepdims=True) + eps) * w
    xn = _f64(jnp.asarray(rms(_f64(x), f(xw)), dtype))  # x's post-norm, rounded to x's dtype as a kernel stores it
    want_total = _f64(jnp.asarray(xn + _f64(r), dtype))
    y = rms(want_total, f(nw))
    logits = y @ f(router)
    ids = np.argsort(-logits, 1, kind="stable")[:, :K]
    top = np.take_along_axis(logits, ids, 1)
    p = np.exp(top - top[:, :1])
    wts = p / p.sum(1, keepdims=True) * f(scale)[ids]
    xin, xs = rms(want_total, f(enw)), rms(want_total, f(snw))
    want = np.zeros_like(y)
    for t in range(len(y)):
        for j in range(K):
            hgu = xin[t] @ f(gu)[ids[t, j]]
            want[t] += wts[t, j] * ((_gelu(hgu[:INTER]) * hgu[INTER:]) @ f(down)[ids[t, j]])
    want_shared = (_gelu(xs @ f(sg)) * (xs @ f(su))) @ f(sd)
    srt = -np.sort(-logits, 1)
    clear = srt[:, K - 1] - srt[:, K] > (3e-2 if dtype == "bfloat16" else 1e-3)
    assert clear.mean() >= 0.6
    tol = TOL[dtype]
    assert relative_error(np.asarray(total, np.float32), want_total) < tol
    assert relative_error(np.asarray(shared, np.float32), want_shared) < tol
    assert relative_error(np.asarray(out, np.float32)[clear], want[clear]) < tol
