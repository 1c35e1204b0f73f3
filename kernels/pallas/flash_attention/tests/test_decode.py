"""Decode: one query per sequence against a ragged KV cache, every implementation vs the reference."""

from __future__ import annotations

import flash_attention as fa
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

SMALL_BLOCKS = fa.AttentionConfig(decode_block_kv=128)


def _problem(rng, b, hq, hkv, s, d, dtype):
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    lens = rng.integers(1, s + 1, size=b)
    lens[0], lens[-1] = s, 0  # a full cache and an empty slot
    return arr(b, hq, d), arr(b, hkv, s, d), arr(b, hkv, s, d), jnp.asarray(lens, jnp.int32)


@pytest.mark.parametrize("impl", ["pallas", "cpu", "xla"])
@pytest.mark.parametrize(
    "dtype, hq, hkv, d, feats",
    [
        ("bfloat16", 8, 2, 64, dict(sinks=True, sliding_window=100)),
        ("float32", 4, 1, 128, dict(logits_soft_cap=20.0)),
        ("float32", 4, 4, 256, dict(sinks=True)),
    ],
)
def test_decode_matches_reference(impl, dtype, hq, hkv, d, feats):
    rng = np.random.default_rng(hq * d)
    q, kc, vc, lens = _problem(rng, 6, hq, hkv, 300, d, dtype)
    kw = {key: val for key, val in feats.items() if key != "sinks"}
    sinks = jnp.asarray(rng.standard_normal(hq), jnp.float32) if feats.get("sinks") else None
    out = fa.decode_attention(q, kc, vc, lens, sinks=sinks, implementation=impl, config=SMALL_BLOCKS, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    expected = fa.reference_decode_attention(q, kc, vc, lens, sinks=None if sinks is None else np.asarray(sinks), **kw)
    assert rel_error(out, expected) <= TOL[dtype]
    assert np.all(np.asarray(out[-1]) == 0)  # kv_len 0


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("window", [None, 130])
def test_decode_cache_orders_agree(transposed, window):
    """The kernel reads the cache as [D, S] or [S, D] blocks (XLA's TPU layout decides which by default): both
    match the reference, all kv heads per step, with and without a window-bounded grid."""
    rng = np.random.default_rng(9)
    q, kc, vc, lens = _problem(rng, 5, 8, 4, 640, 64, "float32")
    cfg = fa.AttentionConfig(decode_block_kv=128, decode_kv_transposed=transposed)
    out = fa.decode_attention(q, kc, vc, lens, sliding_window=window, implementation="pallas", config=cfg)
    expected = fa.reference_decode_attention(q, kc, vc, lens, sliding_window=window)
    assert rel_error(out, expected) <= TOL["float32"]


def test_decode_equals_last_prefill_row():
    rng = np.random.default_rng(5)
    q, kc, vc, lens = _problem(rng, 3, 4, 2, 256, 64, "float32")
    lens = jnp.asarray([256, 256, 256], jnp.int32)
    prefill = fa.flash_attention(q[:, :, None], kc, vc, causal=True, sliding_window=50, implementation="pallas")
    decode = fa.decode_attention(q, kc, vc, lens, sliding_window=50, implementation="pallas", config=SMALL_BLOCKS)
    np.testing.assert_allclose(decode, prefill[:, :, 0], rtol=2e-5, atol=2e-6)
