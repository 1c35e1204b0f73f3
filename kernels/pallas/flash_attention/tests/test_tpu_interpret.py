"""The kernels under the TPU simulator: NaN-filled fresh memory, shuffled parallel axes, two simulated
cores and the race detector; and proof that a race turns into an error."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import dense_oracle, make_inputs
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.verify.numerics import relative_error as rel_error

BLOCKS = fa.AttentionConfig(block_q=128, block_kv=128, decode_block_kv=128, heads_per_block=2)


@pytest.fixture(autouse=True)
def _reset_simulator():
    yield
    pltpu.reset_tpu_interpret_mode_state()


def test_prefill_forward_and_backward_race_free():
    rng = np.random.default_rng(11)
    q, k, v = make_inputs(rng, 2, 2, 1, 130, 200, 64, "float32")
    sinks = jnp.asarray(rng.standard_normal(2), jnp.float32)
    kw = dict(causal=True, sliding_window=90, logits_soft_cap=10.0,
              q_lengths=jnp.asarray([130, 50], jnp.int32), kv_lengths=jnp.asarray([200, 70], jnp.int32))
    params = fa.race_checking_params(seed=3)
    out = fa.flash_attention(q, k, v, sinks=sinks, implementation="pallas", interpret=params, config=BLOCKS, **kw)
    np_kw = {key: (np.asarray(val) if isinstance(val, jax.Array) else val) for key, val in kw.items()}
    assert rel_error(out, fa.reference_attention(q, k, v, sinks=np.asarray(sinks), **np_kw)) <= 1e-4

    do = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * do)
    got = jax.grad(loss(lambda q, k, v: fa.flash_attention(
        q, k, v, sinks=sinks, implementation="pallas", interpret=params, config=BLOCKS, **kw)), (0, 1, 2))(q, k, v)
    assert not fa.races_found()  # under grad the result is traced: check the detector by hand
    want = jax.grad(loss(lambda q, k, v: dense_oracle(q, k, v, sinks=sinks, **np_kw)), (0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        assert rel_error(g, np.asarray(w)) <= 1e-4


def test_decode_race_free():
    rng = np.random.default_rng(12)
    q = jnp.asarray(rng.standard_normal((4, 4, 64)), jnp.float32)
    kc, vc = (jnp.asarray(rng.standard_normal((4, 2, 384, 64)), jnp.float32) for _ in range(2))
    lens = jnp.asarray([384, 129, 1, 0], jnp.int32)
    out = fa.decode_attention(q, kc, vc, lens, sliding_window=200, implementation="pallas",
                              interpret=fa.race_checking_params(seed=4), config=BLOCKS)
    assert rel_error(out, fa.reference_decode_attention(q, kc, vc, lens, sliding_window=200)) <= 1e-4


@pytest.mark.parametrize("transposed", [True, False])
def test_decode_cache_layouts_race_free(transposed):
    """Both cache orders under the simulator, with a window narrower than the cache (the grid spans only the
    blocks a window can touch, offset per sequence)."""
    rng = np.random.default_rng(13)
    q = jnp.asarray(rng.standard_normal((3, 4, 64)), jnp.float32)
    kc, vc = (jnp.asarray(rng.standard_normal((3, 2, 640, 64)), jnp.float32) for _ in range(2))
    lens = jnp.asarray([640, 300, 0], jnp.int32)
    cfg = dataclasses.replace(BLOCKS, decode_kv_transposed=transposed)
    out = fa.decode_attention(q, kc, vc, lens, sliding_window=150, implementation="pallas",
                              interpret=fa.race_checking_params(seed=5), config=cfg)
    assert rel_error(out, fa.reference_decode_attention(q, kc, vc, lens, sliding_window=150)) <= 1e-4


def test_a_detected_race_raises():
    """Two simulated cores write one output block: the detector sees it and raise_if_races raises."""
    params = dataclasses.replace(fa.race_checking_params(), num_cores_or_threads=2)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    racy = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))], out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=params,
    )
    with pytest.raises(fa.RaceDetectedError, match="race"):
        fa.run_race_checked(racy, jnp.ones((16, 128), jnp.float32))
