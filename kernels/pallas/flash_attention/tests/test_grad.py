"""Gradients (dq, dk, dv, d sinks) of the interpreted Pallas kernels and the cpu path against jax.grad of
a dense f32 HIGHEST-precision JAX oracle."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import dense_oracle, make_inputs

from kernel_hub.verify.numerics import relative_error as rel_error

BLOCKS = fa.AttentionConfig(block_q=128, block_kv=128, cpu_block_q=64)
# the forward in 128-chunks of 256-blocks, the backward in blocks of its own (128 x 128)
CHUNKED = fa.AttentionConfig(block_q=256, block_kv=256, chunk_q=128, chunk_kv=128, bwd_block_q=128,
                             bwd_block_kv=128, heads_per_block=2, cpu_block_q=64)

SCENARIOS = [
    ("causal_gqa_d128", 1, 4, 2, 200, 200, 128, dict(causal=True)),
    ("noncausal_mqa_d64", 1, 2, 1, 136, 200, 64, {}),
    ("window_softcap_sinks_ragged_d64", 2, 2, 1, 200, 260, 64,
     dict(causal=True, sliding_window=80, logits_soft_cap=8.0, sinks=True, ragged=True)),
    ("sinks_d256", 1, 2, 2, 130, 130, 256, dict(causal=True, sinks=True)),
]
GRAD_TOL = {"float32": 1e-4, "bfloat16": 3e-2}


def _grads(fn, q, k, v, sinks, do):
    def loss(q, k, v, sinks):
        return jnp.sum(fn(q, k, v, sinks).astype(jnp.float32) * do)

    argnums = (0, 1, 2, 3) if sinks is not None else (0, 1, 2)
    return jax.grad(loss, argnums=argnums)(q, k, v, sinks)


CASES = [(s, impl, BLOCKS) for s in SCENARIOS for impl in ("pallas", "cpu")]
CASES += [(s, "pallas", CHUNKED) for s in SCENARIOS if s[0] == "window_softcap_sinks_ragged_d64"]


@pytest.mark.parametrize("scenario, impl, config", CASES,
                         ids=[f"{s[0]}-{i}" + ("-chunked" if c is CHUNKED else "") for s, i, c in CASES])
def test_gradients_match_dense_oracle(scenario, impl, config):
    name, b, hq, hkv, sq, skv, d, feats = scenario
    rng = np.random.default_rng(len(name))
    # bf16 on the two scenarios whose name length is odd keeps the test short and covers both dtypes
    dtype = "bfloat16" if len(name) % 2 else "float32"
    q, k, v = make_inputs(rng, b, hq, hkv, sq, skv, d, dtype)
    do = jnp.asarray(rng.standard_normal((b, hq, sq, d)), jnp.float32)
    kw = {key: val for key, val in feats.items() if key not in ("sinks", "ragged")}
    sinks = jnp.asarray(rng.standard_normal(hq), jnp.float32) if feats.get("sinks") else None
    if feats.get("ragged"):
        kw["q_lengths"] = jnp.asarray([sq, sq // 3], jnp.int32)
        kw["kv_lengths"] = jnp.asarray([skv - 7, sq // 2], jnp.int32)

    got = _grads(lambda q, k, v, s: fa.flash_attention(q, k, v, sinks=s, implementation=impl, config=config, **kw),
                 q, k, v, sinks, do)
    oracle_kw = {key: (np.asarray(val) if isinstance(val, jax.Array) else val) for key, val in kw.items()}
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = _grads(lambda q, k, v, s: dense_oracle(q, k, v, sinks=s, **oracle_kw), *f32, sinks, do)
    for label, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want, strict=False):
        assert g.shape == w.shape
        err = rel_error(g, np.asarray(w))
        assert err <= GRAD_TOL[dtype], f"{label}: {err:.3e}"
