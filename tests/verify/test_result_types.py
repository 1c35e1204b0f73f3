"""The two kinds of case result: each carries only its own fields, and both write the JSON row docs/cli-json.md
documents for every case of `kernel-hub validate --json`."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from kernel_hub.errors import KernelHubError
from kernel_hub.tpu.compile_gate.gate import compile_matrix
from kernel_hub.verify.results import CaseResult, CompileResult, NumericResult, ValidationReport

ROOT = Path(__file__).resolve().parents[2]


def documented_case_keys() -> set[str]:
    """The keys docs/cli-json.md lists after "each case:" in the row of `validate`."""
    row = next(line for line in (ROOT / "docs/cli-json.md").read_text().splitlines() if line.startswith("| `validate"))
    listed = re.sub(r"\([^)]*\)", "", row.split("each case:", 1)[1])  # "(`numeric` or `compile`)": values
    return set(re.findall(r"`([a-z_]+)`", listed))


def report() -> ValidationReport:
    common = dict(dtype="bfloat16", implementation="pallas", tags=("smoke",))
    numeric = NumericResult(name="fwd", passed=False, max_error=math.nan, tolerance=1e-2, seconds=0.25,
                            error="ValueError: boom", **common)
    compiled = CompileResult(name="fwd", passed=True, generation="v5e", compile_seconds=1.5, argument_bytes=64,
                             cached=True, **common)
    return ValidationReport("acme/k", "1.0.0", "c" * 40, "jax-tpu", "tpu", "0.4", [numeric, compiled],
                            libtpu_version="0.0.1", generations=("v5e",), seed=7)


def test_each_kind_carries_only_its_own_fields() -> None:
    shared = {f.name for f in dataclasses.fields(CaseResult)}
    numeric = {f.name for f in dataclasses.fields(NumericResult)} - shared
    compiled = {f.name for f in dataclasses.fields(CompileResult)} - shared
    assert {"max_error", "tolerance", "first_call_seconds", "warm_runs"} <= numeric
    assert {"generation", "argument_bytes", "cached"} <= compiled
    assert not {"generation", "cached", "argument_bytes"} & numeric
    assert not {"max_error", "tolerance", "warm_runs"} & compiled


def test_both_kinds_write_every_documented_key_as_strict_json() -> None:
    data = json.loads(report().to_json())  # allow_nan=False: a NaN error would raise here
    keys = documented_case_keys()
    assert len(keys) > 10
    numeric, compiled = data["cases"]
    assert set(numeric) == keys and set(compiled) == keys
    assert numeric["kind"] == "numeric" and numeric["max_error"] is None and numeric["generation"] is None
    assert compiled["kind"] == "compile" and compiled["generation"] == "v5e" and compiled["cached"] is True
    assert data["passed"] is False


def test_the_report_sorts_its_cases_by_kind() -> None:
    rep = report()
    assert [c.kind for c in rep.numeric] == ["numeric"] and [c.generation for c in rep.compiled] == ["v5e"]
    text = str(rep)
    assert "TPU compile (jax 0.4, libtpu 0.0.1):" in text and "1/2 cases passed: FAILED" in text


def test_compile_matrix_takes_only_a_verified_package(tmp_path: Path) -> None:
    with pytest.raises(KernelHubError, match="folder_package"):
        compile_matrix(tmp_path, ["v5e"])  # type: ignore[arg-type]
    with pytest.raises(KernelHubError, match="repo_package"):
        compile_matrix("acme/k", ["v5e"])  # type: ignore[arg-type]
