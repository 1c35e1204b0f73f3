"""What a validation run reports: one result per case, of one of two kinds, and the report holding them.

A numeric case ran the kernel on this device against its reference (error, tolerance, timing); a compile case was
compiled by the real TPU compiler for one generation (compile time, compiled memory, cache). Each kind carries only
its own fields. The JSON row is the same for both (docs/cli-json.md lists every field for every case), so a field
of the other kind is written with its empty value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

__all__ = [
    "CASE_COLUMNS", "AnyCaseResult", "CaseResult", "CompileResult", "NumericResult", "ValidationReport", "case_cells",
]

#: The keys of a case's JSON row, in order, for either kind.
ROW_KEYS = ("name", "dtype", "implementation", "passed", "max_error", "tolerance", "seconds", "tags", "error", "kind",
            "generation", "compile_seconds", "argument_bytes", "output_bytes", "temp_bytes", "cached", "mode",
            "first_call_seconds", "warm_runs")


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """What every case reports: which case, whether it passed, and why not."""

    kind: ClassVar[str]
    name: str
    dtype: str
    implementation: str | None
    passed: bool
    tags: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON row (ROW_KEYS): this kind's fields, the other kind's as empty values; NaN becomes null."""
        values = {**self._other_kind(), **asdict(self), "kind": self.kind}
        row = {key: values[key] for key in ROW_KEYS}
        if isinstance(row["max_error"], float) and not math.isfinite(row["max_error"]):
            row["max_error"] = None
        return row

    def _other_kind(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class NumericResult(CaseResult):
    """A case run on this device and checked against its reference."""

    kind: ClassVar[str] = "numeric"
    max_error: float
    tolerance: float
    seconds: float  # warm median of the kernel call
    compile_seconds: float | None = None  # first call minus the warm median
    first_call_seconds: float | None = None  # trace + compile + run
    warm_runs: int = 0  # warm calls behind `seconds`
    mode: str = ""  # how the case ran: validation.case_mode()

    def _other_kind(self) -> dict[str, Any]:
        return {"generation": None, "argument_bytes": None, "output_bytes": None, "temp_bytes": None, "cached": False}


@dataclass(frozen=True, kw_only=True)
class CompileResult(CaseResult):
    """A case compiled by the real TPU compiler for one generation (kernel_hub.tpu.compile_gate.gate)."""

    kind: ClassVar[str] = "compile"
    generation: str
    compile_seconds: float | None = None  # libtpu's; None when it never compiled
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    cached: bool = False  # served from the compile cache
    tuning: str | None = None  # the blocks the case ran with and where they came from (a tuned-table entry), if told

    def _other_kind(self) -> dict[str, Any]:
        return {"max_error": 0.0 if self.passed else None, "tolerance": 0.0,
                "seconds": float(self.compile_seconds or 0.0), "mode": "", "first_call_seconds": None, "warm_runs": 0}


#: A case of either kind, as a report holds it.
AnyCaseResult = NumericResult | CompileResult


@dataclass
class ValidationReport:
    """Every case of one kernel build: numeric cases run here, compile cases per TPU generation."""

    repo_id: str
    version: str | None
    commit: str
    variant: str
    backend: str
    jax_version: str | None
    cases: list[AnyCaseResult] = field(default_factory=list)
    libtpu_version: str | None = None  # set when TPU compile cases are in the report
    generations: tuple[str, ...] = ()
    seed: int | None = None  # case i's inputs came from seed + i

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def numeric(self) -> list[NumericResult]:
        return [c for c in self.cases if isinstance(c, NumericResult)]

    @property
    def compiled(self) -> list[CompileResult]:
        return [c for c in self.cases if isinstance(c, CompileResult)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every case as its row (CaseResult.to_dict), plus `passed`."""
        data = asdict(self)
        data["cases"] = [c.to_dict() for c in self.cases]
        data["passed"] = self.passed
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def __str__(self) -> str:
        lines = [self.header()]
        if self.numeric:
            rows = [CASE_COLUMNS] + [case_cells(c) for c in self.numeric]
            lines += _aligned(rows)
        lines += self.compile_lines()
        lines.append(self.summary())
        return "\n".join(lines)

    def compile_lines(self) -> list[str]:
        """The TPU compile cases as a table (none: no lines)."""
        if not self.compiled:
            return []
        rows = [("generation", "case", "impl", "compile s", "args MiB", "out MiB", "temp MiB", "result")]
        for c in self.compiled:
            sec = "cached" if c.cached else (f"{c.compile_seconds:.2f}" if c.compile_seconds is not None else "-")
            rows.append((c.generation, c.name, c.implementation or "-", sec, _mib(c.argument_bytes),
                         _mib(c.output_bytes), _mib(c.temp_bytes), _verdict(c)))
        return [f"TPU compile (jax {self.jax_version}, libtpu {self.libtpu_version}):", *_aligned(rows)]

    def header(self) -> str:
        seed = f", seed {self.seed}" if self.seed is not None else ""
        return f"{self.repo_id} {self.version or self.commit[:12]} [{self.variant}] on {self.backend}{seed}"

    def summary(self) -> str:
        n_pass = sum(c.passed for c in self.cases)
        return f"{n_pass}/{len(self.cases)} cases passed: {'PASSED' if self.passed else 'FAILED'}"


#: The columns of a numeric case, in the table and in live rows (case_cells).
CASE_COLUMNS = ("case", "dtype", "mode", "impl", "max error", "tol", "first s", "warm s", "result")


def case_cells(c: NumericResult) -> tuple[str, ...]:
    """A numeric case's row: first call (trace + compile + run) and the warm median apart."""
    first = "-" if c.first_call_seconds is None else f"{c.first_call_seconds:.3f}"
    return (c.name, c.dtype, c.mode or "-", c.implementation or "auto", f"{c.max_error:.2e}", f"{c.tolerance:.0e}",
            first, f"{c.seconds:.4f}", _verdict(c))


def _verdict(c: CaseResult) -> str:
    return "pass" if c.passed else f"FAIL{': ' + c.error if c.error else ''}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _aligned(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows as columns padded to width; the last column (the verdict) is left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
