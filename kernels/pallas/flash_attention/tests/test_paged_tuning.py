"""Which blocks a ragged paged attention call runs with: config, then the environment variable, then the release's
tuned table for the arrays' chip, then a VMEM-safe fallback; and every tuned entry is a geometry the compile gate
compiles on its generation."""

from __future__ import annotations

import flash_attention as fa
import numpy as np
import pytest
from flash_attention.config import (
    DECODE_ITEMS,
    DECODE_UNROLL,
    decode_items,
    paged_step_vmem_bytes,
    paged_vmem_bytes,
    vmem_plan,
)
from flash_attention.paged_cases import SMALL, compile_scenarios, features, paged_inputs
from flash_attention.paged_checks import PagedShapes
from flash_attention.paged_tuned_table import TUNED
from flash_attention.paged_tuning import (
    ENV_VAR,
    PagedBlocksError,
    choose_blocks,
    entry_vmem_bytes,
    key_text,
    length_bucket,
    tuning_key,
)

#: Qwen3-30B-A3B decode: 64 sequences x 8192 positions, pages of 128, 32/4 heads x 128.
QWEN = PagedShapes(64, 32, 4, 128, 4096, 128, 64, 64, 1.0, None, None)
MIXED = PagedShapes(2044, 32, 4, 128, 4096, 128, 64, 64, 1.0, None, None)
KINDS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v7x": "TPU7x"}


def _choose(sh, kind, table, **kw):
    budget = vmem_plan(kind)[0]
    return choose_blocks(sh, "bfloat16", "bfloat16", 2, kind, budget, table=table, **kw)


def test_length_bucket_rounds_up_to_a_power_of_two() -> None:
    assert [length_bucket(n) for n in (1, 128, 129, 8192, 8193)] == [128, 128, 256, 8192, 16384]


def test_the_table_entry_for_the_arrays_chip_wins_over_the_fallback() -> None:
    table = {tuning_key("v6e", MIXED, "bfloat16", "bfloat16"): (8, 4)}
    got = _choose(MIXED, "TPU v6 lite", table, environ={})
    assert (got.block_q, got.pages_per_block) == (8, 4) and got.source.startswith("tuned v6e/128/")
    other = _choose(MIXED, "TPU v5 lite", table, environ={})  # another chip: not its entry
    assert other.source.startswith("fallback")


def test_decode_only_batches_keep_one_token_per_item() -> None:
    table = {tuning_key("v6e", QWEN, "bfloat16", "bfloat16"): (8, 4)}
    got = _choose(QWEN, "TPU v6 lite", table, environ={})
    assert (got.block_q, got.pages_per_block) == (1, 4)


@pytest.mark.parametrize("kind", ["TPU v5 lite", "TPU v6 lite", "TPU7x"])
@pytest.mark.parametrize(("tokens", "kv_heads", "block_kv"), [(64, 1, 768), (64, 4, 768), (64, 4, 2048), (3, 1, 768),
                                                              (1, 2, 256), (64, 8, 2048)])
def test_decode_items_are_the_most_that_fit_every_limit(kind, tokens, kv_heads, block_kv) -> None:
    budget = vmem_plan(kind)[0]
    items, why = decode_items(tokens, 4, block_kv, kv_heads, 128, 2, budget)
    per_item = paged_vmem_bytes(4, block_kv, kv_heads, 128, 2)

    def fits(n: int) -> bool:
        return n <= DECODE_ITEMS and n * kv_heads <= DECODE_UNROLL and n * per_item <= budget * 5 // 8

    assert items >= 1 and items & (items - 1) == 0 and f"{items} decode item(s)" in why
    assert items == 1 or (fits(items) and items // 2 < tokens)
    assert not (fits(2 * items) and items < tokens)  # the next power of two breaks a limit or outnumbers the tokens


def test_a_decode_batch_shares_grid_steps_and_config_overrides_the_count() -> None:
    sh = PagedShapes(64, 4, 1, 128, 384, 128, 64, 6, 1.0, None, None)  # one device's share of Qwen3 at 768 positions
    got = _choose(sh, "TPU v6 lite", {}, environ={})
    assert (got.block_q, got.items) == (1, 8)
    assert _choose(sh, "TPU v6 lite", {}, environ={}, config=fa.AttentionConfig(paged_items=2)).items == 2
    assert _choose(MIXED, "TPU v6 lite", {}, environ={}).items == 1  # a mixed batch: one item a step


def test_an_interpreted_decode_call_takes_one_item_a_step_unless_config_says() -> None:
    sh = PagedShapes(64, 4, 1, 128, 384, 128, 64, 6, 1.0, None, None)
    compiled = _choose(sh, "TPU v6 lite", {}, environ={})
    got = _choose(sh, "TPU v6 lite", {}, environ={}, interpreted=True)
    assert got.items == 1 and compiled.items > 1
    assert (got.block_q, got.pages_per_block) == (compiled.block_q, compiled.pages_per_block)  # blocks as compiled
    assert got.source.endswith("one decode item a step, interpreted")
    cfg = fa.AttentionConfig(paged_items=4)
    assert _choose(sh, "TPU v6 lite", {}, environ={}, config=cfg, interpreted=True).items == 4


def test_an_interpreted_call_reports_its_one_item() -> None:
    """The kernel's own call off a TPU (interpreted) names the choice; the same call with paged_items= takes them."""
    (sc,) = [s for s in SMALL if s.name == "decode_mqa_softcap_sinks"]
    x = paged_inputs(sc, "float32", 1)
    args = [x[k] for k in ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens",
                           "num_seqs")]
    one = fa.ragged_paged_attention(*args, sinks=x["sinks"], **features(sc), implementation="pallas")
    assert " 1 items per step " in fa.last_tuning() and fa.last_tuning().endswith("interpreted)")
    two = fa.ragged_paged_attention(*args, sinks=x["sinks"], **features(sc), implementation="pallas",
                                    config=fa.AttentionConfig(paged_items=2))
    assert " 2 items per step " in fa.last_tuning()
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_env_overrides_the_table_and_config_overrides_both() -> None:
    table = {tuning_key("v6e", MIXED, "bfloat16", "bfloat16"): (8, 4)}
    env = {ENV_VAR: "16,2"}
    got = _choose(MIXED, "TPU v6 lite", table, environ=env)
    assert (got.block_q, got.pages_per_block, got.source) == (16, 2, f"env {ENV_VAR}")
    cfg = fa.AttentionConfig(paged_pages_per_block=32)
    got = _choose(MIXED, "TPU v6 lite", table, environ=env, config=cfg)
    assert (got.block_q, got.pages_per_block, got.source) == (16, 32, "config")


