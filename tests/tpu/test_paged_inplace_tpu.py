"""The ragged paged attention's cache update compiled by libtpu (the TPU environment, .venv-tpu) with both caches
donated: the outputs alias both caches and the program's temporaries stay under a tenth of one cache, on v5e, v6e
and v7x (bench/paged_inplace.py's small case; the model geometries are the bench's default rows). Skipped, with the
reason, only where that environment is missing (`make test` creates it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "paged_inplace.py"


@pytest.fixture(scope="module")
def rows(tpu_environment) -> list[dict]:
    done = subprocess.run([sys.executable, str(BENCH), "--json", "--cases", "small"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_generation_compiles_the_small_cases(rows: list[dict]) -> None:
    assert sorted((r["generation"], r["case"]) for r in rows) == [
        (g, c) for g in ("v5e", "v6e", "v7x")
        for c in ("small_decode_b8_2k_window", "small_decode_b8_2k_window_out_proj", "small_mixed_b8_2k_window")]
    assert all(r["compiled"] == "yes" for r in rows), rows


@pytest.mark.parametrize("case", ["small_decode_b8_2k_window", "small_mixed_b8_2k_window",
                                  "small_decode_b8_2k_window_out_proj"])
@pytest.mark.parametrize("generation", ["v5e", "v6e", "v7x"])
def test_outputs_alias_both_caches_and_nothing_copies_one(rows: list[dict], generation: str, case: str) -> None:
    """A decode step (one call that stores its rows, also with the output projection in it) and a mixed batch (the
    write kernel, then the attention call that stores the decode steps' rows): either way both caches are aliased
    through."""
    row = next(r for r in rows if r["generation"] == generation and r["case"] == case)
    cache = row["cache_mib"]
    assert row["alias_mib"] >= 2 * cache, row  # both donated caches are the outputs' buffers
    assert row["temp_mib"] < cache / 10, row  # no copy of a cache anywhere in the program
    assert row["argument_mib"] >= 2 * cache
