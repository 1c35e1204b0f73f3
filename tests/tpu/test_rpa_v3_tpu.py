"""Ours against vLLM TPU's ragged paged attention v3 (tpu-inference 0.32.0) on the same inputs, in the TPU environment
(.venv-tpu): tests/tpu_env/rpa_v3_checks.py runs both through RPA v3's argument order and fused cache layout and
writes the differences. Skipped, with the reason, only where that environment is missing (`make test` creates it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tests" / "tpu_env" / "rpa_v3_checks.py"
TOL = {"float32": 1e-5, "bfloat16": 1e-2}


@pytest.fixture(scope="module")
def facts(tpu_environment, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rpa_v3") / "facts.json"
    child = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    child["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + child["PYTHONPATH"] if child.get("PYTHONPATH") else "")
    done = subprocess.run([str(tpu_environment.python), str(CHECKS), str(out)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env=child)
    tail = "\n".join(ln for ln in done.stderr.splitlines() if not ln.startswith(("I0000", "W0000", "E0000")))
    assert done.returncode == 0, tail[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("dtype", sorted(TOL))
def test_ours_matches_rpa_v3_outputs_and_caches(facts: dict, dtype: str) -> None:
    row = facts["cases"][dtype]
    for impl in ("pallas", "cpu"):
        out_err, cache_err = row[f"{impl}_vs_rpa_v3"]
        assert out_err <= TOL[dtype], row
        assert cache_err == 0.0, row  # the same rows land in the same pages, bit for bit
        assert row[f"{impl}_vs_f64"][0] <= TOL[dtype], row
        assert row["padding_rows_zero"][impl], row
    assert row["rpa_v3_vs_f64"][0] <= TOL[dtype], row  # the peer's own numbers are right on these inputs
    assert row["pallas_trace"].startswith("pallas: chosen") and "interpreted" in row["pallas_trace"]
    assert row["compared_with"], row
