"""report.json, as pydantic models: the one definition of its fields.

docs/report-schema.json is `Report.model_json_schema()` written out (`python -m kernel_hub.report.schema`
rewrites it; tests/report/test_report.py fails when the two differ). Times are seconds unless a key ends in _ms;
errors are relative max errors (numerics.relative_error); a float that was NaN or Inf is stored as null.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1
SCHEMA_FILE = Path("docs") / "report-schema.json"  # in the checkout; main() writes it there


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def finite(value: float | None) -> float | None:
    """JSON has no NaN: a non-finite number (a case that raised) is stored as null."""
    return value if value is not None and math.isfinite(value) else None


class Environment(_Model):
    """Where and when the numbers were taken."""

    date: str = Field(description="ISO 8601, UTC")
    commit: str | None = Field(description="git HEAD of the kernel-hub checkout (null outside a clone)")
    dirty: bool | None = Field(description="tracked files differ from commit")
    python: str
    platform: str
    machine: str
    cpu_model: str | None
    cpu_cores: int | None = Field(description="os.cpu_count()")
    usable_cores: int | None = Field(description="cores this process may run on")
    versions: dict[str, str | None] = Field(
        description="kernel-hub, jax, jaxlib, torch, transformers, diffusers, tokamax, huggingface_hub, kernels, "
        "numpy, libtpu (the TPU environment's); null: not installed")
    seed: int | None = Field(description="the validation inputs' random seed (case i uses seed + i)")


class CaseRow(_Model):
    """One validation case of one kernel in one mode."""

    kernel: str = Field(description="repo id")
    framework: Literal["jax", "torch"]
    mode: str = Field(description="cpu, xla, pallas-interpret, tpu-interpret, torch, tpu-compile, ...")
    generation: str | None = Field(description="TPU generation of a tpu-compile case")
    name: str
    dtype: str
    implementation: str | None
    passed: bool
    max_error: float | None
    tolerance: float
    run_seconds: float | None = Field(description="warm median of the kernel call (tpu-compile: null)")
    first_call_seconds: float | None = Field(description="first call: trace + compile + run")
    compile_seconds: float | None = Field(
        description="first call minus the warm median (tpu-compile: libtpu's compile time)")
    warm_runs: int
    cached: bool = Field(description="a tpu-compile result served from the compile cache")
    error: str | None

    @field_validator("max_error", mode="before")
    @classmethod
    def _finite(cls, v: object) -> object:
        return finite(v) if isinstance(v, float) else v


class KernelRun(_Model):
    """One kernel loaded for one framework and validated (or why it could not be)."""

    kernel: str
    framework: Literal["jax", "torch"]
    version: str | None
    variant: str | None
    backend: str | None
    passed: int
    total: int
    seconds: float
    skipped: str | None = Field(description="why nothing ran (no build for this framework, ...)")


class Cell(_Model):
    """A matrix cell: how many of a group's cases passed."""

    kernel: str
    column: str = Field(description="mode (validation), TPU generation (compile)")
    dtype: str | None
    passed: int
    total: int
    failed: list[str] = Field(description="names of the failed cases")


class Validation(_Model):
    seed: int
    runs: list[KernelRun]
    cases: list[CaseRow]
    matrix: list[Cell] = Field(description="kernel x mode x dtype (numeric cases)")


class Compile(_Model):
    """The TPU compile gate (kernel_hub.tpu.compile_gate.gate.compile_matrix) per kernel and generation."""

    available: bool
    reason: str | None = Field(description="why it did not run (no TPU environment, ...)")
    generations: list[str]
    selection: Literal["smoke", "all"] = Field(
        description="smoke: each kernel's cases tagged smoke (first forward and backward validation case); all")
    jax: str | None
    libtpu: str | None
    cases: list[CaseRow]
    matrix: list[Cell] = Field(description="kernel x generation")


class FamilyRow(_Model):
    """kernelize on one tiny model of a family (random weights, from its config)."""

    family: str
    library: Literal["transformers", "diffusers"]
    kind: Literal["moe", "attention", "diffusion"]
    status: Literal["replaced", "partial", "kept", "error", "skipped"] = Field(
        description="replaced: every layer found; partial: some kept; kept: none replaced")
    replaced: dict[str, int] = Field(description="layer kind -> layers replaced")
    kept: dict[str, int] = Field(description="layer kind -> layers kept on the default")
    reasons: list[str] = Field(description="why layers were kept (distinct), or the error")
    max_layer_error: float | None = Field(description="largest per-layer validation error kernelize measured")
    output_error: float | None = Field(description="model output after kernelize vs before")
    restored: bool | None = Field(description="restore() gave bit-identical outputs")
    seconds: float


class BenchRecord(_Model):
    """One method's timing in one group of a bench (timing.bench_records)."""

    group: str
    method: str
    samples_ms: list[float]
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    n: int
    vs_baseline: dict[str, float | bool | None] | None = Field(
        description="timing.Ratio: value, low, high (quartiles), paired, of_medians; baseline time / ours "
                    "(>1: faster than the baseline)")
    ours: bool = Field(description="a kernel-hub method (else a baseline)")


class Bench(_Model):
    name: str
    script: str
    ok: bool
    error: str | None
    seconds: float
    baseline: str | None
    records: list[BenchRecord]
    rows: list[dict[str, Any]] = Field(description="a bench's other rows (hub loads, modeled TPU time)")


class Headline(_Model):
    passed: int
    total: int
    rate: float = Field(description="passed / total over validation and TPU compile cases")
    validation: str
    compile: str
    families: str
    text: str = Field(description="the sentence the page leads with")


class Report(_Model):
    schema_version: int = SCHEMA_VERSION
    quick: bool
    seconds: float = Field(description="wall time of the whole report")
    environment: Environment
    headline: Headline
    validation: Validation
    compile: Compile
    families: list[FamilyRow]
    benches: list[Bench]


def schema_text() -> str:
    return json.dumps(Report.model_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    from ..package.checkout import checkout_decision

    found = checkout_decision()
    if found.root is None:
        print(f"report schema: not run from a kernel-hub checkout ({found.reason})", file=sys.stderr)
        return 1
    (found.root / SCHEMA_FILE).write_text(schema_text())
    print(f"wrote {found.root / SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
