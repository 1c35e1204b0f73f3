"""The decode step's math on CPU at a tiny geometry of each seed model (Qwen3-MoE: one layer; Gemma 4: a sliding
and a global layer, sandwich norms, shared expert, tied and scaled embedding, soft cap) against an independent
float64 NumPy decode step: the K/V each layer writes into its cache and the greedy next token."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import kernel_hub as kh  # noqa: E402
from tpu_cost_model import decode_models as dm  # noqa: E402
from tpu_cost_model import decode_step as ds  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = dm.PAGE


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta, fraction):
    d = x.shape[-1]
    rot = int(d * fraction) // 2 * 2
    half = rot // 2
    freq = theta ** (-np.arange(half) * 2.0 / rot)
    ang = pos[:, None, None] * freq
    a, b = x[..., :half], x[..., half:rot]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang), x[..., rot:]], -1)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _act(name, x):
    return x / (1 + np.exp(-x)) if name == "silu" else _gelu(x)


def reference_step(m, params, caches, tokens, kv_lens, pages):
    """float64 NumPy: (next tokens, the K and V rows written per layer)."""
    f = lambda a: np.asarray(a, np.float64)
    emb = f(params["embed"])
    h = emb[tokens] * (math.sqrt(m.hidden) if m.embed_scale else 1.0)
    pos = kv_lens - 1
    written = []
    for g in range(m.groups):
        for p, kind in enumerate(m.pattern):
            lw = {k: f(v[g]) for k, v in params["layers"][p].items()}
            kc, vc = (f(c[g]).copy() for c in caches[p])
            b, d = h.shape[0], kind.head_dim
            x = _rms(h, lw["attn_norm"], m.eps)
            # one device: the fused projection's columns are [query heads | KV heads (| V heads)]
            nq, nkv = m.q_heads * d, kind.kv_heads * d
            wq, wk, wv = (lw["wqkv"][:, :nq], lw["wqkv"][:, nq:nq + nkv],
                          lw["wqkv"][:, nq:nq + nkv] if kind.k_eq_v else lw["wqkv"][:, nq + nkv:])
            assert lw["wqkv"].shape[1] == nq + nkv * (1 if kind.k_eq_v else 2)
            q = _rms((x @ wq).reshape(b, -1, d), lw["q_norm"], m.eps)
            kraw = (x @ wk).reshape(b, -1, d)
            k = _rms(kraw, lw["k_norm"], m.eps)
            v = (x @ wv).reshape(b, -1, d)
            if m.v_norm:
                v = _rms(v, 1.0, m.eps)
            q, k = _rope(q, pos, kind.rope_theta, kind.rotary_fraction), _rope(k, pos, kind.rope_theta,
                                                                              kind.rotary_fraction)
            group = q.shape[1] // k.shape[1]
            scale = m.attention_scale if m.attention_scale is not None else 1 / math.sqrt(d)
            o = np.zeros_like(q)
            for s in range(b):
                kc[pages[s, pos[s] // PAGE], pos[s] % PAGE] = k[s]
                vc[pages[s, pos[s] // PAGE], pos[s] % PAGE] = v[s]
                seen = [t for t in range(pos[s] + 1) if kind.window is None or t > pos[s] - kind.window]
                keys = np.stack([kc[pages[s, t // PAGE], t % PAGE] for t in seen])  # [S, Hkv, D]
                vals = np.stack([vc[pages[s, t // PAGE], t % PAGE] for t in seen])
                for hq in range(q.shape[1]):
                    logits = keys[:, hq // group] @ q[s, hq] * scale
                    w = np.exp(logits - logits.max())
                    o[s, hq] = (w / w.sum()) @ vals[:, hq // group]
            written.append((k, v))
            out = o.reshape(b, -1) @ lw["wo"]
            if m.sandwich_norms:
                out = _rms(out, lw["attn_post_norm"], m.eps)
            h = h + out
            x = _rms(h, lw["ff_norm"], m.eps)
            r = _rms(h, 1.0, m.eps) * lw["router_scale"] * m.hidden ** -0.5 if m.sandwich_norms else x
            logits = r @ lw["router"]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            ids = np.argsort(-probs, axis=-1)[:, : m.top_k]
            wts = np.take_along_axis(probs, ids, -1)
            wts /= wts.sum(-1, keepdims=True)
            if m.sandwich_norms:
                wts = wts * lw["expert_scale"][ids]
                shared = (_gelu(x @ lw["ws_gate"]) * (x @ lw["ws_up"])) @ lw["ws_down"]
                shared = _rms(shared, lw["shared_post_norm"], m.eps)
                x = _rms(h, lw["moe_pre_norm"], m.eps)
            inter = m.moe_intermediate
            moe = np.zeros_like(h)
            for t in range(b):
                for j in range(m.top_k):
                    e = ids[t, j]
                    gu = x[t] @ lw["w_gate_up"][e]
                    moe[t] += wts[t, j] * ((_act(m.activation, gu[:inter]) * gu[inter:]) @ lw["w_down"][e])
            if m.sandwich_norms:
                h = h + _rms(_rms(moe, lw["moe_post_norm"], m.eps) + shared, lw["ff_post_norm"], m.eps)
            else:
                h = h + moe
    x = _rms(h, f(params["final_norm"]), m.eps)
    logits = x @ (emb if m.tied_embeddings else f(params["lm_head"])).T
    if m.logit_softcap:
        logits = np.tanh(logits / m.logit_softcap) * m.logit_softcap
    return logits.argmax(-1), written, np.sort(logits, -1)[:, -2:]


def routed_experts(rd):
    """The step's route_moe on moe_routed_experts' fused Pallas kernel, interpreted."""
    def route_moe(x, residual, norm_w, router, k, eps, gu, dn, activation, mesh, layer, expert_scale=None,
                  expert_norm=None, x_weight=None, shared=None, shared_norm=None):
        return rd.moe_routed_experts(x, router, gu, dn, top_k=k, norm_weight=norm_w, residual=residual, eps=eps,
                                     expert_scale=expert_scale, expert_norm_weight=expert_norm, x_weight=x_weight,
                                     shared_experts=shared, shared_norm_weight=shared_norm, activation=activation,
                                     mesh=mesh, expert_axis=ds.AXIS, layer=layer, fuse=True, implementation="pallas",
                                     interpret=True)

    return route_moe


@pytest.fixture(scope="module")
def kernels():
    folders = {k: ROOT / "kernels" / "pallas" / k for k in ("rms_norm", "flash_attention", "ragged_dot")}
    return {k: kh.get_local_kernel(v) for k, v in folders.items()}


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "gemma4_26b_a4b"])
@pytest.mark.parametrize("path", ["hub", "hub_dense", "hub_apart", "hub_routed", "default_compiled"])
def test_decode_step_matches_numpy(kernels, name, path):
    m = dm.tiny(dm.MODELS[name])
    batch, cache = 3, 2 * PAGE
    params, caches = ds.init_inputs(m, 1, batch, cache, jnp.float32, jax.random.key(7))
    # one sequence at its first position, one crossing a page boundary, one past the sliding window; pages shuffled
    kv_lens = np.array([1, PAGE + 1, 2 * PAGE - 3], np.int32)
    pages = np.random.default_rng(3).permutation(batch * 2).astype(np.int32).reshape(batch, 2)
    tokens = np.array([0, 17, m.vocab - 1], np.int32)
    rms, fa, rd = kernels["rms_norm"], kernels["flash_attention"], kernels["ragged_dot"]
    kern = (ds.transformers_kernels(rd) if path == "default_compiled"
            else ds.hub_kernels(rms, fa, rd, formulation="dense" if path == "hub_dense" else None))
    # the hub's attention front is one call (attention_front), its router one call with the norm before it;
    # apart: the norm, the projection, qk_norm_rope; the norm, then the router
    assert (kern.front is not None) == (kern.norm_route is not None) == (path != "default_compiled")
    assert kern.attention_projects == (path != "default_compiled")  # the o-projection inside the attention call
    if path == "hub_apart":
        kern = kern._replace(front=None, norm_route=None)
    if path == "hub_routed":  # the router inside the experts' kernel (interpreted here), as the step runs on a TPU
        assert kern.route_moe is None  # chosen on a TPU only
        kern = kern._replace(route_moe=routed_experts(rd), fuses_routing=lambda *_: True)
    mesh = Mesh(np.array(jax.devices()[:1]), (ds.AXIS,))
    step = jax.jit(lambda p, c, t, k, pg: ds.decode_step(p, c, t, k, pg, model=m, kernels=kern, mesh=mesh))
    nxt, new = step(params, caches, tokens, kv_lens, pages)
    want, written, top2 = reference_step(m, params, caches, tokens, kv_lens, pages)
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-4), "a near-tie in the reference: pick another seed"
    np.testing.assert_array_equal(np.asarray(nxt), want)
    pos = kv_lens - 1
    for layer, (k, v) in enumerate(written):
        p, g = layer % len(m.pattern), layer // len(m.pattern)
        got_k = np.asarray(new[p][0][g])[pages[np.arange(batch), pos // PAGE], pos % PAGE]
        got_v = np.asarray(new[p][1][g])[pages[np.arange(batch), pos // PAGE], pos % PAGE]
        assert np.all(np.isfinite(got_k)) and np.all(np.isfinite(got_v))
        np.testing.assert_allclose(got_k, k, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(got_v, v, rtol=2e-4, atol=2e-4)


def test_an_older_release_without_the_fused_forms_runs_their_parts_apart():
    """hub_kernels reads each fused form from the release's signatures: a release whose rms_norm lacks the sandwich
    form, with no attention_front and a router without the norm gets the unfused ops, and the sandwich norm is then
    two calls whose result is the float64 sandwich."""
    from types import SimpleNamespace

    calls = []

    def rms_norm(x, w, eps, layer=None, residual=None, implementation=None, interpret=None):
        calls.append(residual is not None)
        x = np.asarray(x, np.float64) + (0.0 if residual is None else np.asarray(residual, np.float64))
        out = _rms(x, np.asarray(w, np.float64), eps)
        return out if residual is None else (out, x)

    def moe_route(x, w, top_k, layer=None, implementation=None, interpret=None):
        raise AssertionError("not called")

    old = ds.hub_kernels(SimpleNamespace(rms_norm=rms_norm), SimpleNamespace(), SimpleNamespace(moe_route=moe_route))
    assert old.front is None and old.norm_route is None and not old.attention_projects
    rng = np.random.default_rng(0)
    x, r, w, wx = rng.standard_normal((4, 8)), rng.standard_normal((4, 8)), rng.random(8) + 0.5, rng.random(8) + 0.5
    normed, summed = old.rms_norm(x, w, 1e-6, None, r, x_weight=wx)
    inner = _rms(x, wx, 1e-6) + r
    np.testing.assert_allclose(summed, inner, rtol=1e-12)
    np.testing.assert_allclose(normed, _rms(inner, w, 1e-6), rtol=1e-12)
    assert calls == [False, True]  # the inner norm alone, then the add and the outer norm

    def front(x, norm, wqkv, qw, kw, cos, sin, residual=None, layer=None, **_):
        raise AssertionError("not called")

    def fused_route(x, w, top_k, layer=None, norm_weight=None, residual=None, eps=None, expert_scale=None, **_):
        raise AssertionError("not called")

    new = ds.hub_kernels(SimpleNamespace(rms_norm=rms_norm, attention_front=front), SimpleNamespace(),
                         SimpleNamespace(moe_route=fused_route))
    assert new.front is not None and new.norm_route is not None
