"""get_kernel and friends: plan (source -> resolve -> variant) -> trust -> fetch/verify -> import -> (validate).

The public edge: each function here reads `trust_remote_code` once (trust.trust_policy) and hands the TrustPolicy
down, so a malformed setting is refused before any work and the repo actually fetched passes the one trust check
(trust.check_trust) before anything is downloaded or imported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .decide.system import SystemFacts
from .errors import KernelHubError, VersionSpecError
from .load import pipeline, planning
from .load.hf_lock import find as find_hf_lock
from .load.hf_lock import is_hf_lock, read_hf_lock
from .load.lock import load_locked
from .load.planning import Plan, source_for, system_for
from .load.registry import Registry
from .load.trust import TrustSetting, trust_policy
from .sources.base import LocalSource, Source
from .tpu.chips import parse_generations
from .tpu.compile_gate.gate import compile_matrix, module_package
from .tpu.env import tpu_env
from .verify.results import ValidationReport
from .verify.validation import require_valid
from .verify.validation import validate as run_validation

if TYPE_CHECKING:
    from typing import Unpack

    from .verify.validation import ValidationOptions

_log = logging.getLogger("kernel_hub")

__all__ = ["Plan", "get_kernel", "get_local_kernel", "has_kernel", "load_plan", "plan_load", "source_for",
           "validate"]


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

    Args:
        repo_id: "org/name" on the Hub, or a registry.yaml alias.
        version: an int asks for the major branch `v<N>`; a string is a PEP 440 spec over release tags.
        revision: any branch, tag or commit. Neither: the registry's default spec for the repo.
        backend: force "cpu", "tpu", "cuda", ... instead of this machine's.
        framework: "jax" for JAX-facing builds, "torch" for the torch-facing ones.
        trust_remote_code: True, or a list of repos ("org/name") and organisations ("org") to trust beyond the
            trusted organisations (see kernel_hub.load.trust).
        validate: check the kernel's numbers against its reference before returning it.
        lockfile: load exactly the commit and variant a `kernel-hub lock` file records, every digest checked; an HF
            kernels `kernels.lock` (kernel_hub.load.hf_lock) pins the commit, loaded as revision= would be.
        source: "hub" loads from the Hub at HF_ENDPOINT even where the registry names a source path (the checkout's
            copy), "local" only from that path, "auto"/None the registry's choice ($KERNEL_HUB_SOURCE sets the
            default).
    Returns:
        The kernel module; its `__kernel_hub_source__` (and an INFO line on the "kernel_hub" logger) says which
        source served it.
    Raises:
        TrustError: a malformed trust_remote_code (before any work) or an untrusted repo (before any download).
        KernelHubError: the repo, version or build cannot be found, fetched, verified or validated.
    """
    trust = trust_policy(trust_remote_code)
    if lockfile is not None:
        if version is not None or revision is not None:
            raise VersionSpecError("a lock file fixes the version: drop version=/revision= or lockfile=")
        if is_hf_lock(Path(lockfile)):  # HF kernels' kernels.lock: a commit per repo, loaded as revision=
            entry = find_hf_lock(read_hf_lock(Path(lockfile)), repo_id, Path(lockfile))
            plan = planning.plan_load(repo_id, revision=entry.commit, backend=backend, framework=framework,
                                      trust=trust, source_choice=source)
            return pipeline.load_plan(plan, validate=validate)
        module = load_locked(repo_id, lockfile=lockfile, framework=framework, trust=trust)
        if validate:
            require_valid(module, backend=system_for(None, framework, backend).backend)
        return module

    plan = planning.plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework,
                              trust=trust, source_choice=source)
    return pipeline.load_plan(plan, validate=validate)


