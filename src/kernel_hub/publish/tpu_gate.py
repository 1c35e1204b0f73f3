"""The publish gate: a TPU variant (jax-tpu, torch-tpu) is published only when every TPU compile case of its
kernel compiles, with the real TPU compiler, for every generation the variant declares in kernel.yaml
(`tpu_generations`; none declared means every generation kernel-hub knows). The matrix is recorded in the
release (compile_record.py), per variant.

Without a TPU environment the TPU variants are refused with one line naming `kernel-hub setup-tpu`, unless the caller
skips the gate (--skip-tpu-compile), which is announced and recorded as "not compiled". Compile results are
cached (tpu/compile_gate/cache.py), so publishing the same kernel content again compiles nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..decide.variants import Variant
from ..errors import KernelHubError
from ..json_types import JsonDict
from ..package.compile_record import not_compiled, record_from_cases
from ..tpu.chips import CHIPS
from ..tpu.compile_gate.gate import compile_matrix
from ..tpu.env import TpuEnv, TpuEnvironmentError, tpu_env
from ..ui.progress import Progress
from ..verify.results import CompileResult
from .folder import KernelFolder

SKIP_FLAG = "--skip-tpu-compile"


class CompileGateError(KernelHubError):
    """A TPU variant does not compile for a generation it declares: it is not published."""


def declared_generations(variant: Variant) -> tuple[str, ...]:
    """The generations a TPU variant claims: its tpu_generations, or every known one when it names none."""
    return tuple(variant.tpu_generations) or tuple(CHIPS)


def gate_plan(variants: Sequence[Variant]) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(generations to compile, variant name -> its generations) for the TPU variants among `variants`; pure.
    Generations come out in kernel-hub's order (CHIPS), so the same kernel always compiles the same matrix."""
    per = {v.name: declared_generations(v) for v in variants if v.backend == "tpu"}
    wanted = {g for gens in per.values() for g in gens}
    unknown = sorted(wanted - set(CHIPS))
    if unknown:
        raise CompileGateError(f"TPU generation {unknown[0]} has no compiler target here (known: {', '.join(CHIPS)})")
    return tuple(g for g in CHIPS if g in wanted), per


def _failure_line(variant: str, failed: list[CompileResult], total: int) -> str:
    first = failed[0]
    error = (first.error or "failed").splitlines()[0][:200]
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    return (f"{variant} does not compile for TPU {first.generation}: {first.name}: {error}{more} "
            f"({len(failed)} of {total} failed)")


def gate_environment(folder: KernelFolder, *, skip: bool) -> TpuEnv | None:
    """What the gate will need, checked in a second before any long work (publish calls it before validating).

    Args:
        folder: the kernel folder publish read.
        skip: the gate is skipped (--skip-tpu-compile).

    Returns:
        The TPU environment when a TPU variant must compile, None when none must; CompileGateError /
        TpuEnvironmentError (one line) when one must and cannot."""
    meta = folder.metadata
    _, per_variant = gate_plan(meta.variants)
    if not per_variant or skip:
        return None
    names = ", ".join(per_variant)
    if not (folder.path / meta.python_name / "tpu_cases.py").is_file():
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

    def __call__(self, event: JsonDict) -> None:
        with self.lock:
            if event.get("event") == "cases" and not self.counted:
                self.counted = True
                names = event.get("names")
                self.live.phase(f"{self.label}: compiling", (len(names) if isinstance(names, list) else 0)
                                * self.generations)
            elif event.get("event") == "result":
                self.live.advance()


def run_gate(folder: KernelFolder, *, skip: bool, log: Callable[[str], None], env: TpuEnv | None = None,
             jobs: int | None = None, live: Progress | None = None) -> dict[str, dict[str, Any]]:
    """Compile every TPU variant of a kernel folder for the generations it declares.

    Args:
        folder: the kernel folder publish read; its TPU build is compiled from the files and digests read then.
        skip: record the TPU variants as not compiled instead (--skip-tpu-compile).
        log: where the one-line summary goes.
        env: the TPU environment gate_environment found (None: found here).
        jobs: compiler processes at once (None: compile_matrix's default).
        live: progress, told when the compiler starts and as each case compiles (cached cases take no time and
            are not counted).

    Returns:
        Variant name -> compile record for every TPU variant (none: {}); CompileGateError / TpuEnvironmentError
        (one line) when a TPU variant may not be published."""
    meta = folder.metadata
    generations, per_variant = gate_plan(meta.variants)
    if not per_variant:
        return {}
    names = ", ".join(per_variant)
    if skip:
        log(f"skipping the TPU compile gate ({SKIP_FLAG}): {names} published marked 'not compiled for TPU'")
        return {name: not_compiled(f"published with {SKIP_FLAG}") for name in per_variant}
    env = env or gate_environment(folder, skip=skip)
    label = f"TPU compile gate ({', '.join(generations)})"
    live = live or Progress()
    live.phase(f"{label}: starting the TPU compiler")
    report = compile_matrix(folder.tpu_package(), generations, env=env, jobs=jobs,
                            on_event=_GateProgress(live, label, len(generations)))
    records: dict[str, dict[str, Any]] = {}
    for name, gens in per_variant.items():
        mine = [c for c in report.compiled if c.generation in gens]
        failed = [c for c in mine if not c.passed]
        if not mine:
            raise CompileGateError(f"{meta.repo_id}: {meta.python_name}/tpu_cases.py lists no compile cases, so "
                                   f"nothing shows {name} compiles for TPU; add cases or pass {SKIP_FLAG}")
        if failed:
            raise CompileGateError(f"{meta.repo_id} {meta.version}: {_failure_line(name, failed, len(mine))}; "
                                   f"not publishing ({SKIP_FLAG} overrides)")
        records[name] = record_from_cases(report.compiled, gens, report.jax_version, report.libtpu_version)
    seconds = sum(c.compile_seconds or 0.0 for c in report.compiled if not c.cached)
    cached = sum(c.cached for c in report.compiled)
    cases = len({c.name for c in report.cases})
    log(f"compiled {names} for TPU {','.join(generations)}: {cases} cases x {len(generations)} generations all "
        f"compiled (jax {report.jax_version}, libtpu {report.libtpu_version}; {seconds:.0f} s of compiling, "
        f"{cached} cached)")
    return records
