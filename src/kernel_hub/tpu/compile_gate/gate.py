"""The TPU compile gate: every TPU case of a kernel compiled by the real TPU compiler, per generation.

`compile_matrix(package, ["v5e", "v6e"])` -> ValidationReport of CompileResult cases: a generation, the compile
seconds and the compiled memory (argument/output/temp bytes). It takes one kind of input, a VerifiedPackage; callers
convert first (tpu.package.folder_package for a kernel folder, repo_package for a repo id, module_package for a
loaded kernel). Results are cached per (package content and the kernel's own environment variables, variant, jax,
libtpu, generation).
`compile_record(report)` is the summary a release records.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ...errors import KernelHubError, NoVariantError
from ...load.loader import verified_digests
from ...load.planning import plan_load
from ...load.trust import TrustPolicy
from ...package.compile_record import TpuCompileRecord, record_from_cases
from ...package.integrity import combined_digest
from ...verify.results import CompileResult, ValidationReport
from ..chips import parse_generations
from ..env import TpuEnv, tpu_env
from ..package import VerifiedPackage, folder_package, from_build
from . import cache
from .worker_pool import compile_in_worker


def repo_package(repo_id: str, trust: TrustPolicy, revision: str | None = None) -> VerifiedPackage:
    """The TPU build of a repo, as get_kernel would load it: the same trust check (plan_load), fetched and verified.

    Args:
        repo_id: the Hub repo.
        trust: the policy the caller read once at its public edge (trust.trust_policy).
        revision: a commit or ref (None: the newest release).

    Returns:
        The jax-tpu build, fetched and hashed.

    Raises:
        NoVariantError: no jax-tpu build fits (Plan.chosen_variant decides, its trace in the message)."""
    plan = plan_load(repo_id, revision=revision, backend="tpu", framework="jax", trust=trust)
    try:
        plan.chosen_variant()
    except NoVariantError as exc:
        raise NoVariantError(f"nothing to compile for a TPU: {exc}") from None
    return from_build(plan.fetch())


def module_package(kernel: ModuleType) -> VerifiedPackage:
    """The TPU build of a loaded kernel module, verified.

    A module loaded for another backend (jax-cpu on this host) is compiled from the jax-tpu build of the same
    commit: from its own folder when it came from one, else fetched from the repo it was loaded from (trusted: it
    was loaded)."""
    info = getattr(kernel, "__kernel_hub__", None)
    if info is None:
        raise KernelHubError("the compile gate takes a module from get_kernel/get_local_kernel")
    digests = verified_digests(kernel)
    if info.backend == "tpu" and digests is not None:
        return VerifiedPackage(info.repo_id, info.version, info.commit, info.variant, Path(info.path), "__init__.py",
                               digests, info.framework)
    # the kernel folder it was assembled from (a local source records it as `source`), else the package's parent
    for folder in (Path(info.source), Path(info.path).parent):
        if (folder / "kernel.yaml").is_file():
            target = folder_package(folder)
            if target.commit == info.commit:
                return target
    return repo_package(info.repo_id, TrustPolicy(named=(info.repo_id,)), revision=info.commit)


def tuning_environment(target: VerifiedPackage, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a kernel reads while it traces (named after its package: FLASH_ATTENTION_PAGED_BLOCKS for
    flash_attention), set in `environ`: the compile worker inherits them, and they change what compiles."""
    prefix = target.package_dir.name.upper() + "_"
    return {k: environ[k] for k in sorted(environ) if k.startswith(prefix)}


def content_key(target: VerifiedPackage, environ: Mapping[str, str] | None = None) -> str:
    """The cache key of a build: a 40-hex digest of its package files (what the worker imports, nothing else),
    so the same kernel code under a new version or from another source is not compiled again; with the kernel's
    own variables set (tuning_environment of `environ`, default os.environ), a digest of both, so a block override
    is compiled, never answered from the default's result."""
    code = combined_digest(dict(target.digests))[:40] if target.digests else target.commit
    tuning = tuning_environment(target, os.environ if environ is None else environ)
    if not tuning:
        return code
    return hashlib.sha256(json.dumps([code, tuning]).encode()).hexdigest()[:40]


