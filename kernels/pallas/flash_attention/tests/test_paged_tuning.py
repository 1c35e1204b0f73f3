"""Which blocks a ragged paged attention call runs with: config, then the environment variable, then the release's
tuned table for the arrays' chip, then a VMEM-safe fallback; and every tuned entry is a geometry the compile gate
compiles on its generation."""

from __future__ import annotations

import flash_attention as fa
import pytest
from flash_attention.config import paged_vmem_bytes, vmem_plan
from flash_attention.paged_cases import compile_scenarios
from flash_attention.paged_checks import PagedShapes
from flash_attention.paged_tuned_table import TUNED
from flash_attention.paged_tuning import ENV_VAR, PagedBlocksError, choose_blocks, length_bucket, tuning_key

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
    rows = got.block_q * MIXED.group
    assert paged_vmem_bytes(rows, got.pages_per_block * 128, 4, 128, 2) <= vmem_plan(kind)[0] * 5 // 8


def test_every_tuned_entry_is_a_compile_gate_case_on_its_generation() -> None:
    """The compile gate compiles the fwd:paged model cases on every generation: an entry whose key no model case
    has would ship unchecked."""
    gate_keys = set()
    for sc, tags in compile_scenarios():
        if "model" not in tags:
            continue
        sh = PagedShapes(sc.tokens, sc.hq, sc.hkv, sc.d, sc.num_pages, sc.page_size, sc.max_seqs, sc.pages_per_seq,
                         1.0, sc.window, None)
        gate_keys |= {tuning_key(gen, sh, "bfloat16", "bfloat16") for gen in KINDS}
    assert len(gate_keys) == 3 * 3  # three generations x three geometries (decode and mixed share a key)
    for key, (block_q, ppb) in TUNED.items():
        assert key in gate_keys, key
        assert block_q >= 1 and ppb >= 1
