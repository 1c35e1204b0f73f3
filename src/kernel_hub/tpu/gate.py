"""The TPU compile gate: every TPU case of a kernel compiled by the real TPU compiler, per generation.

`compile_matrix(kernel, ["v5e", "v6e"])` -> ValidationReport whose cases have kind="compile", a generation,
the compile seconds and the compiled memory (argument/output/temp bytes). Results are cached per (kernel
commit, variant, jax, libtpu, generation). `compile_record(report)` is the summary a release records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import KernelHubError
from . import cache
from .chips import parse_generations
from .env import TpuEnv, tpu_env
from .runner import compile_in_worker


@dataclass(frozen=True)
class CompileTarget:
    """The jax-tpu build of one kernel commit, on disk: what the worker loads."""

    repo_id: str
    version: str | None
    commit: str
    variant: str
    package_dir: Path
    entry: str


def _tpu_variant(variants: Sequence[Any], label: str) -> Any:
    for v in variants:
        if v.framework == "jax" and v.backend == "tpu":
            return v
    raise KernelHubError(f"{label} has no jax-tpu variant: nothing to compile for a TPU")


def _from_folder(kernel_dir: Path) -> CompileTarget:
    from ..sources import LocalSource

    source = LocalSource(kernel_dir)
    meta = source.metadata
    variant = _tpu_variant(meta.variants, meta.repo_id)
    build = source.fetch(meta.repo_id, source.commit, variant)
    return CompileTarget(meta.repo_id, meta.version, build.commit, variant.name, Path(build.package_dir),
                         variant.entry)


def _from_repo(repo_id: str, revision: str | None = None) -> CompileTarget:
    from ..api import plan_load

    plan = plan_load(repo_id, revision=revision, backend="tpu", framework="jax")
    if plan.choice.variant is None:
        raise KernelHubError(f"{repo_id} has no jax-tpu build: nothing to compile for a TPU")
    build = plan.source.fetch(repo_id, plan.resolution.commit, plan.choice.variant)
    return CompileTarget(repo_id, plan.resolution.version, build.commit, build.variant.name,
                         Path(build.package_dir), build.variant.entry)


def target_for(kernel: ModuleType | str | Path) -> CompileTarget:
    """A kernel folder (kernel.yaml + package), a repo id, or a loaded kernel module -> its jax-tpu build.

    A module loaded for another backend (jax-cpu on this host) is compiled from the jax-tpu build of the
    same commit: from its own folder when it came from one, else fetched like get_kernel would."""
    if isinstance(kernel, Path) or (isinstance(kernel, str) and Path(kernel).is_dir()):
        return _from_folder(Path(kernel))
    if isinstance(kernel, str):
        return _from_repo(kernel)
    info = getattr(kernel, "__kernel_hub__", None)
    if info is None:
        raise KernelHubError("compile_matrix() takes a kernel folder, a repo id or a module from get_kernel")
    if info.framework == "jax" and info.backend == "tpu":
        return CompileTarget(info.repo_id, info.version, info.commit, info.variant, Path(info.path), "__init__.py")
    folder = Path(info.path).parent
    if (folder / "kernel.yaml").is_file():
        target = _from_folder(folder)
        if target.commit == info.commit:
            return target
    return _from_repo(info.repo_id, revision=info.commit)


def _case_result(record: dict[str, Any], cached: bool) -> Any:
    from ..validation import CaseResult

    passed = bool(record.get("passed"))
    seconds = record.get("compile_seconds")
    return CaseResult(
        name=record["name"], dtype=record.get("dtype", ""), implementation="mosaic", passed=passed,
        max_error=0.0 if passed else math.nan, tolerance=0.0, seconds=float(seconds or 0.0),
        tags=tuple(record.get("tags", ())), error=record.get("error"), kind="compile",
        generation=record["generation"], compile_seconds=seconds, argument_bytes=record.get("argument_bytes"),
        output_bytes=record.get("output_bytes"), temp_bytes=record.get("temp_bytes"), cached=cached,
    )


def _selection_key(names: Sequence[str] | None, tags: Sequence[str] | None) -> str:
    if names is not None:
        return "names:" + ",".join(sorted(names))
    return "tags:" + ",".join(sorted(tags)) if tags else "all"


def compile_matrix(
    kernel: ModuleType | str | Path,
    generations: str | Sequence[str] = ("v5e", "v6e"),
    *,
    names: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    use_cache: bool = True,
    env: TpuEnv | None = None,
) -> Any:
    """Compile the kernel's TPU cases (all, or those named / carrying one of `tags`) for each generation.

    Returns a ValidationReport (backend "tpu"); `.passed` is False if any case failed to compile or none was
    selected. Cases the cache holds for this (commit, variant, jax, libtpu, generation) are not compiled
    again."""
    from ..validation import ValidationReport

    gens = parse_generations(generations)
    target = target_for(kernel)
    env = env or tpu_env()
    selection = _selection_key(names, tags)
    paths = {g: cache.entry_path(target.commit, target.variant, env.jax_version, env.libtpu_version, g)
             for g in gens}
    known: dict[str, dict[str, dict[str, Any]]] = {}
    order: list[str] | None = list(names) if names is not None else None
    for g in gens:
        records, selections = cache.load(paths[g]) if use_cache else ({}, {})
        known[g] = records
        order = order if order is not None else selections.get(selection)
    missing = [g for g in gens if order is None or any(n not in known[g] for n in order)]
    fresh: list[dict[str, Any]] = []
    if missing:
        ask = None if order is None else sorted({n for g in missing for n in order if n not in known[g]})
        fresh = compile_in_worker(env, target.package_dir, target.entry, tuple(missing), names=ask,
                                  tags=None if names is not None else (list(tags) if tags else None))
        if order is None:
            order = list(dict.fromkeys(r["name"] for r in fresh))
        for g in missing:
            mine = {r["name"]: {k: v for k, v in r.items() if k != "event"} for r in fresh if r["generation"] == g}
            cache.store(paths[g], mine, {selection: order})
    fresh_keys = {(r["generation"], r["name"]) for r in fresh}
    report = ValidationReport(target.repo_id, target.version, target.commit, target.variant, "tpu",
                              env.jax_version, libtpu_version=env.libtpu_version, generations=gens)
    by_key = {(r["generation"], r["name"]): r for r in fresh}
    for g in gens:
        for name in order or []:
            if (g, name) in by_key:
                report.cases.append(_case_result(by_key[(g, name)], cached=False))
            elif name in known[g]:
                report.cases.append(_case_result({**known[g][name], "name": name, "generation": g},
                                                 cached=(g, name) not in fresh_keys))
            else:
                report.cases.append(_case_result({"name": name, "generation": g, "passed": False,
                                                  "error": "not compiled (unknown case name)"}, cached=False))
    return report


def compile_record(report: Any) -> dict[str, Any]:
    """What a release records about its TPU compile gate (JSON-ready)."""
    compiled = [c for c in report.cases if getattr(c, "kind", None) == "compile"]
    return {
        "generations": list(report.generations),
        "jax": report.jax_version,
        "libtpu": report.libtpu_version,
        "cases": len({c.name for c in compiled}),
        "compiled": sum(c.passed for c in compiled),
        "failed": sorted(f"{c.generation}:{c.name}" for c in compiled if not c.passed),
        "passed": bool(compiled) and all(c.passed for c in compiled),
    }