@pytest.mark.parametrize("text", ["16", "a,b", "0,4", "4,-1", "1,2,3"])
def test_a_bad_env_override_is_one_clear_error(text: str) -> None:
    with pytest.raises(PagedBlocksError, match=ENV_VAR):
        _choose(MIXED, "TPU v6 lite", {}, environ={ENV_VAR: text})


@pytest.mark.parametrize("kind", [None, "TPU v4", "TPU v5 lite", "TPU7x"])
def test_the_fallback_fits_the_chips_vmem(kind) -> None:
    got = _choose(MIXED, kind, {}, environ={})
    assert got.source.startswith("fallback")
    vmem = paged_step_vmem_bytes(got.block_q, MIXED.group, got.pages_per_block * 128, 4, 128, 2)
    assert vmem <= vmem_plan(kind)[0] * 5 // 8


def test_every_8k_tuned_entry_is_a_compile_gate_case_on_its_generation() -> None:
    """The compile gate compiles the fwd:paged model cases (8192 positions) on every generation: an 8k entry whose key
    no model case has would ship unchecked by it (other buckets were compiled by the sweep, said in their origin)."""
    gate_keys = set()
    for sc, tags in compile_scenarios():
        if "model" not in tags:
            continue
        sh = PagedShapes(sc.tokens, sc.hq, sc.hkv, sc.d, sc.num_pages, sc.page_size, sc.max_seqs, sc.pages_per_seq,
                         1.0, sc.window, None)
        gate_keys |= {tuning_key(gen, sh, "bfloat16", "bfloat16") for gen in KINDS}
    assert len(gate_keys) == 3 * 3  # three generations x three geometries (decode and mixed share a key)
    eight_k = [key for key in TUNED if key[-1] == 8192]
    assert eight_k and all(key in gate_keys for key in eight_k), eight_k


@pytest.mark.parametrize("key", sorted(TUNED))
def test_every_shipped_entry_fits_its_chips_vmem_and_says_where_it_came_from(key) -> None:
    entry = TUNED[key]
    assert key[0] in KINDS and key[-1] == length_bucket(key[-1])
    assert entry.block_q >= 1 and entry.pages_per_block >= 1
    budget = vmem_plan(KINDS[key[0]])[0] * 5 // 8
    assert entry_vmem_bytes(key, entry.block_q, entry.pages_per_block, 2) <= budget
    assert entry.origin.startswith(f"modeled {key[0]}:") and "band" in entry.origin and "compiled yes" in entry.origin


def test_the_shipped_entry_is_what_a_call_on_its_chip_runs() -> None:
    key = ("v5e", 128, "bfloat16", "bfloat16", 32, 4, 128, 8192)
    assert key in TUNED
    got = _choose(MIXED, "TPU v5 lite", TUNED, environ={})
    assert got.source == "tuned " + key_text(key)
    assert (got.block_q, got.pages_per_block) == (TUNED[key].block_q, TUNED[key].pages_per_block)
    assert got.sub_q == min(TUNED[key].block_q, 32)  # the mixed batch's mean new tokens: 32


