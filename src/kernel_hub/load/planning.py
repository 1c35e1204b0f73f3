"""The decisions before anything is fetched: which source serves a repo, which commit the asked version names,
which build variant fits this system. get_kernel, lock, download and `kernel-hub resolve` all start here.
Callers that import or lock pass their TrustPolicy, so an untrusted repo is refused before any download, and the
plan records the policy its origin passed; Plan.fetch hands over a build only from such a plan (get_kernel, lock,
the TPU compile gate), Plan.download from any plan (`kernel-hub download` imports nothing)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..decide.hf_conventions import local_override
from ..decide.system import BACKENDS, SystemFacts, detect
from ..decide.variants import Choice, Variant, choose_variant, preferred_names
from ..decide.versions import Resolution, resolve
from ..errors import KernelHubError, KernelNotFoundError, NoVariantError, TrustError, VersionSpecError
from ..names import check_repo_id
from ..package.buildfmt import FRAMEWORKS
from ..sources.base import Build, HubOrLocal, LocalSource, Origin, Source
from .registry import Registry, load_registry
from .trust import TrustPolicy, check_trust

#: Rejected variants a "no build fits" error shows; the rest are counted (`kernel-hub resolve` prints them all).
MAX_TRACE_LINES = 10


@dataclass(frozen=True)
class Plan:
    """Every decision get_kernel makes, before it fetches or imports anything."""

    repo_id: str
    source: Source
    resolution: Resolution
    choice: Choice
    system: SystemFacts
    framework: str
    #: The trust policy this plan's origin passed (plan_load or trusted() checked it); None: planned to resolve or
    #: download only, so fetch refuses it.
    trust: TrustPolicy | None = None

    @property
    def origin(self) -> Origin:
        """Where the code comes from (the repo actually fetched): what the trust check judges."""
        return self.source.origin(self.repo_id)

    def no_fit(self) -> NoVariantError:
        """The error for a plan that chose nothing: the trace of every variant's rejection, or one line when the
        commit publishes none."""
        where = f"{self.repo_id}@{self.resolution.version or self.resolution.commit[:12]}"
        if not self.choice.trace:
            return NoVariantError(f"no build of {where} fits this system: it publishes no usable build variant")
        lines = self.choice.trace_lines()
        more = len(lines) - MAX_TRACE_LINES
        shown = lines[:MAX_TRACE_LINES] + ([f"  ... and {more} more variants rejected (kernel-hub resolve lists them "
                                             "all)"] if more > 0 else [])
        return NoVariantError(f"no build of {where} fits this system ({len(lines)} variants):\n" + "\n".join(shown))

    def chosen_variant(self) -> Variant:
        """The build variant this plan chose: the one place a plan that chose none becomes its error (`no_fit`),
        checked before any trust question or fetch.

        Raises:
            NoVariantError: no variant fits.
        """
        if self.choice.variant is None:
            raise self.no_fit()
        return self.choice.variant

    def trusted(self, policy: TrustPolicy) -> Plan:
        """This plan, its origin checked against `policy` (for a plan made without one, or with another).

        Raises:
            TrustError: the origin is not trusted under `policy`.
        """
        if self.trust == policy:
            return self
        check_trust(self.origin, policy, asked_for=self.repo_id)
        return replace(self, trust=policy)

    def fetch(self) -> Build:
        """The planned build on local disk for a caller that imports or locks it: only from a plan whose origin
        passed a trust policy (plan_load(trust=...) or trusted()).

        Raises:
            NoVariantError: the plan chose no variant. TrustError: the plan was made without a trust policy.
        """
        self.chosen_variant()
        if self.trust is None:
            raise TrustError(f"{self.repo_id}: this plan was made without a trust policy, so it is not fetched to be "
                             "imported; plan it with one (plan_load trust_remote_code=) or pass it to load_plan")
        return self.download()

    def download(self) -> Build:
        """The planned build on local disk, every digest checked, its version filled in from the resolution where
        the build names none. Checks no trust: for a caller that imports nothing (`kernel-hub download`)."""
        build = self.source.fetch(self.repo_id, self.resolution.commit, self.chosen_variant())
        if build.version is None and self.resolution.version is not None:
            build = replace(build, version=self.resolution.version)
        return build

    def describe(self) -> str:
        r = self.resolution
        lines = [
            f"repo      {self.repo_id}",
            f"source    {self.source.describe()}",
            f"resolve   {r.reason}",
            f"commit    {r.commit}" + (f"  (version {r.version})" if r.version else ""),
            f"system    backend={self.system.backend} tpu={self.system.tpu_generation or '-'} "
            f"jax={self.system.jax_version or '-'} torch={self.system.torch_version or '-'}",
            f"variants  for framework {self.framework}:",
            *self.choice.trace_lines(),
        ]
        chosen = self.choice.variant.name if self.choice.variant else "none fits"
        lines.append(f"chosen    {chosen}")
        if self.choice.variant is not None:
            lines.append(f"verify    {self.verification()}")
        return "\n".join(lines)

    def verification(self) -> str:
        """How the chosen build's bytes will be checked ("no digest" where its metadata records none)."""
        ask = getattr(self.source, "verification", None)
        if self.choice.variant is None or ask is None:
            return "nothing chosen" if self.choice.variant is None else "as the source checks its files"
        try:
            return ask(self.repo_id, self.resolution.commit, self.choice.variant)
        except KernelHubError as exc:
            return f"unknown until fetched ({str(exc).splitlines()[0][:160]})"


