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
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import numpy as np

from ..decide.system import VALIDATION_PART, cache_root, detect, installed_version
from ..errors import KernelHubError, ValidationFailedError
from .contract import REFERENCE_ATTR, SHAPES_ATTR, VALIDATION_MODULE, Case, ValidationModule, cases_from_reference
from .numerics import relative_error, to_float64, tolerance
from .results import NumericResult, ValidationReport
from .timing import first_and_warm


class ValidationOptions(TypedDict, total=False):
    """validate's selection and progress keywords, as `kh.validate` passes them through."""

    tags: tuple[str, ...] | None
    names: tuple[str, ...] | None
    seed: int | None
    on_start: Callable[[int], None] | None
    on_case: Callable[[int, int, NumericResult], None] | None
    select: Callable[[list[Case]], list[Case]] | None

__all__ = ["case_mode", "relative_error", "require_valid", "run_case", "validate"]

#: Warm calls per case after the first (fewer when they pass WARM_BUDGET_S together).
WARM_RUNS = 3
WARM_BUDGET_S = 0.5


def case_mode(case: Case) -> str:
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


def quick_selection(cases: list[Case]) -> list[Case]:
    """One case per (mode, dtype) (case_mode): every cell of the full run's matrix, a fraction of its time; what
    `kernel-hub demo --quick` and `kernel-hub report --quick` validate."""
    seen: set[tuple[str, str]] = set()
    out = []
    for case in cases:
        key = (case_mode(case), case.dtype)
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out


def run_case(case: Case, module: ModuleType, seed: int, *, warm_runs: int = WARM_RUNS,
             warm_budget_s: float = WARM_BUDGET_S) -> NumericResult:
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
        return NumericResult(passed=False, max_error=float("nan"), seconds=time.perf_counter() - start,
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
    return NumericResult(passed=passed, max_error=err, error=problem, **timing, **common)


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
    on_case: Callable[[int, int, NumericResult], None] | None = None,
    select: Callable[[list[Case]], list[Case]] | None = None,
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


def pick_cases(cases: list[Case], tags: Sequence[str] | None,
               names: Sequence[str] | None) -> tuple[list[Case], str]:
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
    return cache_root(VALIDATION_PART)


def require_valid(module: ModuleType, *, backend: str) -> ValidationReport:
    """Validate once per (commit, variant, backend, jax) and remember a pass; raise on failure."""
    info = module.__kernel_hub__
    key = f"{info.commit}_{info.variant}_{backend}_jax{installed_version('jax')}.json"
    path = cache_dir() / key
    cached = _remembered(path)
    if cached is not None:
        return cached
    report = validate(module, backend=backend)
    if not report.passed:
        failed = [c.name for c in report.cases if not c.passed]
        raise ValidationFailedError(
            f"{info.repo_id} [{info.variant}] failed validation on {backend}: {', '.join(failed[:5])}"
        )
    _remember(path, report)
    return report


def _remembered(path: Path) -> ValidationReport | None:
    """A pass remembered in the cache, or None: missing, pruned meanwhile, unreadable or not a report (the cache is
    untrusted and may be shared or pruned by another process: anything odd is a miss, validated again)."""
    try:
        with open(path, "rb") as handle:
            cached = json.loads(handle.read(1 << 20))
        if not isinstance(cached, dict) or cached.get("passed") is not True:
            return None
        return ValidationReport(**{k: v for k, v in cached.items() if k not in ("cases", "passed")})
    except (OSError, ValueError, TypeError, RecursionError):
        return None


def _remember(path: Path, report: ValidationReport) -> None:
    """Remember a pass (atomic replace); a cache that cannot be written, or is pruned meanwhile, is skipped."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(report.to_json())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