@pytest.mark.parametrize("gen", ["v6e", "v7x"])
def test_a_v6e_or_v7x_call_runs_its_generations_shipped_entry(gen) -> None:
    """The device kind picks the generation: the same shapes get v6e's entry on a v6e, v7x's on a v7x."""
    key = (gen, 128, "bfloat16", "bfloat16", 32, 4, 128, 8192)
    assert key in TUNED
    got = _choose(MIXED, KINDS[gen], TUNED, environ={})
    assert got.source == "tuned " + key_text(key)
    assert (got.block_q, got.pages_per_block) == (TUNED[key].block_q, TUNED[key].pages_per_block)
    assert got.sub_q == min(TUNED[key].block_q, 32)  # the mixed batch's mean new tokens: 32
    decode = _choose(QWEN, KINDS[gen], TUNED, environ={})
    assert decode.source == got.source and (decode.block_q, decode.pages_per_block) == (1, TUNED[key].pages_per_block)


def test_every_model_geometry_has_an_8k_entry_on_v6e() -> None:
    """The gate's model cases (8192 positions) on v6e run tuned blocks, not the fallback."""
    for hq, hkv, d in ((32, 4, 128), (16, 8, 256), (16, 2, 512)):
        assert ("v6e", 128, "bfloat16", "bfloat16", hq, hkv, d, 8192) in TUNED


@pytest.mark.parametrize("gen", ["v6e", "v7x"])
def test_a_v6e_or_v7x_shape_outside_the_table_falls_back_with_the_reason(gen) -> None:
    other_length = PagedShapes(2044, 32, 4, 128, 4096, 128, 64, 3, 1.0, None, None)  # 384 positions: bucket 512
    got = _choose(other_length, KINDS[gen], TUNED, environ={})
    assert got.source.startswith(f"fallback: no tuned entry for {gen}/128/bfloat16/bfloat16/32/4/128/512;")
    f32 = choose_blocks(MIXED, "float32", "float32", 4, KINDS[gen], vmem_plan(KINDS[gen])[0], environ={})
    assert f32.source.startswith(f"fallback: no tuned entry for {gen}/128/float32/float32/32/4/128/8192;")


def test_shapes_outside_the_table_fall_back_with_the_reason() -> None:
    other_length = PagedShapes(2044, 32, 4, 128, 4096, 128, 64, 3, 1.0, None, None)  # 384 positions: bucket 512
    got = _choose(other_length, "TPU v5 lite", TUNED, environ={})
    assert got.source.startswith("fallback: no tuned entry for v5e/128/bfloat16/bfloat16/32/4/128/512;")
    unknown = _choose(MIXED, None, TUNED, environ={})
    assert unknown.source.startswith("fallback: no tuned blocks for device kind None;")


def test_an_entry_past_the_vmem_budget_is_not_used() -> None:
    key = tuning_key("v5e", MIXED, "bfloat16", "bfloat16")
    got = _choose(MIXED, "TPU v5 lite", {key: (256, 64)}, environ={})
    assert got.source.startswith("fallback: tuned entry") and "passes 5/8 of the VMEM budget" in got.source
    vmem = paged_step_vmem_bytes(got.block_q, MIXED.group, got.pages_per_block * 128, 4, 128, 2)
    assert vmem <= vmem_plan("TPU v5 lite")[0] * 5 // 8


def test_a_tuned_block_q_is_kept_and_its_sub_blocks_capped_at_the_batchs_mean() -> None:
    """Short chunks compute no padding (sub-blocks of the mean); the items still hold the tuned block_q tokens."""
    short = PagedShapes(256, 32, 4, 128, 4096, 128, 64, 64, 1.0, None, None)  # 4 new tokens per sequence
    key = tuning_key("v6e", short, "bfloat16", "bfloat16")
    got = _choose(short, "TPU v6 lite", {key: (128, 8)}, environ={})
    assert (got.block_q, got.pages_per_block, got.sub_q) == (128, 8, 4) and got.source.startswith("tuned")
    got = _choose(MIXED, "TPU v6 lite", {tuning_key("v6e", MIXED, "bfloat16", "bfloat16"): (128, 8)}, environ={})
    assert (got.block_q, got.sub_q) == (128, 32)


def test_a_mixed_steps_vmem_counts_its_rows_in_whole_sub_blocks_and_its_temporaries_per_sub_block() -> None:
    """block_q 48 keeps two whole sub-blocks of rows (as 64 does); block_q 256 keeps 256 x G rows of m / l / acc but
    its [rows, block_kv] temporaries are one 32-token sub-block's, so it needs far less than 256 x G rows would."""
    step = lambda bq: paged_step_vmem_bytes(bq, 8, 1024, 4, 128, 2)
    assert step(48) == step(64) > step(32)
    assert step(1) == paged_vmem_bytes(8, 1024, 4, 128, 2)
    assert step(32) == paged_vmem_bytes(32 * 8, 1024, 4, 128, 2)
    whole = paged_vmem_bytes(256 * 8, 1024, 4, 128, 2)
    assert step(256) == whole - 3 * (256 * 8 - 32 * 8) * 1024 * 4