#: Which source serves a registry kernel: "auto" (the default: the registry's source path where it names one),
#: "hub" (always the Hub at HF_ENDPOINT, over the checkout's copy) or "local" (only the source path).
SOURCE_ENV = "KERNEL_HUB_SOURCE"
SOURCE_CHOICES = ("auto", "hub", "local")


def read_source_choice(source_choice: str | None) -> str:
    """get_kernel's `source=` choice, else $KERNEL_HUB_SOURCE, else "auto"; one error naming both otherwise."""
    chosen = source_choice if source_choice is not None else (os.environ.get(SOURCE_ENV) or "auto")
    if chosen not in SOURCE_CHOICES:
        named = "source=" if source_choice is not None else SOURCE_ENV
        raise KernelHubError(f"{named} must be one of {', '.join(SOURCE_CHOICES)}, got {chosen!r}")
    return chosen


def source_for(repo_id: str, registry: Registry, source_choice: str | None = None) -> Source:
    """Where a kernel comes from: a folder LOCAL_KERNELS maps it to, the registry's source path, or the Hub
    (through huggingface_hub); an entry naming both uses the Hub when it answers and the source path when it does
    not. `source_choice` (read_source_choice) forces the Hub or the source path (LOCAL_KERNELS still comes
    first)."""
    check_repo_id(repo_id)
    chosen = read_source_choice(source_choice)
    mapped = local_override(repo_id)  # LOCAL_KERNELS, HF kernels' meaning: this repo from this folder
    if mapped is not None:
        return LocalSource(mapped)
    entry = registry.get(repo_id)
    local = entry is not None and entry.source is not None and entry.source.is_dir()
    if chosen == "local":
        if not local:
            raise KernelNotFoundError(f"{repo_id}: source='local' but the registry names no source path for it")
        return LocalSource(entry.source)
    if chosen == "hub":
        from ..sources.hub.source import HubSource

        return HubSource.for_repo(repo_id, registry_entry=entry)
    if local and entry.hub_repo is None:
        return LocalSource(entry.source)
    try:
        from ..sources.hub.source import HubSource
    except ImportError:
        if local:
            return LocalSource(entry.source)
        raise KernelNotFoundError(
            f"unknown kernel repo {repo_id!r}: not in the registry and the Hub client is unavailable"
        ) from None
    hub = HubSource.for_repo(repo_id, registry_entry=entry)
    return HubOrLocal(hub, LocalSource(entry.source)) if local else hub


def check_target(framework: str, backend: str | None) -> None:
    """The framework and backend a caller asked for are ones variants can name."""
    if framework not in FRAMEWORKS:
        raise KernelHubError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if backend is not None and backend not in BACKENDS:
        raise KernelHubError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def system_for(system: SystemFacts | None, framework: str, backend: str | None) -> SystemFacts:
    """This machine's facts (or the given ones), with `backend` forced where asked."""
    check_target(framework, backend)
    system = system or detect(framework)
    if backend is not None and backend != system.backend:
        system = replace(system, backend=backend, tpu_generation=system.tpu_generation if backend == "tpu" else None)
    return system


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
    trust: TrustPolicy | None = None,
    source_choice: str | None = None,
) -> Plan:
    """Resolve the version and choose the variant; the plan says which and why (nothing is imported).

    trust: given (by callers that will import or lock), the origin is checked as soon as the source is known,
    before anything is downloaded, and the plan records it; None (resolve, download) checks nothing.
    source_choice: get_kernel's `source=`, "hub", "local" or "auto" (None: $KERNEL_HUB_SOURCE, else auto); used
    only where `source` is not given.
    """
    check_repo_id(repo_id)
    check_target(framework, backend)
    registry = registry if registry is not None else load_registry()
    if version is None and revision is None:
        entry = registry.get(repo_id)
        if entry is None or entry.version is None:
            raise VersionSpecError(
                f"{repo_id} is not in the registry with a default version: pass version= or revision="
            )
        version = entry.version
    source = source or source_for(repo_id, registry, source_choice)
    resolution = resolve(source.refs(repo_id), version=version, revision=revision)
    if trust is not None:
        check_trust(source.origin(repo_id), trust, asked_for=repo_id)
    system = system_for(system, framework, backend)
    variants = source.candidate_variants(repo_id, resolution.commit, preferred_names(system, framework))
    choice = choose_variant(variants, system, framework)
    return Plan(repo_id, source, resolution, choice, system, framework, trust)