def get_local_kernel(
    path: str | Path, *, backend: str | None = None, framework: str = "jax", validate: bool = False
) -> ModuleType:
    """Load a kernel folder (kernel.yaml + package) from disk, as it is now: code the user already has, so no
    trust setting applies.

    Args:
        path: the kernel folder.
        backend, framework, validate: as for get_kernel.
    Returns:
        The kernel module.
    Raises:
        KernelHubError: `path` is not a kernel folder, or its build does not load.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise KernelHubError(f"{folder} is not a kernel folder (a folder holding kernel.yaml)")
    return pipeline.load_local(LocalSource(folder), backend=backend, framework=framework, validate=validate)


def has_kernel(
    repo_id: str,
    *,
    version: int | str | None = None,
    revision: str | None = None,
    backend: str | None = None,
    framework: str = "jax",
) -> bool:
    """Whether a build of `repo_id` exists for this system; nothing is imported, so no trust setting applies.

    Args:
        repo_id, version, revision, backend, framework: as for get_kernel.
    Returns:
        True when a build fits; False when none does or the repo cannot be resolved.
    """
    try:
        plan = planning.plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework)
    except KernelHubError:
        return False
    return plan.choice.variant is not None


def plan_load(
    repo_id: str,
    *,
    version: int | str | None = None,
    revision: str | None = None,
    backend: str | None = None,
    framework: str = "jax",
    system: SystemFacts | None = None,
    registry: Registry | None = None,
    source: Source | None = None,
    trust_remote_code: TrustSetting = None,
    source_choice: str | None = None,
) -> Plan:
    """Every decision get_kernel makes (source, commit, variant, each with its reason), nothing imported.

    Args:
        repo_id, version, revision, backend, framework: as for get_kernel.
        system: the machine facts to plan for (default: this machine's).
        registry: the registry to read (default: registry.yaml).
        source: a Source to plan from instead of the registry's choice.
        trust_remote_code: given (even False), the repo is trust-checked before anything is downloaded and the plan
            can be loaded under that setting; None (the default): no check, for a plan that is only read.
        source_choice: get_kernel's `source=` ("hub", "local" or "auto"), where `source` is not given.
    Returns:
        The Plan (`describe()` says why each choice was made).
    Raises:
        TrustError: an untrusted repo when trust_remote_code is given. KernelHubError: nothing to resolve.
    """
    trust = None if trust_remote_code is None else trust_policy(trust_remote_code)
    return planning.plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework,
                              system=system, registry=registry, source=source, trust=trust,
                              source_choice=source_choice)


def load_plan(plan: Plan, *, validate: bool = False, trust_remote_code: TrustSetting = False) -> ModuleType:
    """Fetch, verify and import what `plan` chose.

    Args:
        plan: from plan_load.
        validate: as for get_kernel.
        trust_remote_code: as for get_kernel; the repo is checked against it unless plan_load already checked it
            against the same setting.
    Returns:
        The kernel module.
    Raises:
        NoVariantError: the plan chose no build. TrustError: a malformed setting or an untrusted repo, before any
        download.
    """
    trust = trust_policy(trust_remote_code)
    plan.chosen_variant()  # a plan that chose nothing says so before any trust question
    return pipeline.load_plan(plan.trusted(trust), validate=validate)


def validate(kernel: ModuleType | str, *, backend: str | None = None, version: int | str | None = None,
             revision: str | None = None, framework: str = "jax", trust_remote_code: TrustSetting = False,
             lockfile: str | Path | None = None, tpu: str | Sequence[str] | None = None,
             **options: Unpack[ValidationOptions]) -> ValidationReport:
    """Check a kernel's numbers against its reference on this device, and optionally compile its TPU cases.

    Args:
        kernel: a loaded kernel, or a repo id loaded with get_kernel first (trust check included).
        backend, version, revision, framework, trust_remote_code, lockfile: as for get_kernel.
        tpu: generations (["v5e", "v6e"] or "v5e,v6e") to compile every TPU case of the kernel for (those
            `tags`/`names` select), by the real TPU compiler (kernel_hub.tpu.compile_gate.gate; needs the TPU
            environment, `kernel-hub setup-tpu`).
        options: passed to kernel_hub.verify.validation.validate.
    Returns:
        The ValidationReport, compile cases included.
    Raises:
        KernelHubError: a missing TPU environment or an unknown generation, said before any case runs; anything
        get_kernel raises.
    """
    generations, environment = None, None
    if tpu:
        generations = parse_generations(tpu)
        environment = tpu_env()
    if isinstance(kernel, str):
        kernel = get_kernel(kernel, version=version, revision=revision, backend=backend, framework=framework,
                            trust_remote_code=trust_remote_code, lockfile=lockfile)
    report = run_validation(kernel, backend=backend, other_cases=bool(generations), **options)
    if generations:
        compiled = compile_matrix(module_package(kernel), generations, tags=options.get("tags"),
                                  names=options.get("names"), env=environment)
        report.cases.extend(compiled.cases)
        report.libtpu_version, report.generations = compiled.libtpu_version, compiled.generations
    return report
