"""get_kernel and friends: plan (source -> resolve -> variant) -> trust -> fetch/verify -> import -> (validate).

Every path here that imports a kernel passes the one trust check (trust.check_trust) on the repo actually
fetched, before anything is downloaded or imported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .decide.variants import choose_variant
from .decide.versions import Resolution
from .errors import KernelHubError, VersionSpecError
from .load.depends import Graph, hf_kernel_deps, load_dependency, walk
from .load.hf_lock import find as find_hf_lock
from .load.hf_lock import is_hf_lock, read_hf_lock
from .load.loader import import_build
from .load.lock import get_locked_kernel
from .load.planning import Plan, plan_load, source_for, system_for
from .load.trust import TrustSetting, normalize_trust
from .sources.base import LocalSource
from .tpu.chips import parse_generations
from .tpu.compile_gate.gate import compile_matrix
from .tpu.env import tpu_env
from .verify.validation import ValidationReport, require_valid
from .verify.validation import validate as run_validation

_log = logging.getLogger("kernel_hub")

__all__ = ["Plan", "get_kernel", "get_local_kernel", "has_kernel", "load_plan", "plan_load", "source_for",
           "validate"]


def load_plan(plan: Plan, *, validate: bool = False, trust_remote_code: TrustSetting = False) -> ModuleType:
    """Check trust, fetch, verify and import the planned build (Plan.fetch); optionally validate it here.

    A kernel-builder build's `kernel-depends` load first, each through this same path (plan, trust, fetch,
    verify, import) on the same source, each once per graph and at most depends.MAX_DEPENDS_DEPTH levels deep; the
    kernel finds them as `__kernel_deps__` and, where HF `kernels` is installed, through its `get_kernel_dep` while
    it imports."""
    build = plan.fetch(normalize_trust(trust_remote_code))  # normalized: None here means "trust nothing extra"
    with walk(plan.repo_id) as graph:
        deps = _load_kernel_depends(graph, plan, build.kernel_depends, trust_remote_code)
    with hf_kernel_deps(deps):
        module = import_build(build)
    if deps:
        module.__kernel_deps__ = deps  # type: ignore[attr-defined]
    origin = plan.origin
    served = f"{origin.kind} {origin.location}"  # e.g. "hub http://127.0.0.1:8080", "local /…/kernels/pallas/x"
    module.__kernel_hub_source__ = served  # type: ignore[attr-defined]
    _log.info("kernel-hub: %s %s [%s] served by %s (%s)", plan.repo_id, build.version or build.commit[:12],
              build.variant.name, served, plan.source.describe())
    if validate:
        require_valid(module, backend=plan.system.backend)
    return module


def _load_kernel_depends(graph: Graph, plan: Plan, depends: tuple[tuple[str, str, str], ...],
                         trust_remote_code: TrustSetting) -> dict[str, ModuleType]:
    """Every kernel a build depends on, loaded as get_kernel loads it, from the same source, once per graph."""
    out: dict[str, ModuleType] = {}
    hub_like = plan.origin.kind == "hub"
    for repo, kind, value in depends:
        def load(repo: str = repo, kind: str = kind, value: str = value) -> ModuleType:
            dep_plan = plan_load(repo, version=int(value) if kind == "version" else None,
                                 revision=value if kind == "revision" else None, framework=plan.framework,
                                 system=plan.system, source=plan.source if hub_like else None,
                                 trust_remote_code=trust_remote_code)
            return load_plan(dep_plan, trust_remote_code=trust_remote_code)

        out[repo] = load_dependency(graph, repo, (repo, kind, str(value), plan.framework), f"{kind} {value}", load)
    return out


def get_kernel(
    repo_id: str,
    *,
    version: int | str | None = None,
    revision: str | None = None,
    backend: str | None = None,
    framework: str = "jax",
    trust_remote_code: TrustSetting = False,
    validate: bool = False,
    lockfile: str | Path | None = None,
    source: str | None = None,
) -> ModuleType:
    """Load the build of `repo_id` that fits this machine.

    version: an int asks for the major branch `v<N>`; a string is a PEP 440 spec over release tags.
    revision: any branch, tag or commit. Neither: the registry's default spec for the repo.
    framework: "jax" for JAX-facing builds, "torch" for the torch-facing ones.
    trust_remote_code: True, or a list of repos ("org/name") and organisations ("org") to trust beyond the
        trusted organisations (see kernel_hub.load.trust).
    lockfile: load exactly the commit and variant a `kernel-hub lock` file records, every digest checked; an HF
        kernels `kernels.lock` (kernel_hub.load.hf_lock) pins the commit, loaded as revision= would be.
    source: "hub" loads from the Hub at HF_ENDPOINT even where the registry names a source path (the checkout's
        copy), "local" only from that path, "auto"/None the registry's choice ($KERNEL_HUB_SOURCE sets the default).
        The module's `__kernel_hub_source__` (and an INFO log line on the "kernel_hub" logger) says which served it.
    """
    normalize_trust(trust_remote_code)  # a malformed setting is refused before any work
    if lockfile is not None:
        if version is not None or revision is not None:
            raise VersionSpecError("a lock file fixes the version: drop version=/revision= or lockfile=")
        if is_hf_lock(Path(lockfile)):  # HF kernels' kernels.lock: a commit per repo, loaded as revision=
            entry = find_hf_lock(read_hf_lock(Path(lockfile)), repo_id, Path(lockfile))
            plan = plan_load(repo_id, revision=entry.commit, backend=backend, framework=framework,
                             trust_remote_code=trust_remote_code, where=source)
            return load_plan(plan, validate=validate, trust_remote_code=trust_remote_code)
        module = get_locked_kernel(repo_id, lockfile=lockfile, framework=framework,
                                   trust_remote_code=trust_remote_code)
        if validate:
            require_valid(module, backend=system_for(None, framework, backend).backend)
        return module

    plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework,
                     trust_remote_code=trust_remote_code, where=source)
    return load_plan(plan, validate=validate, trust_remote_code=trust_remote_code)


def get_local_kernel(
    path: str | Path, *, backend: str | None = None, framework: str = "jax", validate: bool = False
) -> ModuleType:
    """Load a kernel folder (kernel.yaml + package) from disk, as it is now."""
    folder = Path(path)
    if not folder.is_dir():
        raise KernelHubError(f"{folder} is not a kernel folder (a folder holding kernel.yaml)")
    return load_local(LocalSource(folder), backend=backend, framework=framework, validate=validate)


def load_local(source: LocalSource, *, backend: str | None = None, framework: str = "jax",
               validate: bool = False) -> ModuleType:
    """Load a kernel folder already read (publish reads its folder once and loads what it read)."""
    meta = source.metadata
    facts = system_for(None, framework, backend)
    resolution = Resolution(source.commit, f"v{meta.version}", meta.version, f"local folder {source.kernel_dir}")
    choice = choose_variant(list(meta.variants), facts, framework)
    plan = Plan(meta.repo_id, source, resolution, choice, facts, framework)
    return load_plan(plan, validate=validate)


def has_kernel(
    repo_id: str,
    *,
    version: int | str | None = None,
    revision: str | None = None,
    backend: str | None = None,
    framework: str = "jax",
) -> bool:
    """True when a build of `repo_id` exists for this system (nothing is imported)."""
    try:
        plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework)
    except KernelHubError:
        return False
    return plan.choice.variant is not None


def validate(kernel: ModuleType | str, *, backend: str | None = None, version: int | str | None = None,
             revision: str | None = None, framework: str = "jax", trust_remote_code: TrustSetting = False,
             lockfile: str | Path | None = None, tpu: str | Sequence[str] | None = None,
             **options: Any) -> ValidationReport:
    """Check a kernel's numbers against its reference on this device: a loaded kernel, or a repo id loaded
    with get_kernel first (trust check included). `options` go to kernel_hub.verify.validation.validate.

    tpu=["v5e", "v6e"] (or "v5e,v6e") adds every TPU compile case of the kernel (those `tags`/`names` select),
    compiled by the real TPU compiler for each generation (kernel_hub.tpu.compile_gate.gate; needs the TPU environment,
    `kernel-hub setup-tpu`). A missing TPU environment or an unknown generation is said before any case runs."""
    generations, environment = None, None
    if tpu:
        generations = parse_generations(tpu)
        environment = tpu_env()
    if isinstance(kernel, str):
        kernel = get_kernel(kernel, version=version, revision=revision, backend=backend, framework=framework,
                            trust_remote_code=trust_remote_code, lockfile=lockfile)
    report = run_validation(kernel, backend=backend, other_cases=bool(generations), **options)
    if generations:
        compiled = compile_matrix(kernel, generations, tags=options.get("tags"), names=options.get("names"),
                                  env=environment)
        report.cases.extend(compiled.cases)
        report.libtpu_version, report.generations = compiled.libtpu_version, compiled.generations
    return report
