"""The decode schedule stores the new K/V itself: one Pallas call attends and writes, no separate write kernel.

Checked against the float64 reference and a NumPy scatter of the new rows: decode batches, sequences of several new
tokens on the decode schedule (other items' rows patched into the pages an item reads), causal and not, stacked
caches with a traced layer, fp8; under the TPU simulator with stores delayed until their wait (so a page read never
sees a row stored in the same call and the patch is what makes the numbers right) and with two cores and the race
detector on a decode batch."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import kernel_name
from flash_attention.paged_cases import PagedScenario, features, flat, paged_inputs
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import jaxprs_in_params

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
DECODE = fa.AttentionConfig(paged_block_q=1, paged_pages_per_block=2)

#: One new token per sequence, lengths across page boundaries, a padding row, an empty slot, a window.
DECODE_BATCH = PagedScenario("decode", ((1, 1), (1, 16), (1, 17), (1, 45)), hq=4, hkv=2, d=128, page_size=16,
                             pages_per_seq=3, pad=1, empty_slots=1, window=30)
#: Several new tokens in a sequence, run on the decode schedule (one item per token row).
SEVERAL = PagedScenario("several", ((3, 20), (1, 9), (5, 37)), hq=4, hkv=2, d=128, page_size=16, pages_per_seq=3)
SEVERAL_BIDIRECTIONAL = dataclasses.replace(SEVERAL, name="several_noncausal", causal=False)
#: Decode steps beside prefill chunks on the mixed schedule (items of up to 4 tokens): the decode steps' items store
#: their own rows, the chunks' rows are written before the call; an empty sequence, a padding row, a window.
MIXED_BATCH = PagedScenario("mixed", ((1, 20), (7, 30), (1, 17), (0, 5), (1, 45), (12, 40), (1, 1)), hq=4, hkv=2,
                            d=128, page_size=16, pages_per_seq=3, pad=1, window=30)
MIXED = fa.AttentionConfig(paged_block_q=4, paged_pages_per_block=2)


@pytest.fixture(autouse=True)
def _reset_simulator():
    yield
    pltpu.reset_tpu_interpret_mode_state()


def _call(sc: PagedScenario, x: dict, config: fa.AttentionConfig = DECODE, **kw):
    return fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc), config=config, **kw)


def _expected_caches(sc: PagedScenario, x: dict) -> tuple[np.ndarray, np.ndarray]:
    """The caches with every new row at its page and slot (NumPy, in the cache's dtype)."""
    kc, vc = (np.array(x[k]) for k in ("k_cache", "v_cache"))
    for i, (q_len, kv_len) in enumerate(sc.seqs):
        start = int(x["cu_q_lens"][i])
        for j in range(q_len):
            pos = kv_len - q_len + j
            page, slot = x["page_indices"][i, pos // sc.page_size], pos % sc.page_size
            kc[page, slot], vc[page, slot] = np.asarray(x["keys"])[start + j], np.asarray(x["values"])[start + j]
    return kc, vc


def _check(sc: PagedScenario, dtype: str, got, x: dict) -> None:
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc))
    out = np.asarray(got[0], np.float32)
    assert np.isfinite(out).all()
    assert relative_error(flat(*got), flat(*ref)) <= tolerance(dtype)
    kc, vc = _expected_caches(sc, x)
    np.testing.assert_array_equal(np.asarray(got[1]), kc)  # every new row stored, nothing else touched
    np.testing.assert_array_equal(np.asarray(got[2]), vc)


