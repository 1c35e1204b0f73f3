"""Numbers checked on this device: run a kernel's own cases against its reference, report per case.

A kernel package ships `validation.py` with `cases(backend, framework="jax") -> list[Case]` (the kernel
contract, contract.py); each case makes fresh random inputs, calls the loaded module and computes an
independent reference. This harness owns the verdict: the metric and tolerance table of numerics.py (NaN/Inf
never passing), timing of the kernel call only.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .errors import KernelHubError, ValidationFailedError
from .numerics import relative_error, to_float64, tolerance

__all__ = ["CaseResult", "ValidationReport", "relative_error", "require_valid", "run_case", "validate"]


@dataclass(frozen=True)
class CaseResult:
    name: str
    dtype: str
    implementation: str | None
    passed: bool
    max_error: float
    tolerance: float
    seconds: float
    tags: tuple[str, ...] = ()
    error: str | None = None
    # kind="compile": a case compiled by the real TPU compiler for `generation` (kernel_hub.tpu.gate)
    kind: str = "numeric"
    generation: str | None = None
    compile_seconds: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    cached: bool = False


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

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        head = f"{self.repo_id} {self.version or self.commit[:12]} [{self.variant}] on {self.backend}"
        numeric = [c for c in self.cases if c.kind != "compile"]
        compiled = [c for c in self.cases if c.kind == "compile"]
        lines = [head]
        if numeric:
            rows = [("case", "dtype", "impl", "max error", "tol", "seconds", "result")]
            for c in numeric:
                rows.append((c.name, c.dtype, c.implementation or "auto", f"{c.max_error:.2e}", f"{c.tolerance:.0e}",
                             f"{c.seconds:.3f}", _verdict(c)))
            lines += _aligned(rows)
        if compiled:
            lines.append(f"TPU compile (jax {self.jax_version}, libtpu {self.libtpu_version}):")
            rows = [("generation", "case", "impl", "compile s", "args MiB", "out MiB", "temp MiB", "result")]
            for c in compiled:
                sec = "cached" if c.cached else (f"{c.compile_seconds:.2f}" if c.compile_seconds is not None else "-")
                rows.append((c.generation or "", c.name, c.implementation or "-", sec, _mib(c.argument_bytes),
                             _mib(c.output_bytes), _mib(c.temp_bytes), _verdict(c)))
            lines += _aligned(rows)
        n_pass = sum(c.passed for c in self.cases)
        lines.append(f"{n_pass}/{len(self.cases)} cases passed: {'PASSED' if self.passed else 'FAILED'}")
        return "\n".join(lines)


def _verdict(c: CaseResult) -> str:
    return "pass" if c.passed else f"FAIL{': ' + c.error if c.error else ''}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as columns padded to width; the last column (the verdict) is left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]


def _block(x: Any) -> Any:
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    return x


def run_case(case: Any, module: ModuleType, seed: int) -> CaseResult:
    """One case: fresh inputs, timed kernel call, reference, verdict. Exceptions fail the case."""
    tol = case.tolerance if getattr(case, "tolerance", None) is not None else tolerance(case.dtype)
    common = dict(name=case.name, dtype=case.dtype, implementation=case.implementation,
                  tolerance=tol, tags=tuple(getattr(case, "tags", ())))
    start = time.perf_counter()
    try:
        inputs = case.inputs(seed)
        start = time.perf_counter()
        actual = to_float64(_block(case.call(module, inputs)))
        seconds = time.perf_counter() - start
        expected = to_float64(case.reference(inputs))
    except Exception as exc:  # a kernel that raises fails its case, with the reason
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return CaseResult(passed=False, max_error=float("nan"), seconds=time.perf_counter() - start,
                          error=message[:200], **common)
    err = relative_error(actual, expected)
    problem = None
    if actual.shape != expected.shape:
        problem = f"shape {actual.shape} != reference {expected.shape}"
    elif not np.isfinite(actual).all():
        problem = "NaN or Inf in output"
    elif not np.isfinite(expected).all():
        problem = "NaN or Inf in the reference"
    passed = problem is None and err <= tol
    return CaseResult(passed=passed, max_error=err, seconds=seconds, error=problem, **common)


def _cases_for(module: ModuleType, backend: str) -> list[Any]:
    info = module.__kernel_hub__
    try:
        cases_module = importlib.import_module(f"{module.__name__}.validation")
    except ImportError as exc:
        raise KernelHubError(f"{info.repo_id}: the package has no validation module ({exc})") from None
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
    tpu: str | list[str] | tuple[str, ...] | None = None,
) -> ValidationReport:
    """Run the kernel's cases for this backend; `tags`/`names` select a subset.

    tpu=["v5e", "v6e"] (or "v5e,v6e") adds every TPU compile case of the kernel (those `tags`/`names` select),
    compiled by the real TPU compiler for each generation (kernel_hub.tpu.gate; needs the TPU environment,
    `make setup-tpu`)."""
    module = _resolve_module(kernel, backend)
    info = module.__kernel_hub__
    from .system import installed_version

    run_backend = backend or _current_backend(info.framework)
    cases = _cases_for(module, run_backend)
    if tags:
        cases = [c for c in cases if set(tags) & set(getattr(c, "tags", ()))]
    if names:
        cases = [c for c in cases if c.name in names]
    rng_seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    report = ValidationReport(info.repo_id, info.version, info.commit, info.variant, run_backend,
                              installed_version("jax"))
    for i, case in enumerate(cases):
        report.cases.append(run_case(case, module, rng_seed + i))
    if tpu:
        from .tpu.gate import compile_matrix

        compiled = compile_matrix(module, tpu, tags=tags, names=names)
        report.cases.extend(compiled.cases)
        report.libtpu_version, report.generations = compiled.libtpu_version, compiled.generations
    return report


def _current_backend(framework: str) -> str:
    from .system import detect

    return detect(framework).backend


def cache_dir() -> Path:
    root = os.environ.get("KERNEL_HUB_CACHE") or Path.home() / ".cache" / "kernel_hub"
    return Path(root) / "validation"


def require_valid(module: ModuleType, *, backend: str) -> ValidationReport:
    """Validate once per (commit, variant, backend, jax) and remember a pass; raise on failure."""
    from .system import installed_version

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
