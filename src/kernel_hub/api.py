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

from .errors import KernelHubError, VersionSpecError
from .load.hf_lock import find as find_hf_lock
from .load.hf_lock import is_hf_lock, read_hf_lock
from .load.lock import get_locked_kernel
from .load.pipeline import load_local, load_plan
from .load.planning import Plan, plan_load, source_for, system_for
from .load.trust import TrustSetting, normalize_trust
from .sources.base import LocalSource
from .tpu.chips import parse_generations
from .tpu.compile_gate.gate import compile_matrix, module_package
from .tpu.env import tpu_env
from .verify.results import ValidationReport
from .verify.validation import require_valid
from .verify.validation import validate as run_validation

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
        compiled = compile_matrix(module_package(kernel), generations, tags=options.get("tags"),
                                  names=options.get("names"), env=environment)
        report.cases.extend(compiled.cases)
        report.libtpu_version, report.generations = compiled.libtpu_version, compiled.generations
    return report