@pytest.mark.parametrize("sc", [DECODE_BATCH, SEVERAL, SEVERAL_BIDIRECTIONAL], ids=lambda sc: sc.name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_schedule_stores_and_attends_in_one_call(sc: PagedScenario, dtype: str) -> None:
    x = paged_inputs(sc, dtype, seed=5)
    got = _call(sc, x, implementation="pallas")
    assert fa.last_tuning().startswith("block_q 1,")
    _check(sc, dtype, got, x)


@pytest.mark.parametrize(("sc", "dtype", "items"), [(DECODE_BATCH, "bfloat16", 4), (SEVERAL, "float32", 3)],
                         ids=["decode-bf16-4", "several-f32-3"])
def test_several_items_a_grid_step_match_one_item_a_step(sc: PagedScenario, dtype: str, items: int) -> None:
    """Items sharing a grid step (their pages all requested before any computes; a count that does not divide the
    tokens pads the last step: 5 rows in steps of 4, 9 in steps of 3 with other items' rows patched) give the
    reference and the same bits as one item a step, caches included."""
    x = paged_inputs(sc, dtype, seed=11)
    runs = []
    for n in (1, items):
        got = _call(sc, x, dataclasses.replace(DECODE, paged_items=n), implementation="pallas")
        assert f"{n} items per step" in fa.last_tuning()
        _check(sc, dtype, got, x)
        runs.append([np.asarray(a) for a in got])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_decode_step_is_one_pallas_call_whose_caches_alias() -> None:
    sc = DECODE_BATCH
    x = paged_inputs(sc, "bfloat16", seed=1)
    args = [jnp.asarray(x[k]) for k in ARGS[:-1]]
    jaxpr = jax.make_jaxpr(lambda *a: fa.ragged_paged_attention(
        *a, **features(sc), config=DECODE, implementation="pallas", interpret=True))(*args)
    calls = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    assert len(calls) == 1, [str(e.params.get("name_and_src_info")) for e in calls]
    aliases = dict(calls[0].params["input_output_aliases"])
    assert sorted(aliases.values()) == [1, 2]  # both cache outputs are cache inputs


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        if e.primitive.name != "pallas_call":  # the kernel's own body is not the program around it
            for sub in jaxprs_in_params(e.params):
                yield from _eqns(sub)


@pytest.mark.parametrize(("sc", "items"), [(DECODE_BATCH, 4), (SEVERAL, 3), (SEVERAL_BIDIRECTIONAL, 1)],
                         ids=lambda v: getattr(v, "name", f"{v}_items"))
def test_stores_landing_only_at_their_wait_still_give_the_reference(sc: PagedScenario, items: int) -> None:
    """The simulator runs each DMA when it is waited on: an item's own store lands only when the item finishes,
    after it read its pages, so its own row (and, not causal, the rows later items store) must come from the
    patch; with several items a grid step (as on a TPU) an item's neighbours in the step have not stored theirs
    either."""
    x = paged_inputs(sc, "float32", seed=9)
    params = pltpu.InterpretParams(dma_execution_mode="on_wait", uninitialized_memory="nan")
    got = _call(sc, x, dataclasses.replace(DECODE, paged_items=items), implementation="pallas", interpret=params)
    assert f"{items} items per step" in fa.last_tuning()
    _check(sc, "float32", got, x)


@pytest.mark.parametrize("items", [1, 4])
def test_decode_batch_on_two_simulated_cores_is_race_free(items: int) -> None:
    sc = DECODE_BATCH
    x = paged_inputs(sc, "float32", seed=3)
    got = fa.run_race_checked(_call, sc, x, dataclasses.replace(DECODE, paged_items=items), implementation="pallas",
                              interpret=fa.race_checking_params(seed=2))
    _check(sc, "float32", got, x)


def test_stacked_caches_with_a_traced_layer() -> None:
    sc = DECODE_BATCH
    x = paged_inputs(sc, "bfloat16", seed=7)
    rng = np.random.default_rng(0)
    layers = 3
    stacks = [jnp.asarray(rng.standard_normal((layers, *x[k].shape)), jnp.bfloat16) for k in ("k_cache", "v_cache")]

    @jax.jit
    def step(ks, vs, layer):
        return fa.ragged_paged_attention(
            *(x[k] for k in ARGS[:3]), ks, vs, *(x[k] for k in ARGS[5:]), layer=layer, **features(sc),
            config=DECODE, implementation="pallas", interpret=True)

    out, ks, vs = step(*stacks, jnp.int32(1))
    one = {**x, "k_cache": stacks[0][1], "v_cache": stacks[1][1]}
    _check(sc, "bfloat16", (out, ks[1], vs[1]), one)
    for other in (0, 2):  # the other layers untouched
        np.testing.assert_array_equal(np.asarray(ks[other]), np.asarray(stacks[0][other]))
        np.testing.assert_array_equal(np.asarray(vs[other]), np.asarray(stacks[1][other]))


def test_fp8_cache_stores_the_quantized_rows_it_attends_to() -> None:
    sc = dataclasses.replace(DECODE_BATCH, page_size=32, seqs=((1, 1), (1, 32), (1, 33), (1, 90)))  # e4m3 tiles
    x = paged_inputs(sc, "bfloat16", seed=4)
    fp8 = {**x, **{k: jnp.asarray(x[k]).astype(jnp.float8_e4m3fn) for k in ("k_cache", "v_cache")}}
    got = _call(sc, fp8, implementation="pallas", k_scale=0.5, v_scale=2.0)
    ref_cpu = _call(sc, fp8, implementation="cpu", k_scale=0.5, v_scale=2.0)
    for a, b in zip(got[1:], ref_cpu[1:], strict=True):  # the same bytes stored as the XLA scatter stores
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    assert relative_error(np.asarray(got[0], np.float64), np.asarray(ref_cpu[0], np.float64)) <= 2e-2


@pytest.mark.parametrize("sc", [MIXED_BATCH, dataclasses.replace(MIXED_BATCH, name="mixed_noncausal", causal=False,
                                                                  window=None)], ids=lambda sc: sc.name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_schedule_stores_decode_rows_in_the_attention_call(sc: PagedScenario, dtype: str) -> None:
    x = paged_inputs(sc, dtype, seed=6)
    got = _call(sc, x, MIXED, implementation="pallas")
    assert fa.last_tuning().startswith("block_q 4,")
    _check(sc, dtype, got, x)


def test_mixed_decode_rows_landing_only_at_their_wait_still_give_the_reference() -> None:
    x = paged_inputs(MIXED_BATCH, "float32", seed=8)
    params = pltpu.InterpretParams(dma_execution_mode="on_wait", uninitialized_memory="nan")
    _check(MIXED_BATCH, "float32", _call(MIXED_BATCH, x, MIXED, implementation="pallas", interpret=params), x)


def test_mixed_batch_on_two_simulated_cores_is_race_free() -> None:
    x = paged_inputs(MIXED_BATCH, "float32", seed=2)
    got = fa.run_race_checked(_call, MIXED_BATCH, x, MIXED, implementation="pallas",
                              interpret=fa.race_checking_params(seed=1))
    _check(MIXED_BATCH, "float32", got, x)


def test_the_mixed_attention_call_aliases_the_zeroed_output_and_both_caches() -> None:
    sc = MIXED_BATCH
    x = paged_inputs(sc, "bfloat16", seed=1)
    args = [jnp.asarray(x[k]) for k in ARGS[:-1]]
    jaxpr = jax.make_jaxpr(lambda *a: fa.ragged_paged_attention(
        *a, **features(sc), config=MIXED, implementation="pallas", interpret=True))(*args)
    calls = {kernel_name(e): e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "pallas_call"}
    assert sorted(calls) == ["ragged_paged_attention_cache_write", "ragged_paged_attention_mixed_store"]
    aliases = dict(calls["ragged_paged_attention_mixed_store"].params["input_output_aliases"])
    assert sorted(aliases.values()) == [0, 1, 2]  # the zeroed output and both caches


def test_fp8_mixed_batch_stores_the_bytes_the_xla_scatter_stores() -> None:
    sc = dataclasses.replace(MIXED_BATCH, page_size=32, seqs=((1, 33), (9, 40), (1, 90), (1, 1)))  # e4m3 tiles
    x = paged_inputs(sc, "bfloat16", seed=4)
    fp8 = {**x, **{k: jnp.asarray(x[k]).astype(jnp.float8_e4m3fn) for k in ("k_cache", "v_cache")}}
    got = _call(sc, fp8, MIXED, implementation="pallas", k_scale=0.5, v_scale=2.0)
    ref_cpu = _call(sc, fp8, MIXED, implementation="cpu", k_scale=0.5, v_scale=2.0)
    for a, b in zip(got[1:], ref_cpu[1:], strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    assert relative_error(np.asarray(got[0], np.float64), np.asarray(ref_cpu[0], np.float64)) <= 2e-2
