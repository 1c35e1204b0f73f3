"""fp8 (float8_e4m3fn) KV caches compiled by libtpu (the TPU environment, .venv-tpu) with both caches donated: on v6e
and v7x the kernel compiles, the outputs alias both caches and the temporaries stay under a tenth of one cache; on
v5e the entry refuses with one ValueError naming the chip and bf16 (bench/paged_inplace.py's small fp8 case).
Skipped, with the reason, only where that environment is missing (`make test` creates it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "paged_inplace.py"


@pytest.fixture(scope="module")
def rows(tpu_environment) -> dict[str, dict]:
    done = subprocess.run([sys.executable, str(BENCH), "--json", "--cases", "small_fp8"], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["generation"]: r for r in json.loads(done.stdout)}


@pytest.mark.parametrize("generation", ["v6e", "v7x"])
def test_fp8_caches_compile_in_place(rows: dict[str, dict], generation: str) -> None:
    row = rows[generation]
    assert row["compiled"] == "yes", row
    cache = row["cache_mib"]
    assert cache == 8 * 2048 * 4 * 128 / 2**20  # one byte an element: the caches are fp8, not widened
    assert row["alias_mib"] >= 2 * cache, row
    assert row["temp_mib"] < cache / 10, row


def test_v5e_refuses_fp8_caches_naming_the_chip(rows: dict[str, dict]) -> None:
    refusal = rows["v5e"]["compiled"]
    assert "v5e" in refusal and "bfloat16" in refusal and "float8_e4m3fn" in refusal, refusal