def _case_result(record: dict[str, Any], cached: bool) -> CompileResult:
    return CompileResult(
        name=record["name"], dtype=record.get("dtype", ""), implementation=record.get("implementation"),
        passed=bool(record.get("passed")), tags=tuple(record.get("tags", ())), error=record.get("error"),
        generation=record["generation"], compile_seconds=record.get("compile_seconds"),
        argument_bytes=record.get("argument_bytes"), output_bytes=record.get("output_bytes"),
        temp_bytes=record.get("temp_bytes"), cached=cached, tuning=record.get("tuning"),
    )


def _selection_key(names: Sequence[str] | None, tags: Sequence[str] | None) -> str:
    if names is not None:
        return "names:" + ",".join(sorted(names))
    return "tags:" + ",".join(sorted(tags)) if tags else "all"


def compile_matrix(
    target: VerifiedPackage,
    generations: str | Sequence[str] = ("v5e", "v6e"),
    *,
    names: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    use_cache: bool = True,
    env: TpuEnv | None = None,
    jobs: int | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> ValidationReport:
    """Compile a verified TPU build's cases (all, or those named / carrying one of `tags`) for each generation.

    Cases the cache holds for this (package content, variant, jax, libtpu, generation) are not compiled again; the
    worker imports only the verified files.

    Args:
        target: the build, already verified: folder_package (a kernel folder), repo_package (a repo id, trust
            checked), module_package (a loaded kernel).
        generations: TPU generations, a list or "v5e,v6e".
        names, tags: the cases to compile (None: all).
        use_cache: serve cached results.
        env: the TPU environment (None: found here).
        jobs: compiler processes at once (default: one per generation, up to the CPU count).
        on_event: each compile worker event as it happens (live progress); cached cases send none.

    Returns:
        A ValidationReport (backend "tpu") of CompileResult cases; `.passed` is False if any case failed to
        compile or none was selected."""
    if not isinstance(target, VerifiedPackage):
        raise KernelHubError(f"compile_matrix takes a VerifiedPackage, not {type(target).__name__}: convert a kernel "
                             "folder with tpu.package.folder_package, a repo id with repo_package, a loaded kernel "
                             "with module_package")
    gens = parse_generations(generations)
    env = env or tpu_env()
    selection = _selection_key(names, tags)
    key = content_key(target)
    paths = {g: cache.entry_path(key, target.variant, env.jax_version, env.libtpu_version, g) for g in gens}
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
        fresh = compile_in_worker(env, target, tuple(missing), names=ask,
                                  tags=None if names is not None else (list(tags) if tags else None), jobs=jobs,
                                  on_event=on_event)
        if order is None:
            order = list(dict.fromkeys(r["name"] for r in fresh))
        for g in missing:
            mine = {r["name"]: {k: v for k, v in r.items() if k != "event"} for r in fresh if r["generation"] == g}
            cache.store(paths[g], mine, {selection: order})
    report = ValidationReport(target.repo_id, target.version, target.commit, target.variant, "tpu",
                              env.jax_version, libtpu_version=env.libtpu_version, generations=gens)
    by_key = {(r["generation"], r["name"]): r for r in fresh}
    for g in gens:
        for name in order or []:
            if (g, name) in by_key:
                report.cases.append(_case_result(by_key[(g, name)], cached=False))
            elif name in known[g]:
                report.cases.append(_case_result({**known[g][name], "name": name, "generation": g},
                                                 cached=True))
            else:
                report.cases.append(_case_result({"name": name, "generation": g, "passed": False,
                                                  "error": "not compiled (unknown case name)"}, cached=False))
    return report


def compile_record(report: ValidationReport, generations: Sequence[str] | None = None) -> dict[str, Any]:
    """What a release records about its TPU compile gate (JSON-ready, compile_record.py's schema) for `generations`
    (default: all of the report's), plus "passed"."""
    gens = list(report.generations if generations is None else generations)
    record = record_from_cases(report.compiled, gens, report.jax_version, report.libtpu_version)
    return {**record, "passed": TpuCompileRecord.model_validate(record).passed}
