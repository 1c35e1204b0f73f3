"""The wrapper against flash-attention-tpu's NumPy reference, its mask plan, dispatch trace and metadata
(no kernel_hub import)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokamax_attention as ta
from tokamax_attention._vendor.attention_reference import reference_mask
from tokamax_attention.masks import plan_mask

from kernel_hub.package.metadata import load_metadata
from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

KERNEL_DIR = Path(__file__).resolve().parents[1]

# (name, b, hq, hkv, sq, skv, d, features): both mask routes, GQA/MQA, every feature Tokamax has.
SCENARIOS = [
    ("causal_gqa", 2, 4, 2, 64, 64, 32, dict(causal=True)),
    ("noncausal_sq_ne_skv", 1, 2, 2, 50, 34, 16, {}),
    ("causal_window_mqa", 2, 4, 1, 64, 64, 16, dict(causal=True, sliding_window=20)),
    ("noncausal_window", 1, 2, 1, 48, 48, 16, dict(sliding_window=9)),
    ("softcap_scale", 1, 2, 1, 40, 40, 64, dict(causal=True, logits_soft_cap=5.0, sm_scale=0.3)),
    ("causal_sq_gt_skv", 2, 2, 1, 30, 20, 16, dict(causal=True)),
    ("ragged_causal", 3, 4, 2, 33, 75, 16, dict(causal=True, ragged=True)),
    ("ragged_noncausal", 3, 4, 2, 33, 75, 16, dict(ragged=True)),
]


def make(seed: int, b, hq, hkv, sq, skv, d, dtype, feats):
    rng = np.random.default_rng(seed)
    arr = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
    q, k, v = arr(b, hq, sq, d), arr(b, hkv, skv, d), arr(b, hkv, skv, d)
    kw = {key: val for key, val in feats.items() if key != "ragged"}
    if feats.get("ragged"):
        ql = rng.integers(1, sq + 1, b)
        ql[0] = 0  # an empty sequence: every row zero
        kl = np.maximum(ql, rng.integers(1, skv + 1, b))
        kw.update(q_lengths=jnp.asarray(ql, jnp.int32), kv_lengths=jnp.asarray(kl, jnp.int32))
    return q, k, v, kw


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["xla", "xla_chunked"])
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_prefill_matches_reference(sc, impl, dtype):
    name, *dims, feats = sc
    q, k, v, kw = make(len(name), *dims, dtype, feats)
    out = ta.flash_attention(q, k, v, implementation=impl, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_error(out, ta.reference_attention(q, k, v, **kw)) <= TOL[dtype]
    assert ta.last_implementation()[0] == impl


@pytest.mark.parametrize("window", [None, 5])
def test_decode_matches_reference(window):
    q, k, v, _ = make(7, 4, 8, 2, 64, 64, 16, "float32", {})
    kl = jnp.asarray([64, 10, 0, 33], jnp.int32)  # full, partial, an empty slot
    out = ta.decode_attention(q[:, :, 0], k, v, kl, sliding_window=window)
    ref = ta.reference_decode_attention(q[:, :, 0], k, v, kl, sliding_window=window)
    assert out.shape == (4, 8, 16) and rel_error(out, ref) <= 1e-4
    assert not np.asarray(out[2]).any()


def test_causal_is_bottom_right_aligned():
    """One query over 5 keys, causal: it is the last position, so it sees every key (top-left would see one)."""
    q, k, v, _ = make(1, 1, 1, 1, 1, 5, 8, "float32", {})
    out = ta.flash_attention(q, k, v, causal=True)
    assert rel_error(out, ta.reference_attention(q, k, v, causal=False)) <= 1e-5
    assert "explicit" in ta.last_implementation()[1]


def test_rows_without_keys_are_zero_not_mean_of_v():
    q, k, v, _ = make(2, 1, 2, 1, 6, 4, 8, "float32", {})
    out = np.asarray(ta.flash_attention(q, k, v, causal=True))  # rows 0, 1 sit before the first key
    assert not out[:, :, :2].any() and np.abs(out[:, :, 2:]).min() > 0


def test_gradients_match_a_dense_oracle():
    q, k, v, kw = make(3, 2, 4, 2, 24, 40, 16, "float32", dict(causal=True, sliding_window=12, ragged=True))
    ql, kl = np.asarray(kw["q_lengths"]), np.asarray(kw["kv_lengths"])
    mask = np.stack([reference_mask(int(ql[i]), int(kl[i]), 24, 40, causal=True, sliding_window=12)
                     for i in range(2)])[:, None]

    def dense(q, k, v):
        k, v = jnp.repeat(k, 2, axis=1), jnp.repeat(v, 2, axis=1)
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest") / 4.0
        p = jnp.where(mask, jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1), 0.0)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v, precision="highest")

    dout = jnp.asarray(np.random.default_rng(9).standard_normal(q.shape), jnp.float32)
    loss = lambda f: lambda *a: jnp.sum(f(*a) * dout)
    got = jax.grad(loss(lambda *a: ta.flash_attention(*a, **kw)), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(dense), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        assert rel_error(g, np.asarray(w, np.float64)) <= 1e-4


def test_nan_input_is_not_hidden():
    q, k, v, _ = make(4, 1, 2, 2, 16, 16, 8, "float32", {})
    out = ta.flash_attention(q, k.at[0, 0, 3, 0].set(jnp.nan), v)
    assert rel_error(out, ta.reference_attention(q, k, v)) == float("inf")


def test_sinks_raise_naming_the_feature():
    q, k, v, _ = make(5, 1, 2, 1, 8, 8, 8, "float32", {})
    with pytest.raises(NotImplementedError, match="sinks"):
        ta.flash_attention(q, k, v, sinks=jnp.zeros((2,)))


@pytest.mark.parametrize(
    ("sq", "skv", "causal", "window", "lengths", "mode"),
    [(8, 8, True, 4, False, "native"), (8, 8, False, None, True, "native"), (8, 6, False, None, False, "native"),
     (8, 6, True, None, False, "explicit"), (8, 8, True, None, True, "explicit"), (1, 9, False, 3, True, "explicit")],
)
def test_mask_plan(sq, skv, causal, window, lengths, mode):
    assert plan_mask(sq, skv, causal=causal, window=window, has_lengths=lengths).mode == mode


@pytest.mark.parametrize(("backend", "expected"), [("tpu", "mosaic"), ("cuda", "triton"), ("cpu", "xla")])
def test_resolve_follows_the_declared_order(backend, expected):
    assert ta.resolve_implementation(backend)[0] == expected


def test_resolve_rejects_with_a_reason():
    with pytest.raises(NotImplementedError, match=r"triton: skipped, needs cuda/gpu/rocm \(platform is cpu\)"):
        ta.resolve_implementation("cpu", "triton")
    known = "mosaic, triton, cudnn, xla, xla_chunked"
    with pytest.raises(ValueError, match=f"unknown attention implementation .pallas.; known: {known}"):
        ta.resolve_implementation("cpu", "pallas")


def test_metadata_pins_the_validated_pair():
    for variant in load_metadata(KERNEL_DIR).variants:
        assert dict(variant.requires) == {"jax": "==0.10.2", "tokamax": "==0.0.12"}
