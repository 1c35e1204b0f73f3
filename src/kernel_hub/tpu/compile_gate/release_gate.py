"""The publish gate: a TPU variant (jax-tpu, torch-tpu) is published only when every TPU compile case of its
kernel compiles, with the real TPU compiler, for every generation the variant declares in kernel.yaml
(`tpu_generations`; none declared means every generation kernel-hub knows). The matrix is recorded in the
release (compile_record.py), per variant.

Without a TPU environment the TPU variants are refused with one line naming `kernel-hub setup-tpu`, unless the caller
skips the gate (--skip-tpu-compile), which is announced and recorded as "not compiled". Compile results are
cached (cache.py), so publishing the same kernel content again compiles nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import KernelHubError
from ...package.compile_record import not_compiled, record_from_cases
from ...ui.progress import Progress
from ..chips import CHIPS
from ..env import TpuEnvironmentError, tpu_env
from ..package import VerifiedPackage
from .gate import compile_matrix

SKIP_FLAG = "--skip-tpu-compile"


class CompileGateError(KernelHubError):
    """A TPU variant does not compile for a generation it declares: it is not published."""


def declared_generations(variant: Any) -> tuple[str, ...]:
    """The generations a TPU variant claims: its tpu_generations, or every known one when it names none."""
    return tuple(variant.tpu_generations) or tuple(CHIPS)


def gate_plan(variants: Sequence[Any]) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(generations to compile, variant name -> its generations) for the TPU variants among `variants`; pure.
    Generations come out in kernel-hub's order (CHIPS), so the same kernel always compiles the same matrix."""
    per = {v.name: declared_generations(v) for v in variants if v.backend == "tpu"}
    wanted = {g for gens in per.values() for g in gens}
    unknown = sorted(wanted - set(CHIPS))
    if unknown:
        raise CompileGateError(f"TPU generation {unknown[0]} has no compiler target here (known: {', '.join(CHIPS)})")
    return tuple(g for g in CHIPS if g in wanted), per


def _failure_line(variant: str, failed: list[Any], total: int) -> str:
    first = failed[0]
    error = (first.error or "failed").splitlines()[0][:200]
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    return (f"{variant} does not compile for TPU {first.generation}: {first.name}: {error}{more} "
            f"({len(failed)} of {total} failed)")


def gate_environment(kernel_dir: Path, meta: Any, *, skip: bool) -> Any:
    """What the gate will need, checked in a second before any long work (publish calls it before validating):
    the TPU environment when a TPU variant must compile (None when none must), else CompileGateError /
    TpuEnvironmentError (one line)."""
    _, per_variant = gate_plan(meta.variants)
    if not per_variant or skip:
        return None
    names = ", ".join(per_variant)
    if not (Path(kernel_dir) / meta.python_name / "tpu_cases.py").is_file():
        raise CompileGateError(f"{meta.repo_id}: {names} declare TPU but {meta.python_name}/tpu_cases.py is missing, "
                               f"so nothing shows they compile; add the kernel's TPU compile cases or pass {SKIP_FLAG}")
    try:
        return tpu_env()
    except TpuEnvironmentError as exc:
        raise TpuEnvironmentError(f"{meta.repo_id}: {names} must compile for TPU before they are published: {exc}; "
                                  f"or pass {SKIP_FLAG} to publish them marked 'not compiled'") from None


class _GateProgress:
    """The compile worker's events as live progress: the total once the first worker lists its cases (every
    worker lists the same ones), one step per compiled case. Workers of several generations report at once."""

    def __init__(self, live: Progress, label: str, generations: int) -> None:
        self.live, self.label, self.generations = live, label, generations
        self.lock = threading.Lock()
        self.counted = False

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            if event.get("event") == "cases" and not self.counted:
                self.counted = True
                self.live.phase(f"{self.label}: compiling", len(event.get("names") or ()) * self.generations)
            elif event.get("event") == "result":
                self.live.advance()


def run_gate(kernel_dir: Path, meta: Any, *, skip: bool, log: Callable[[str], None], env: Any = None,
             jobs: int | None = None, package: VerifiedPackage | None = None,
             live: Progress | None = None) -> dict[str, dict[str, Any]]:
    """Variant name -> compile record for every TPU variant of the kernel folder (none: {}), or
    CompileGateError / TpuEnvironmentError (one line) when a TPU variant may not be published.
    `env`: the TPU environment gate_environment found (None: found here). `package`: the folder's TPU build as the
    caller already read and hashed it (None: read here). `live`: progress, told when the compiler starts and as
    each case compiles (cases the cache holds take no time and are not counted)."""
    generations, per_variant = gate_plan(meta.variants)
    if not per_variant:
        return {}
    names = ", ".join(per_variant)
    if skip:
        log(f"skipping the TPU compile gate ({SKIP_FLAG}): {names} published marked 'not compiled for TPU'")
        return {name: not_compiled(f"published with {SKIP_FLAG}") for name in per_variant}
    env = env or gate_environment(kernel_dir, meta, skip=skip)
    label = f"TPU compile gate ({', '.join(generations)})"
    live = live or Progress()
    live.phase(f"{label}: starting the TPU compiler")
    report = compile_matrix(package if package is not None else kernel_dir, generations, env=env, jobs=jobs,
                            on_event=_GateProgress(live, label, len(generations)))
    records: dict[str, dict[str, Any]] = {}
    for name, gens in per_variant.items():
        mine = [c for c in report.cases if c.generation in gens]
        failed = [c for c in mine if not c.passed]
        if not mine:
            raise CompileGateError(f"{meta.repo_id}: {meta.python_name}/tpu_cases.py lists no compile cases, so "
                                   f"nothing shows {name} compiles for TPU; add cases or pass {SKIP_FLAG}")
        if failed:
            raise CompileGateError(f"{meta.repo_id} {meta.version}: {_failure_line(name, failed, len(mine))}; "
                                   f"not publishing ({SKIP_FLAG} overrides)")
        records[name] = record_from_cases(report.cases, gens, report.jax_version, report.libtpu_version)
    seconds = sum(c.compile_seconds or 0.0 for c in report.cases if not c.cached)
    cached = sum(c.cached for c in report.cases)
    cases = len({c.name for c in report.cases})
    log(f"compiled {names} for TPU {','.join(generations)}: {cases} cases x {len(generations)} generations all "
        f"compiled (jax {report.jax_version}, libtpu {report.libtpu_version}; {seconds:.0f} s of compiling, "
        f"{cached} cached)")
    return records
