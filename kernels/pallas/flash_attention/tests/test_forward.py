"""Prefill forward: every implementation and feature against the NumPy float64 reference."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import make_inputs

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

# heads_per_block 4: the forward takes gcd(4, group) query heads per step (1, 2 and 4 across the scenarios)
BLOCKS = fa.AttentionConfig(block_q=128, block_kv=128, cpu_block_q=64, heads_per_block=4)

# (name, b, hq, hkv, sq, skv, d, features): small, but >128 so the kernels walk several blocks
SCENARIOS = [
    ("causal_gqa_d128", 2, 4, 2, 256, 256, 128, dict(causal=True)),
    ("noncausal_mha_d64", 1, 2, 2, 136, 200, 64, {}),
    ("mqa_window_d64", 1, 4, 1, 256, 256, 64, dict(causal=True, sliding_window=70)),
    ("softcap_sinks_d256", 1, 2, 1, 160, 160, 256, dict(causal=True, logits_soft_cap=10.0, sinks=True)),
    ("ragged_bottom_right_d64", 3, 2, 1, 130, 260, 64, dict(causal=True, ragged=True)),
    ("everything_d128", 2, 4, 2, 140, 270, 128,
     dict(causal=True, sliding_window=90, logits_soft_cap=15.0, sinks=True, ragged=True, sm_scale=0.2)),
]


def _features(rng: np.random.Generator, b: int, hq: int, sq: int, skv: int, feats: dict) -> dict:
    kw = {k: v for k, v in feats.items() if k not in ("sinks", "ragged")}
    if feats.get("sinks"):
        kw["sinks"] = jnp.asarray(rng.standard_normal(hq) * 2, jnp.float32)
    if feats.get("ragged"):
        ql = rng.integers(1, sq + 1, size=b)
        ql[0] = 0  # an empty sequence: every row is 0
        kw["q_lengths"] = jnp.asarray(ql, jnp.int32)
        kw["kv_lengths"] = jnp.asarray(rng.integers(1, skv + 1, size=b), jnp.int32)
    return kw


def _kw_np(kw: dict) -> dict:
    return {k: (np.asarray(v) if isinstance(v, jax.Array) else v) for k, v in kw.items()}


# the dense "xla" path shares the cpu path's math: two scenarios cover it
PAIRS = [(s, impl) for s in SCENARIOS for impl in ("cpu", "pallas")]
PAIRS += [(s, "xla") for s in SCENARIOS if s[0] in ("causal_gqa_d128", "everything_d128")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("scenario, impl", PAIRS, ids=[f"{s[0]}-{impl}" for s, impl in PAIRS])
def test_prefill_matches_reference(scenario, impl, dtype):
    name, b, hq, hkv, sq, skv, d, feats = scenario
    rng = np.random.default_rng(abs(hash((name, dtype, impl))) % 2**32)
    q, k, v = make_inputs(rng, b, hq, hkv, sq, skv, d, dtype)
    kw = _features(rng, b, hq, sq, skv, feats)
    out = fa.flash_attention(q, k, v, implementation=impl, config=BLOCKS, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    expected = fa.reference_attention(q, k, v, **_kw_np(kw))
    assert rel_error(out, expected) <= TOL[dtype]


# inner chunks smaller than the blocks: one key block holding the whole (padded) key sequence (the chunk state is
# per chunk), and several key blocks (the state lives across grid steps); sizes not multiples of the blocks
CHUNKED = [
    ("whole_kv", fa.AttentionConfig(block_q=256, block_kv=512, chunk_q=128, chunk_kv=128, heads_per_block=2)),
    ("kv_blocks", fa.AttentionConfig(block_q=256, block_kv=256, chunk_q=128, chunk_kv=128, heads_per_block=2)),
]
CHUNK_SCENARIOS = [
    ("causal_sinks_gqa", 1, 4, 2, 300, 300, 64, dict(causal=True, sinks=True)),
    ("window_ragged_softcap", 3, 2, 1, 260, 390, 64,
     dict(causal=True, sliding_window=150, ragged=True, logits_soft_cap=12.0, sinks=True)),
    ("noncausal_padded_d128", 1, 2, 2, 200, 330, 128, {}),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cfg_name, cfg", CHUNKED, ids=[c[0] for c in CHUNKED])
@pytest.mark.parametrize("scenario", CHUNK_SCENARIOS, ids=[s[0] for s in CHUNK_SCENARIOS])
def test_chunked_forward_matches_reference(scenario, cfg_name, cfg, dtype):
    name, b, hq, hkv, sq, skv, d, feats = scenario
    rng = np.random.default_rng(abs(hash((name, cfg_name, dtype))) % 2**32)
    q, k, v = make_inputs(rng, b, hq, hkv, sq, skv, d, dtype)
    kw = _features(rng, b, hq, sq, skv, feats)
    out = fa.flash_attention(q, k, v, implementation="pallas", config=cfg, **kw)
    expected = fa.reference_attention(q, k, v, **_kw_np(kw))
    assert rel_error(out, expected) <= TOL[dtype]


def test_nan_never_passes():
    expected = np.ones((2, 3))
    assert rel_error(np.array([[1.0, np.nan, 1.0], [1.0, 1.0, 1.0]]), expected) == float("inf")
    q, k, v = make_inputs(np.random.default_rng(0), 1, 2, 2, 16, 16, 64, "float32")
    out = fa.flash_attention(q.at[0, 0, 3, 0].set(jnp.nan), k, v, implementation="pallas", config=BLOCKS)
    assert not rel_error(out, fa.reference_attention(q, k, v)) <= 1.0


def test_causal_is_bottom_right_aligned():
    """Sq < Skv: the last query sees every key, the first sees Skv - Sq + 1 of them."""
    q, k, v = make_inputs(np.random.default_rng(1), 1, 1, 1, 4, 10, 64, "float32")
    out = fa.flash_attention(q, k, v, causal=True, implementation="cpu")
    last = fa.flash_attention(q[:, :, -1:], k, v, implementation="cpu")
    first = fa.flash_attention(q[:, :, :1], k[:, :, :7], v[:, :, :7], implementation="cpu")
    np.testing.assert_allclose(out[:, :, -1:], last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, :, :1], first, rtol=1e-5, atol=1e-6)


def test_padding_rows_and_empty_windows_are_zero():
    q, k, v = make_inputs(np.random.default_rng(2), 2, 2, 1, 24, 24, 64, "float32")
    ql, kl = jnp.array([10, 24], jnp.int32), jnp.array([5, 0], jnp.int32)
    for impl in ("cpu", "xla", "pallas"):
        out = np.asarray(fa.flash_attention(q, k, v, causal=True, q_lengths=ql, kv_lengths=kl, implementation=impl))
        assert np.all(out[0, :, 10:] == 0) and np.all(out[1] == 0)
        assert np.all(out[0, :, :5] == 0)  # q_len > kv_len: bottom-right causal leaves the first rows keyless
        assert np.all(np.abs(out[0, :, 5:10]).sum(-1) > 0)


def test_jit_and_default_implementation():
    q, k, v = make_inputs(np.random.default_rng(3), 1, 2, 1, 32, 32, 64, "float32")
    f = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=True, implementation="pallas"))
    expected = fa.reference_attention(q, k, v, causal=True)
    assert rel_error(f(q, k, v), expected) <= 1e-4
    assert rel_error(fa.flash_attention(q, k, v, causal=True), expected) <= 1e-4  # cpu on this machine


def test_implementations_for():
    assert fa.implementations_for("tpu") == ("pallas", "xla")
    assert fa.implementations_for("cpu") == ("cpu", "xla")
    assert fa.implementations_for("cuda") == ("xla",)


@pytest.mark.parametrize(
    "shapes, kw",
    [
        (((1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), {}),  # heads not a multiple
        (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64)), {}),  # k/v mismatch
        (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), dict(sliding_window=0)),
        (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), dict(implementation="cuda")),
    ],
)
def test_bad_arguments_raise(shapes, kw):
    q, k, v = (jnp.zeros(s, jnp.float32) for s in shapes)
    with pytest.raises(ValueError):
        fa.flash_attention(q, k, v, **kw)


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), -1.0, 0.0, "x"])
def test_soft_cap_must_be_finite_and_positive_in_every_entry(cap):
    """An infinite cap turns every logit into inf/inf = NaN: refused by name in prefill and decode, JAX and torch."""
    q, k = jnp.zeros((1, 2, 8, 64), jnp.float32), jnp.zeros((1, 2, 8, 64), jnp.float32)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        fa.flash_attention(q, k, k, logits_soft_cap=cap)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        fa.decode_attention(q[:, :, 0], k, k, jnp.full((1,), 8, jnp.int32), logits_soft_cap=cap)
    torch = pytest.importorskip("torch")
    from flash_attention import torch_api

    tq, tk = torch.zeros(1, 2, 8, 64), torch.zeros(1, 2, 8, 64)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        torch_api.flash_attention(tq, tk, tk, logits_soft_cap=cap)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        torch_api.decode_attention(tq[:, :, 0], tk, tk, torch.full((1,), 8, dtype=torch.int32), logits_soft_cap=cap)
