"""The report's validation and TPU compile sections: every registry kernel on every mode this machine offers.

Modes come from the kernels' own cases (validation.case_mode): on a CPU host the CPU paths, the Pallas kernels
interpreted, the TPU simulator with race detection, and the torch-facing entries; with the TPU environment
(.venv-tpu), every TPU case compiled by libtpu per generation (tpu.compile_gate.gate.compile_matrix).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..package.buildfmt import FRAMEWORKS
from ..ui.progress import Progress
from ..verify.results import AnyCaseResult, CompileResult, NumericResult, case_cells
from .schema import CaseRow, Cell, Compile, KernelRun, Validation, finite

if TYPE_CHECKING:
    from pathlib import Path


#: TPU generations compiled for in a full report (all that tpu.chips knows) and in a quick one.
QUICK_GENERATIONS = ("v5e",)


def case_row(kernel: str, framework: str, c: AnyCaseResult) -> CaseRow:
    """The dashboard's row of a case of either kind; the other kind's columns empty."""
    if isinstance(c, CompileResult):
        return CaseRow(kernel=kernel, framework=framework, mode="tpu-compile", generation=c.generation, name=c.name,
                       dtype=c.dtype, implementation=c.implementation, passed=c.passed,
                       max_error=0.0 if c.passed else None, tolerance=0.0, run_seconds=None, first_call_seconds=None,
                       compile_seconds=c.compile_seconds, warm_runs=0, cached=c.cached, error=c.error)
    return CaseRow(kernel=kernel, framework=framework, mode=c.mode or "auto", generation=None, name=c.name,
                   dtype=c.dtype, implementation=c.implementation, passed=c.passed, max_error=finite(c.max_error),
                   tolerance=c.tolerance, run_seconds=c.seconds, first_call_seconds=c.first_call_seconds,
                   compile_seconds=c.compile_seconds, warm_runs=c.warm_runs, cached=False, error=c.error)


def matrix(rows: Sequence[CaseRow], column: str, *, by_dtype: bool) -> list[Cell]:
    """Cells of (kernel, column value[, dtype]) in first-seen order; column is a CaseRow field name."""
    cells: dict[tuple[str, str, str | None], Cell] = {}
    for r in rows:
        key = (r.kernel, str(getattr(r, column)), r.dtype if by_dtype else None)
        cell = cells.setdefault(key, Cell(kernel=key[0], column=key[1], dtype=key[2], passed=0, total=0, failed=[]))
        cell.total += 1
        if r.passed:
            cell.passed += 1
        else:
            cell.failed.append(r.name)
    return list(cells.values())


def live_row(kernel: str, c: NumericResult) -> str:
    cells = case_cells(c)
    verdict = "pass" if c.passed else "FAIL"
    name, dtype, mode, _impl, err, _tol, first, warm = cells[:8]
    reason = f"  {c.error}" if c.error and not c.passed else ""
    return f"  {verdict}  {kernel:<30} {mode:<16} {dtype:<8} {name:<46} err {err}  first {first}s  warm {warm}s{reason}"


def run_validation(repo_ids: Sequence[str], *, seed: int, quick: bool, progress: Progress) -> Validation:
    """Load each kernel for each framework (jax, torch) on this backend and run its cases."""
    from kernel_hub import get_kernel, validate

    from ..errors import KernelHubError, NoVariantError
    from ..verify.validation import quick_selection

    runs: list[KernelRun] = []
    rows: list[CaseRow] = []
    for repo_id in repo_ids:
        for framework in FRAMEWORKS:
            start = time.perf_counter()
            try:
                module = get_kernel(repo_id, framework=framework)
            except NoVariantError:
                runs.append(KernelRun(kernel=repo_id, framework=framework, version=None, variant=None, backend=None,
                                      passed=0, total=0, seconds=0.0, skipped=f"no {framework} build fits here"))
                continue
            except KernelHubError as exc:
                runs.append(KernelRun(kernel=repo_id, framework=framework, version=None, variant=None, backend=None,
                                      passed=0, total=0, seconds=time.perf_counter() - start,
                                      skipped=f"does not load: {exc}"))
                progress.row(f"  FAIL  {repo_id} [{framework}] does not load: {exc}", ok=False)
                continue
            info = module.__kernel_hub__

            def started(total: int, repo_id: str = repo_id, variant: str = info.variant) -> None:
                progress.phase(f"validate {repo_id} [{variant}]", total)

            def finished(i: int, total: int, c: NumericResult, repo_id: str = repo_id) -> None:
                progress.row(live_row(repo_id, c), ok=c.passed)
                progress.advance()

            try:
                report = validate(module, seed=seed, select=quick_selection if quick else None,
                                     on_start=started, on_case=finished)
            except KernelHubError as exc:  # no cases for this backend/framework
                runs.append(KernelRun(kernel=repo_id, framework=framework, version=info.version, variant=info.variant,
                                      backend=None, passed=0, total=0, seconds=time.perf_counter() - start,
                                      skipped=str(exc)))
                continue
            rows += [case_row(repo_id, framework, c) for c in report.cases]
            runs.append(KernelRun(kernel=repo_id, framework=framework, version=info.version, variant=info.variant,
                                  backend=report.backend, passed=sum(c.passed for c in report.cases),
                                  total=len(report.cases), seconds=time.perf_counter() - start, skipped=None))
    return Validation(seed=seed, runs=runs, cases=rows, matrix=matrix(rows, "mode", by_dtype=True))


def run_compile(kernel_dirs: dict[str, Path], generations: Sequence[str] | None, *, quick: bool, cases: str,
                progress: Progress) -> Compile:
    """compile_matrix for each kernel folder over `generations` (None: every known one; quick: v5e) and `cases`
    ("smoke": the cases tagged smoke, the first forward and backward validation case of each kernel; "all": every
    one, ~60 a kernel, ~2 s each on 2 busy cores, cached per commit). Without the TPU environment, a section that
    says why."""
    from ..tpu.chips import CHIPS
    from ..tpu.compile_gate.gate import compile_matrix
    from ..tpu.env import TpuEnvironmentError, tpu_env
    from ..tpu.package import folder_package

    gens = tuple(generations or (QUICK_GENERATIONS if quick else tuple(CHIPS)))
    try:
        env = tpu_env()
    except TpuEnvironmentError as exc:
        return Compile(available=False, reason=str(exc), generations=list(gens), selection=cases, jax=None,
                       libtpu=None, cases=[], matrix=[])
    rows: list[CaseRow] = []
    progress.phase(f"TPU compile for {', '.join(gens)}", len(kernel_dirs))
    for repo_id, folder in kernel_dirs.items():
        report = compile_matrix(folder_package(folder), gens, tags=["smoke"] if cases == "smoke" else None, env=env)
        mine = [case_row(repo_id, "jax", c) for c in report.cases]
        rows += mine
        ok = sum(r.passed for r in mine)
        cached = sum(r.cached for r in mine)
        progress.row(f"  {'pass' if ok == len(mine) else 'FAIL'}  {repo_id:<30} tpu-compile      {ok}/{len(mine)} "
                     f"compiled ({cached} from the cache)", ok=ok == len(mine))
        progress.advance()
    return Compile(available=True, reason=None, generations=list(gens), selection=cases, jax=env.jax_version,
                   libtpu=env.libtpu_version, cases=rows, matrix=matrix(rows, "generation", by_dtype=False))
