"""The output projection in the paged attention call (`out_proj=`): on the decode schedule the Pallas kernel
multiplies every item's finished rows by the projection in its last grid step, so an attention layer's o_proj is no
op of its own; every other path projects after the attention with one XLA dot.

Checked against the float64 reference times the weight in float64 (fresh random inputs, a padding row, an empty
slot, a window; float32 and bfloat16), folded against unfolded, a stacked weight read at a traced layer, the
compiled program's shape (one Pallas call, no dot outside it), and the errors."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import kernel_name
from flash_attention.paged import project_out
from flash_attention.paged_cases import PagedScenario, features, paged_inputs
from jax.extend.core import jaxprs_in_params

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
#: One new token per sequence (a padding row, an empty slot, lengths across pages, a window), 4/2 heads x 128.
DECODE = PagedScenario("decode", ((1, 1), (1, 16), (1, 17), (1, 45), (1, 30)), hq=4, hkv=2, d=128, page_size=16,
                       pages_per_seq=3, pad=1, empty_slots=1, window=30)
BLOCKS = fa.AttentionConfig(paged_block_q=1, paged_pages_per_block=2)
N = 256  # output features, not a multiple of the heads x head dim


def _weight(rng, dtype, *lead) -> jax.Array:
    return jnp.asarray(rng.standard_normal((*lead, DECODE.hq * DECODE.d, N)) / np.sqrt(DECODE.hq * DECODE.d), dtype)


def _expected(x: dict, w: np.ndarray) -> np.ndarray:
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(DECODE))[0]
    rows = np.asarray(ref, np.float64).reshape(DECODE.tokens, -1)
    return rows @ np.asarray(w, np.float64)


def _call(x: dict, w, implementation: str = "pallas", config: fa.AttentionConfig = BLOCKS, **kw):
    return fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(DECODE), out_proj=w,
                                     config=config, implementation=implementation, **kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("implementation", ["pallas", "cpu", "xla"])
def test_projected_output_matches_the_float64_reference(dtype: str, implementation: str) -> None:
    x = paged_inputs(DECODE, dtype, seed=21)
    w = _weight(np.random.default_rng(3), dtype)
    out, kc, vc = _call(x, w, implementation)
    assert out.shape == (DECODE.tokens, N) and out.dtype == jnp.dtype(dtype)
    got = np.asarray(out, np.float64)
    assert np.isfinite(got).all()
    assert relative_error(got, _expected(x, w)) <= tolerance(dtype)
    np.testing.assert_array_equal(got[DECODE.tokens - DECODE.pad:], 0.0)  # the padding row projects to 0
    plain = fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(DECODE), config=BLOCKS,
                                      implementation="cpu")  # the XLA scatter's caches: the same bits
    np.testing.assert_array_equal(np.asarray(kc), np.asarray(plain[1]))  # the caches as without the projection
    np.testing.assert_array_equal(np.asarray(vc), np.asarray(plain[2]))


@pytest.mark.parametrize("items", [1, 4])
def test_folded_projection_is_the_unfolded_output_times_the_weight(items: int) -> None:
    """The kernel rounds each row to the output's dtype before multiplying, as a stored output is: the same numbers
    as projecting the unprojected output, up to the f32 accumulation's order."""
    x = paged_inputs(DECODE, "bfloat16", seed=22)
    w = _weight(np.random.default_rng(4), "bfloat16")
    cfg = fa.AttentionConfig(paged_block_q=1, paged_pages_per_block=2, paged_items=items)
    folded = np.asarray(_call(x, w, config=cfg)[0], np.float64)
    assert f"{items} items per step" in fa.last_tuning()
    plain = fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(DECODE), config=cfg,
                                      implementation="pallas")[0]
    after = np.asarray(project_out(plain, w, None), np.float64)
    assert np.abs(folded - after).max() <= 2 ** -7 * np.abs(after).max()  # one bf16 rounding apart at most


