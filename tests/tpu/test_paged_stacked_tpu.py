"""Ragged paged attention on KV caches stacked over layers, compiled by libtpu (the TPU environment, .venv-tpu): a
decode step's lax.scan over 4 layers (8 sequences x 2k positions, pages of 128, 8/4 heads x 128, a 512 window, bf16)
calls ragged_paged_attention(layer=i) with both stacks in the carry and donated; on v5e, v6e and v7x the outputs
alias both stacks and the temporaries stay under a tenth of one layer's cache, so no layer is sliced out or written
back (bench/paged_stacked.py's small case, whose fallback blocks compile in seconds; its model case, the same at
Qwen3-30B-A3B's 64 x 8k, is the bench's record, and tests/tpu/test_paged_tuning_gate_tpu.py compiles that
geometry's tuned entry on each generation). Skipped, with the reason, only where that environment is missing
(`make test` creates it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "paged_stacked.py"


@pytest.fixture(scope="module")
def rows(tpu_environment) -> dict[str, dict]:
    done = subprocess.run([sys.executable, str(BENCH), "--json", "--cases", "small"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["generation"]: r for r in json.loads(done.stdout)}


@pytest.mark.parametrize("generation", ["v5e", "v6e", "v7x"])
def test_a_scan_over_layers_updates_both_stacks_in_place(rows: dict[str, dict], generation: str) -> None:
    row = rows[generation]
    assert row["compiled"] == "yes", row
    cache, stack = row["cache_mib"], row["stack_mib"]
    assert cache == 8 * 2048 * 4 * 128 * 2 / 2**20 and stack == 4 * cache  # the geometry asked for
    assert row["alias_mib"] >= 2 * stack, row  # both donated stacks are the outputs' buffers
    assert row["argument_mib"] >= 2 * stack, row
    assert row["temp_mib"] < cache / 10, row  # no layer's cache copied, sliced out or written back
