"""get_kernel and friends: source -> resolve -> variant -> fetch/verify -> import -> (validate)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from .errors import KernelHubError, KernelNotFoundError, NoVariantError, VersionSpecError
from .loader import import_build
from .registry import Registry, load_registry
from .sources import Build, LocalSource, Source
from .system import SystemFacts, detect
from .variants import Choice, Variant, choose_variant, preferred_names
from .versions import Ref, Resolution, resolve


@dataclass(frozen=True)
class Plan:
    """Every decision get_kernel makes, before it fetches or imports anything."""

    repo_id: str
    source: Source
    resolution: Resolution
    choice: Choice
    system: SystemFacts
    framework: str

    def describe(self) -> str:
        r = self.resolution
        lines = [
            f"repo      {self.repo_id}",
            f"source    {getattr(self.source, 'describe', lambda: type(self.source).__name__)()}",
            f"resolve   {r.reason}",
            f"commit    {r.commit}" + (f"  (version {r.version})" if r.version else ""),
            f"system    backend={self.system.backend} tpu={self.system.tpu_generation or '-'} "
            f"jax={self.system.jax_version or '-'} torch={self.system.torch_version or '-'}",
            f"variants  for framework {self.framework}:",
            *self.choice.trace_lines(),
        ]
        chosen = self.choice.variant.name if self.choice.variant else "none fits"
        lines.append(f"chosen    {chosen}")
        return "\n".join(lines)


def check_repo_id(repo_id: object) -> str:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise KernelNotFoundError(f"repo id must look like ORG/NAME, got {repo_id!r}")
    return repo_id


class HubOrLocal:
    """A registry kernel with both a Hub repo and a source path: the Hub when it answers, else the source.

    The choice is made once, at the first refs() call, and describe() says which and why.
    """

    def __init__(self, hub: Source, local: LocalSource):
        self.hub, self.local = hub, local
        self.active: Source | None = None
        self.reason = ""

    def refs(self, repo_id: str) -> list[Ref]:
        if self.active is None:
            try:
                refs = self.hub.refs(repo_id)
                self.active, self.reason = self.hub, "the Hub answered"
                return refs
            except KernelHubError as exc:
                self.active, self.reason = self.local, f"Hub unavailable ({exc}); source path serves"
        return self.active.refs(repo_id)

    def _source(self, repo_id: str) -> Source:
        if self.active is None:
            self.refs(repo_id)
        assert self.active is not None
        return self.active

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        return self._source(repo_id).variants(repo_id, commit)

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        source = self._source(repo_id)
        probe = getattr(source, "candidate_variants", None)
        return probe(repo_id, commit, names) if probe else source.variants(repo_id, commit)

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        return self._source(repo_id).fetch(repo_id, commit, variant)

    def describe(self) -> str:
        active = self.active or self.hub
        return f"{getattr(active, 'describe', lambda: type(active).__name__)()} ({self.reason or 'not asked yet'})"


def source_for(repo_id: str, registry: Registry) -> Source:
    """Where a kernel comes from: the registry's source path, or the Hub (through huggingface_hub);
    an entry naming both uses the Hub when it answers and the source path when it does not."""
    check_repo_id(repo_id)
    entry = registry.get(repo_id)
    local = entry is not None and entry.source is not None and entry.source.is_dir()
    if local and entry.hub_repo is None:
        return LocalSource(entry.source)
    if local:
        from .hub import HubSource

        return HubOrLocal(HubSource.for_repo(repo_id, registry_entry=entry), LocalSource(entry.source))
    try:
        from .hub import HubSource
    except ImportError:
        raise KernelNotFoundError(
            f"unknown kernel repo {repo_id!r}: not in the registry and the Hub client is unavailable"
        ) from None
    return HubSource.for_repo(repo_id, registry_entry=entry)


def _system(system: SystemFacts | None, framework: str, backend: str | None) -> SystemFacts:
    facts = system or detect(framework)
    if backend is not None and backend != facts.backend:
        facts = replace(facts, backend=backend, tpu_generation=facts.tpu_generation if backend == "tpu" else None)
    return facts


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
) -> Plan:
    """Resolve the version and choose the variant; raises with the trace when nothing fits."""
    check_repo_id(repo_id)
    registry = registry if registry is not None else load_registry()
    if version is None and revision is None:
        entry = registry.get(repo_id)
        if entry is None or entry.version is None:
            raise VersionSpecError(
                f"{repo_id} is not in the registry with a default version: pass version= or revision="
            )
        version = entry.version
    source = source or source_for(repo_id, registry)
    resolution = resolve(source.refs(repo_id), version=version, revision=revision)
    facts = _system(system, framework, backend)
    probe = getattr(source, "candidate_variants", None)
    variants = (probe(repo_id, resolution.commit, preferred_names(facts, framework)) if probe
                else source.variants(repo_id, resolution.commit))
    choice = choose_variant(variants, facts, framework)
    return Plan(repo_id, source, resolution, choice, facts, framework)


def load_plan(plan: Plan, *, validate: bool = False) -> ModuleType:
    """Fetch, verify and import the planned build; optionally validate it on this device."""
    if plan.choice.variant is None:
        trace = "\n".join(plan.choice.trace_lines())
        raise NoVariantError(f"no build of {plan.repo_id} fits this system:\n{trace}")
    build = plan.source.fetch(plan.repo_id, plan.resolution.commit, plan.choice.variant)
    if build.version is None and plan.resolution.version is not None:
        build = replace(build, version=plan.resolution.version)
    module = import_build(build)
    if validate:
        from .validation import require_valid

        require_valid(module, backend=plan.system.backend)
    return module


def get_kernel(
    repo_id: str,
    *,
    version: int | str | None = None,
    revision: str | None = None,
    backend: str | None = None,
    framework: str = "jax",
    trust_remote_code: bool = False,
    validate: bool = False,
    lockfile: str | Path | None = None,
) -> ModuleType:
    """Load the build of `repo_id` that fits this machine.

    version: an int asks for the major branch `v<N>`; a string is a PEP 440 spec over release tags.
    revision: any branch, tag or commit. Neither: the registry's default spec for the repo.
    framework: "jax" for JAX-facing builds, "torch" for the torch-facing ones.
    lockfile: load exactly the commit and variant a `kernel-hub lock` file records, every digest checked.
    """
    from .trust import check_trust

    if lockfile is not None:
        if version is not None or revision is not None:
            raise VersionSpecError("a lock file fixes the version: drop version=/revision= or lockfile=")
        from .lock import get_locked_kernel

        module = get_locked_kernel(repo_id, lockfile=lockfile, framework=framework)
        if validate:
            from .validation import require_valid

            require_valid(module, backend=backend or detect(framework).backend)
        return module

    plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework)
    check_trust(plan.source, repo_id, trust_remote_code)
    return load_plan(plan, validate=validate)


def get_local_kernel(
    path: str | Path, *, backend: str | None = None, framework: str = "jax", validate: bool = False
) -> ModuleType:
    """Load a kernel folder (kernel.yaml + package) from disk, as it is now."""
    source = LocalSource(Path(path))
    meta = source.metadata
    facts = _system(None, framework, backend)
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
    """True when a build of `repo_id` exists for this system (nothing is downloaded or imported)."""
    try:
        plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework)
    except KernelHubError:
        return False
    return plan.choice.variant is not None