def test_the_decode_call_is_one_pallas_call_with_no_dot_outside() -> None:
    x = paged_inputs(DECODE, "bfloat16", seed=23)
    w = _weight(np.random.default_rng(5), "bfloat16")
    args = [jnp.asarray(x[k]) for k in ARGS[:-1]]
    jaxpr = jax.make_jaxpr(lambda *a: fa.ragged_paged_attention(
        *a, out_proj=w, **features(DECODE), config=BLOCKS, implementation="pallas", interpret=True))(*args)
    eqns = list(_outside(jaxpr.jaxpr))
    calls = [kernel_name(e) for e in eqns if e.primitive.name == "pallas_call"]
    assert calls == ["ragged_paged_attention_store"]
    assert not [e for e in eqns if e.primitive.name == "dot_general"]


def _outside(jaxpr):
    for e in jaxpr.eqns:
        yield e
        if e.primitive.name != "pallas_call":
            for sub in jaxprs_in_params(e.params):
                yield from _outside(sub)


@pytest.mark.parametrize("chip", ["v5e", "v6e", "v7x", "v4", "v5p"])
def test_the_fold_needs_vmem_and_one_core(chip) -> None:
    from flash_attention.config import fold_out_proj, vmem_plan

    budget = vmem_plan({"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v7x": "TPU7x", "v4": "TPU v4",
                        "v5p": "TPU v5"}[chip])[0]
    folds, why = fold_out_proj(64, 4, 128, 2048, 2, budget, chip)  # one v6e-8 device's share of Qwen3's o_proj
    assert folds == (chip not in ("v4", "v5p")), why  # a megacore's two cores split the items instead
    big, why = fold_out_proj(64, 32, 128, 2048, 2, budget, chip)  # a whole chip's 16 MiB projection
    assert not big and "after the kernel" in why


def test_a_stacked_weight_is_read_at_a_traced_layer() -> None:
    x = paged_inputs(DECODE, "float32", seed=24)
    rng = np.random.default_rng(6)
    layers = 3
    w = _weight(rng, "float32", layers)
    stacks = [jnp.asarray(rng.standard_normal((layers, *x[k].shape)), jnp.float32) for k in ("k_cache", "v_cache")]

    @jax.jit
    def step(ks, vs, layer):
        return fa.ragged_paged_attention(*(x[k] for k in ARGS[:3]), ks, vs, *(x[k] for k in ARGS[5:]), layer=layer,
                                         sinks=x["sinks"], **features(DECODE), out_proj=w, config=BLOCKS,
                                         implementation="pallas", interpret=True)

    out = step(*stacks, jnp.int32(1))[0]
    one = {**x, "k_cache": stacks[0][1], "v_cache": stacks[1][1]}
    assert relative_error(np.asarray(out, np.float64), _expected(one, w[1])) <= tolerance("float32")


@pytest.mark.parametrize(("shape", "dtype", "match"), [
    ((4 * 128 + 1, N), "float32", r"\[512, N\]"),
    ((512,), "float32", r"\[512, N\]"),
    ((512, N), "bfloat16", "queries' dtype float32"),
])
def test_a_bad_weight_is_one_clear_error(shape, dtype, match) -> None:
    x = paged_inputs(DECODE, "float32", seed=25)
    with pytest.raises(ValueError, match=match):
        _call(x, jnp.zeros(shape, dtype))


def test_a_stacked_weight_must_match_the_cache_stacks() -> None:
    x = paged_inputs(DECODE, "float32", seed=26)
    stacks = [jnp.stack([jnp.asarray(x[k])] * 2) for k in ("k_cache", "v_cache")]
    with pytest.raises(ValueError, match=r"\[2, 512, N\]"):
        fa.ragged_paged_attention(*(x[k] for k in ARGS[:3]), *stacks, *(x[k] for k in ARGS[5:]), layer=0,
                                  out_proj=jnp.zeros((3, 512, N), jnp.float32))
