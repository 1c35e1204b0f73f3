"""The prefill forward's precision: bf16 inputs run their dots at DEFAULT precision (one MXU pass, P cast to bf16
before P.V, f32 accumulation), f32 inputs at HIGHEST; both against the f32 HIGHEST dense oracle on fresh random
inputs, with block sizes that leave interior key chunks (run without the mask) beside diagonal and window-edge ones.
And the unmasked chunks' range: every (row, key) it claims is one the mask keeps, on an exhaustive small grid."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import dense_oracle, make_inputs
from flash_attention.pallas_flash import FlashStatic, _mask, full_key_range

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

CFG = fa.AttentionConfig(block_q=256, block_kv=512, chunk_q=128, chunk_kv=128, heads_per_block=2)


def _dots(fn, *args):
    """(operand dtypes, precision) of every dot_general the traced call runs, kernels' bodies included."""
    found = []

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "dot_general":
                found.append((tuple(str(v.aval.dtype) for v in e.invars), e.params.get("precision")))
            for p in e.params.values():
                for sub in p if isinstance(p, (list, tuple)) else (p,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_prefill_dots_precision_by_dtype(dtype):
    q, k, v = make_inputs(np.random.default_rng(0), 1, 4, 2, 384, 384, 64, dtype)
    dots = _dots(lambda a, b, c: fa.flash_attention(a, b, c, causal=True, implementation="pallas", config=CFG),
                 q, k, v)
    assert dots
    for operands, precision in dots:
        if dtype == "bfloat16":
            assert operands == ("bfloat16", "bfloat16") and precision is None, (operands, precision)
        else:
            assert operands == ("float32", "float32"), operands
            assert all(p == jax.lax.Precision.HIGHEST for p in precision), precision


SCENARIOS = [
    ("causal_gqa", dict(causal=True)),
    ("window", dict(causal=True, sliding_window=200)),
    ("noncausal_ragged", dict(ragged=True)),
    ("softcap_sinks", dict(causal=True, logits_soft_cap=20.0, sinks=True)),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name, feats", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_prefill_against_f32_highest_oracle(name, feats, dtype):
    rng = np.random.default_rng(abs(hash((name, dtype))) % 2**32)
    b, hq, hkv, s, d = 2, 4, 2, 400, 64
    q, k, v = make_inputs(rng, b, hq, hkv, s, s, d, dtype)
    kw = {k_: v_ for k_, v_ in feats.items() if k_ not in ("ragged", "sinks")}
    if feats.get("sinks"):
        kw["sinks"] = jnp.asarray(rng.standard_normal(hq), jnp.float32)
    if feats.get("ragged"):
        kw["q_lengths"] = jnp.asarray([s, 250], jnp.int32)
        kw["kv_lengths"] = jnp.asarray([333, s], jnp.int32)
    out = fa.flash_attention(q, k, v, implementation="pallas", config=CFG, **kw)
    want = dense_oracle(q, k, v, **kw)
    err = rel_error(out, want)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert err <= TOL[dtype], f"{name} {dtype}: {err}"


@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 5), (False, 7)])
def test_unmasked_chunks_are_inside_the_mask(causal, window):
    st = FlashStatic(causal=causal, sm_scale=1.0, window=window, soft_cap=None, has_sinks=False, block_q=8,
                     block_kv=8, group=1)
    rows_n, cols = 4, np.arange(24)
    for q_len in (0, 3, 9, 16):
        for kv_len in (q_len, q_len + 5, 20):
            for r0 in range(0, 16, 2):
                lo, hi = (int(x) for x in full_key_range(jnp.int32(q_len), jnp.int32(kv_len), jnp.int32(r0), rows_n,
                                                         st))
                rows = r0 + np.arange(rows_n)[:, None]
                keep = np.asarray(_mask(jnp.asarray(rows), jnp.asarray(cols[None]), q_len, kv_len, st))
                claimed = (cols >= lo) & (cols <= hi)
                assert keep[:, claimed].all(), (q_len, kv_len, r0, lo, hi)
                if r0 + rows_n <= q_len:  # and it claims every key all rows keep
                    assert (keep.all(0) == claimed).all(), (q_len, kv_len, r0, lo, hi)
