"""Numbers checked on this device: run a kernel's own cases against its reference, report per case.

A kernel package ships `validation.py` with `cases(backend, framework="jax") -> list[Case]` (the kernel
contract, contract.py); each case makes fresh random inputs, calls the loaded module and computes an
independent reference. This harness owns the verdict: the metric and tolerance table of numerics.py (NaN/Inf
never passing), and the timing of the kernel call only: the first call (trace + compile + run) apart from the
warm median of a few more (timing.first_and_warm). The seed is recorded: case i of a report uses seed + i, so
`--seed` reproduces a run.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..decide.system import cache_root, detect, installed_version
from ..errors import KernelHubError, ValidationFailedError
from .contract import REFERENCE_ATTR, SHAPES_ATTR, VALIDATION_MODULE, ValidationModule, cases_from_reference
from .numerics import relative_error, to_float64, tolerance
from .timing import first_and_warm

__all__ = ["CaseResult", "ValidationReport", "case_mode", "relative_error", "require_valid", "run_case", "validate"]

#: Warm calls per case after the first (fewer when they pass WARM_BUDGET_S together).
WARM_RUNS = 3
WARM_BUDGET_S = 0.5


@dataclass(frozen=True)
class CaseResult:
    name: str
    dtype: str
    implementation: str | None
    passed: bool
    max_error: float
    tolerance: float
    seconds: float  # numeric: warm median of the kernel call; compile: libtpu's compile time
    tags: tuple[str, ...] = ()
    error: str | None = None
    # kind="compile": a case compiled by the real TPU compiler for `generation` (kernel_hub.tpu.compile_gate.gate)
    kind: str = "numeric"
    generation: str | None = None
    compile_seconds: float | None = None  # compile: libtpu's; numeric: first call minus the warm median
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    cached: bool = False
    mode: str = ""  # how the case ran: case_mode() (numeric), "tpu-compile" (compile)
    first_call_seconds: float | None = None  # numeric: the first call, trace + compile + run
    warm_runs: int = 0  # numeric: warm calls behind `seconds`


@dataclass
class ValidationReport:
    repo_id: str
    version: str | None
    commit: str
    variant: str
    backend: str
    jax_version: str | None
    cases: list[CaseResult] = field(default_factory=list)
    libtpu_version: str | None = None  # set when TPU compile cases are in the report
    generations: tuple[str, ...] = ()
    seed: int | None = None  # case i's inputs came from seed + i

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a case that raised has max_error NaN, which JSON cannot carry; it becomes null."""
        data = asdict(self)
        data["passed"] = self.passed
        for case in data["cases"]:
            if isinstance(case["max_error"], float) and not np.isfinite(case["max_error"]):
                case["max_error"] = None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def __str__(self) -> str:
        numeric = [c for c in self.cases if c.kind != "compile"]
        lines = [self.header()]
        if numeric:
            rows = [CASE_COLUMNS] + [case_cells(c) for c in numeric]
            lines += _aligned(rows)
        lines += self.compile_lines()
        lines.append(self.summary())
        return "\n".join(lines)

    def compile_lines(self) -> list[str]:
        """The TPU compile cases as a table (none: no lines)."""
        compiled = [c for c in self.cases if c.kind == "compile"]
        if not compiled:
            return []
        rows = [("generation", "case", "impl", "compile s", "args MiB", "out MiB", "temp MiB", "result")]
        for c in compiled:
            sec = "cached" if c.cached else (f"{c.compile_seconds:.2f}" if c.compile_seconds is not None else "-")
            rows.append((c.generation or "", c.name, c.implementation or "-", sec, _mib(c.argument_bytes),
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


def case_cells(c: CaseResult) -> tuple[str, ...]:
    """A numeric case's row: first call (trace + compile + run) and the warm median apart."""
    first = "-" if c.first_call_seconds is None else f"{c.first_call_seconds:.3f}"
    return (c.name, c.dtype, c.mode or "-", c.implementation or "auto", f"{c.max_error:.2e}", f"{c.tolerance:.0e}",
            first, f"{c.seconds:.4f}", _verdict(c))


def _verdict(c: CaseResult) -> str:
    return "pass" if c.passed else f"FAIL{': ' + c.error if c.error else ''}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as columns padded to width; the last column (the verdict) is left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]


def case_mode(case: Any) -> str:
    """How a case runs, for the report's matrix: tpu-interpret (the TPU simulator with race detection),
    pallas-interpret, torch (the torch-facing entry), else its implementation (cpu, xla, ...; "auto": the
    entry's own order)."""
    tags = set(getattr(case, "tags", ()))
    interpret = getattr(case, "interpret", None)
    if interpret == "tpu" or "tpu_interpret" in tags:
        return "tpu-interpret"
    if interpret == "fast" or "interpret" in tags:
        return "pallas-interpret"
    if getattr(case, "framework", "jax") == "torch":
        return "torch"
    impl = case.implementation
    return "/".join(impl) if isinstance(impl, tuple) else (impl or "auto")


def run_case(case: Any, module: ModuleType, seed: int, *, warm_runs: int = WARM_RUNS,
             warm_budget_s: float = WARM_BUDGET_S) -> CaseResult:
    """One case: fresh inputs, the kernel call timed cold (first call) and warm (median of up to `warm_runs`
    more), reference, verdict. Exceptions fail the case."""
    tol = case.tolerance if getattr(case, "tolerance", None) is not None else tolerance(case.dtype)
    common = dict(name=case.name, dtype=case.dtype, implementation=case.implementation,
                  tolerance=tol, tags=tuple(getattr(case, "tags", ())), mode=case_mode(case))
    start = time.perf_counter()
    try:
        inputs = case.inputs(seed)
        start = time.perf_counter()
        result, first, warm = first_and_warm(lambda: case.call(module, inputs), runs=warm_runs,
                                             budget_s=warm_budget_s)
        actual = to_float64(result)
        expected = to_float64(case.reference(inputs))
    except Exception as exc:  # a kernel that raises fails its case, with the reason
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return CaseResult(passed=False, max_error=float("nan"), seconds=time.perf_counter() - start,
                          error=message[:200], **common)
    seconds = statistics.median(warm)
    timing = dict(seconds=seconds, first_call_seconds=first, compile_seconds=max(first - seconds, 0.0),
                  warm_runs=len(warm))
    err = relative_error(actual, expected)
    problem = None
    if actual.shape != expected.shape:
        problem = f"shape {actual.shape} != reference {expected.shape}"
    elif not np.isfinite(actual).all():
        problem = "NaN or Inf in output"
    elif not np.isfinite(expected).all():
        problem = "NaN or Inf in the reference"
    passed = problem is None and err <= tol
    return CaseResult(passed=passed, max_error=err, error=problem, **timing, **common)


def _cases_for(module: ModuleType, backend: str) -> list[Any]:
    info = module.__kernel_hub__
    try:
        cases_module = importlib.import_module(f"{module.__name__}.{VALIDATION_MODULE}")
    except ImportError as exc:
        if not (hasattr(module, REFERENCE_ATTR) and hasattr(module, SHAPES_ATTR)):
            raise KernelHubError(f"{info.repo_id}: the package has no validation module ({exc}) and no "
                                 f"{REFERENCE_ATTR} + {SHAPES_ATTR} to generate cases from") from None
        op, reference = getattr(module, REFERENCE_ATTR)
        return cases_from_reference(op, reference, getattr(module, SHAPES_ATTR), framework=info.framework)
    if not isinstance(cases_module, ValidationModule) or not callable(cases_module.cases):
        raise KernelHubError(f"{info.repo_id}: its {VALIDATION_MODULE} module has no cases(backend, framework=) "
                             "function: see kernel_hub.verify.contract.ValidationModule")
    cases = list(cases_module.cases(backend, framework=info.framework))
    if not cases:
        raise KernelHubError(f"{info.repo_id}: no validation cases for backend {backend}")
    return cases


def _resolve_module(kernel: ModuleType | str, backend: str | None) -> ModuleType:
    if isinstance(kernel, str):  # loading (and its trust check) is api.py's: kernel_hub.validate(repo_id)
        raise KernelHubError(f"validation.validate takes a loaded kernel; kernel_hub.validate({kernel!r}) loads "
                             "one by repo id")
    if not hasattr(kernel, "__kernel_hub__"):
        raise KernelHubError("validate() takes a module from get_kernel/get_local_kernel or a repo id")
    return kernel


def validate(
    kernel: ModuleType | str,
    *,
    backend: str | None = None,
    tags: tuple[str, ...] | None = None,
    names: tuple[str, ...] | None = None,
    seed: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_case: Callable[[int, int, CaseResult], None] | None = None,
    select: Callable[[list[Any]], list[Any]] | None = None,
    other_cases: bool = False,
) -> ValidationReport:
    """Run the kernel's cases for this backend; `tags`/`names` (or `select`, a function of the case list)
    select a subset. A tag or name no case carries is refused, listing the valid ones, unless `other_cases` (TPU
    compile cases run too and may carry it).

    seed: case i's inputs come from seed + i; None draws one, recorded in report.seed either way.
    on_start(total) is called once the cases are chosen, on_case(i, total, result) as each numeric case finishes
    (live progress). Numbers only: kernel_hub.validate(kernel, tpu=...) adds the TPU compile gate's cases."""
    module = _resolve_module(kernel, backend)
    info = module.__kernel_hub__
    run_backend = backend or detect(info.framework).backend
    cases, problem = pick_cases(_cases_for(module, run_backend), tags, names)
    if problem and not other_cases:
        raise KernelHubError(f"{info.repo_id} on {run_backend}: {problem}")
    if select is not None:
        cases = select(cases)
    rng_seed = seed if seed is not None else new_seed()
    report = ValidationReport(info.repo_id, info.version, info.commit, info.variant, run_backend,
                              installed_version("jax"), seed=rng_seed)
    if on_start is not None:
        on_start(len(cases))
    for i, case in enumerate(cases):
        result = run_case(case, module, rng_seed + i)
        report.cases.append(result)
        if on_case is not None:
            on_case(i, len(cases), result)
    return report


def pick_cases(cases: list[Any], tags: Sequence[str] | None,
               names: Sequence[str] | None) -> tuple[list[Any], str]:
    """(the cases carrying one of `tags` and named in `names`, "" or what was asked that no case has, with the
    valid choices)."""
    known_tags = sorted({t for c in cases for t in getattr(c, "tags", ())})
    known_names = [c.name for c in cases]
    problems = []
    unknown = [t for t in tags or () if t not in known_tags]
    if unknown:
        problems.append(f"no case has tag {', '.join(map(repr, unknown))} (tags: {', '.join(known_tags) or 'none'})")
    missing = [n for n in names or () if n not in known_names]
    if missing:
        shown = ", ".join(known_names[:20]) + (f", ... ({len(known_names)} cases)" if len(known_names) > 20 else "")
        problems.append(f"no case is named {', '.join(map(repr, missing))} (cases: {shown or 'none'})")
    if tags:
        cases = [c for c in cases if set(tags) & set(getattr(c, "tags", ()))]
    if names:
        cases = [c for c in cases if c.name in names]
    return cases, "; ".join(problems)


def new_seed() -> int:
    """A fresh seed that fits every RNG the cases use (31 bits, so seed + i stays a valid int32 seed too)."""
    return int.from_bytes(os.urandom(4), "little") >> 1


def cache_dir() -> Path:
    """Passed validations, one file per (commit, variant, backend, jax)."""
    return cache_root("validation")


def require_valid(module: ModuleType, *, backend: str) -> ValidationReport:
    """Validate once per (commit, variant, backend, jax) and remember a pass; raise on failure."""
    info = module.__kernel_hub__
    key = f"{info.commit}_{info.variant}_{backend}_jax{installed_version('jax')}.json"
    path = cache_dir() / key
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("passed"):
            return ValidationReport(**{k: v for k, v in cached.items() if k not in ("cases", "passed")})
    report = validate(module, backend=backend)
    if not report.passed:
        failed = [c.name for c in report.cases if not c.passed]
        raise ValidationFailedError(
            f"{info.repo_id} [{info.variant}] failed validation on {backend}: {', '.join(failed[:5])}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(report.to_json())
    os.replace(tmp, path)
    return report
