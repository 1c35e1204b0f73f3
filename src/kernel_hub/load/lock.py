"""Lock files: pin each kernel to one commit and variant with the sha256 of every file, and load exactly that.

`kernel-hub lock` resolves like get_kernel and writes kernel-hub.lock (JSON). `get_locked_kernel` then
needs neither refs nor a listing: with the build cached it makes no request at all (the server may be
down), otherwise one bundle download; every file is checked against the lock before anything is
imported, and a tampered file is refetched where online, refused in one line otherwise.

A lock file is untrusted input like any other: every name, commit and digest in it is checked before it
names a path, and locking and loading both pass the trust check (trust.py) on the repo actually fetched.
Each entry records where its code came from (`source`: "hub" or "local", `location`, `hub_repo`: the repo
fetched), so an entry locked while the Hub was down loads from the source path it was locked from.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, KernelHubError, KernelNotFoundError, MetadataError, TrustError
from ..files import read_capped_text, write_atomic
from ..names import check_commit, check_repo_id
from ..package.buildfmt import strict_json, variant_from_json, variant_to_json
from ..package.integrity import check_digests
from ..sources.base import Build, LocalSource, Origin, Source
from .depends import Graph, hf_kernel_deps, load_dependency, walk
from .loader import import_build, survive_prune
from .planning import Plan, plan_load
from .registry import load_registry
from .trust import TrustPolicy, TrustSetting, check_trust, trust_policy

if TYPE_CHECKING:
    from ..sources.hub.source import HubSource

LOCK_FILE = "kernel-hub.lock"
LOCK_ENV = "KERNEL_HUB_LOCK"
LOCK_FORMAT = 1
MAX_LOCK_BYTES = 16 << 20
MAX_PINNED = 256  # kernel-depends one entry may pin


@dataclass(frozen=True)
class LockedKernel:
    repo_id: str
    spec: dict[str, Any]        # what was asked: {"version": 1} / {"version": ">=1.2,<2"} / {"revision": ...}
    version: str | None         # the release the commit carries
    commit: str
    variant: dict[str, Any]     # buildfmt.variant_to_json
    files: dict[str, str]       # package-relative path -> sha256
    source: str                 # "hub" (an endpoint) or "local" (a kernel folder)
    location: str               # the endpoint, or the kernel folder
    hub_repo: str | None = None  # the repo fetched where it is not repo_id (a registry entry's `hub:`)
    depends: dict[str, str] = field(default_factory=dict)  # kernel-depends: repo id -> the commit pinned

    @property
    def origin(self) -> Origin:
        return Origin(self.source, self.hub_repo or self.repo_id, self.location)


@dataclass
class LockFile:
    kernels: list[LockedKernel] = field(default_factory=list)
    dependencies: list[LockedKernel] = field(default_factory=list)  # what `depends` pins, once each

    def dependency(self, repo_id: str, commit: str, framework: str | None, needed_by: str) -> LockedKernel:
        """The pinned dependency `repo_id` at `commit` (for the kernel `needed_by`)."""
        for k in self.dependencies:
            if k.repo_id == repo_id and k.commit == commit and (framework is None
                                                                 or k.variant.get("framework") == framework):
                return k
        raise KernelNotFoundError(f"{needed_by}: the lock file pins kernel-depends {repo_id} at {commit[:12]} but "
                                  "holds no entry for it; re-run kernel-hub lock")

    def find(self, repo_id: str, framework: str | None = None) -> LockedKernel:
        found = [k for k in self.kernels if k.repo_id == repo_id
                 and (framework is None or k.variant.get("framework") == framework)]
        if not found:
            locked = ", ".join(sorted({k.repo_id for k in self.kernels})) or "nothing"
            raise KernelNotFoundError(f"{repo_id} is not in the lock file (it locks: {locked}); run kernel-hub lock")
        return found[0]

    def to_json(self) -> str:
        data: dict[str, Any] = {"kernel-hub-lock": LOCK_FORMAT, "kernels": [_entry_json(k) for k in self.kernels]}
        if self.dependencies:
            data["dependencies"] = [_entry_json(k) for k in self.dependencies]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        """Write beside `path` and rename into place: a reader sees the old lock or the new one; a link at `path` is
        refused, never written through."""
        write_atomic(Path(path), self.to_json().encode(), "the lock file")


def _entry_json(entry: LockedKernel) -> dict[str, Any]:
    out = asdict(entry)
    if not out["depends"]:
        del out["depends"]  # a lock without kernel-depends reads as before
    return out


def default_lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or LOCK_FILE)


def parse_entry(raw: object, where: str) -> LockedKernel:
    """One lock entry, every field checked: names, commit, variant, digests."""
    if not isinstance(raw, dict):
        raise MetadataError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = set(LockedKernel.__dataclass_fields__)
    missing = sorted(k for k in known - {"hub_repo", "depends"} if k not in raw)
    extra = sorted(str(k) for k in raw if k not in known)
    if missing or extra:
        problem = f"missing field {missing[0]!r}" if missing else f"unknown field {extra[0]!r}"
        raise MetadataError(f"{where}: {problem}")
    repo_id = check_repo_id(raw["repo_id"], f"{where} repo_id")
    where = f"{where} ({repo_id})"
    source, location, version = raw["source"], raw["location"], raw["version"]
    if source not in ("hub", "local"):
        raise MetadataError(f"{where}: source must be 'hub' or 'local', got {str(source)[:40]!r}")
    if not isinstance(location, str) or not location or "\n" in location:
        raise MetadataError(f"{where}: location must be an endpoint or a folder")
    if version is not None and not isinstance(version, str):
        raise MetadataError(f"{where}: version must be a string")
    if not isinstance(raw["spec"], dict):
        raise MetadataError(f"{where}: spec must be a mapping")
    hub_repo = raw.get("hub_repo")
    if hub_repo is not None:
        check_repo_id(hub_repo, f"{where} hub_repo")
    variant = variant_from_json(raw["variant"], f"{where} variant")
    depends = raw.get("depends", {})
    if not isinstance(depends, dict) or len(depends) > MAX_PINNED:
        raise MetadataError(f"{where}: depends must be a mapping of at most {MAX_PINNED} repo ids to commits")
    pinned = {check_repo_id(r, f"{where} depends"): check_commit(c, f"{where} depends {r}") for r, c in depends.items()}
    return LockedKernel(repo_id=repo_id, spec=dict(raw["spec"]), version=version,
                        commit=check_commit(raw["commit"], f"{where} commit"), variant=variant_to_json(variant),
                        files=check_digests(raw["files"], where), source=source, location=location,
                        hub_repo=hub_repo, depends=pinned)


def lock_json(text: str, path: Path) -> Any:
    """A lock file's JSON (ours or HF kernels'): no key twice in one object, a bounded depth (a deeply nested file
    is one error, not a RecursionError), numbers of sane length. One MetadataError naming `path` otherwise."""
    try:
        return strict_json(text.encode(), "the text", MAX_LOCK_BYTES)
    except IntegrityError as exc:
        raise MetadataError(f"{path}: not valid JSON for a lock file ({exc})") from None


def read_lock(path: str | Path | None = None) -> LockFile:
    path = Path(path) if path is not None else default_lock_path()
    try:
        text = read_capped_text(path, MAX_LOCK_BYTES, "a lock file")
    except FileNotFoundError:
        raise KernelNotFoundError(f"no lock file at {path}; run `kernel-hub lock` first") from None
    data = lock_json(text, path)
    if not isinstance(data, dict) or data.get("kernel-hub-lock") != LOCK_FORMAT:
        raise MetadataError(f"{path}: not a kernel-hub lock file (format {LOCK_FORMAT})")
    kernels, deps = data.get("kernels", []), data.get("dependencies", [])
    for key, value in (("kernels", kernels), ("dependencies", deps)):
        if not isinstance(value, list):
            raise MetadataError(f"{path}: '{key}' must be a list, not {type(value).__name__}")
    return LockFile([parse_entry(k, f"{path}: kernels[{i}]") for i, k in enumerate(kernels)],
                    [parse_entry(k, f"{path}: dependencies[{i}]") for i, k in enumerate(deps)])


def lock_one(repo_id: str, *, version: int | str | None = None, revision: str | None = None,
             framework: str = "jax", backend: str | None = None, source: Source | None = None,
             trust: TrustPolicy,
             dependencies: dict[tuple[str, str, str | None], LockedKernel] | None = None) -> LockedKernel:
    """Resolve and fetch one kernel as get_kernel would (trust check included), and record exactly what was
    fetched and where it came from; its kernel-depends (each once per graph, depends.MAX_DEPENDS_DEPTH deep at
    most) are locked too, pinned by commit in `depends` and added to `dependencies`."""
    plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework,
                     source=source, trust=trust)
    if revision is not None:
        spec: dict[str, Any] = {"revision": revision}
    else:
        spec = {"version": version if version is not None else plan.resolution.reason}
    found = dependencies if dependencies is not None else {}
    return _lock_plan(plan, spec, found)


def _lock_plan(plan: Plan, spec: dict[str, int | str], found: dict[tuple[str, str, str | None], LockedKernel]
               ) -> LockedKernel:
    origin = plan.origin
    build = plan.fetch()
    pinned: dict[str, str] = {}
    with walk(plan.repo_id) as graph:
        for repo_id, kind, value in build.kernel_depends:
            def lock_dep(repo_id: str = repo_id, kind: str = kind, value: str = value) -> LockedKernel:
                dep_plan = plan_load(repo_id, version=int(value) if kind == "version" else None,
                                     revision=value if kind == "revision" else None, framework=plan.framework,
                                     system=plan.system, source=plan.source if origin.kind == "hub" else None,
                                     trust=plan.trust)
                entry = _lock_plan(dep_plan, {"version" if kind == "version" else "revision": value}, found)
                found[(entry.repo_id, entry.commit, entry.variant.get("framework"))] = entry
                return entry

            key = (repo_id, kind, str(value), plan.framework)
            pinned[repo_id] = load_dependency(graph, repo_id, key, f"{kind} {value}", lock_dep).commit
    return LockedKernel(repo_id=plan.repo_id, spec=spec, version=build.version,
                        commit=plan.resolution.commit, variant=variant_to_json(build.variant),
                        files=dict(build.digests), source=origin.kind, location=origin.location,
                        hub_repo=origin.repo_id if origin.repo_id != plan.repo_id else None, depends=pinned)


def lock(repo_ids: list[str] | None = None, *, version: int | str | None = None, revision: str | None = None,
         framework: str = "jax", backend: str | None = None, path: str | Path | None = None,
         source: Source | None = None, trust_remote_code: TrustSetting = False) -> LockFile:
    """Lock `repo_ids` (default: every kernel in the registry) and write the lock file.

    Args:
        repo_ids: the repos to lock; None or empty: every kernel registry.yaml names.
        version, revision, framework, backend, trust_remote_code: as for get_kernel.
        path: the lock file (default: kernel-hub.lock here, or $KERNEL_HUB_LOCK).
        source: a Source to resolve and fetch from instead of the registry's choice.
    Returns:
        The LockFile written.
    Raises:
        TrustError: a malformed trust_remote_code (before any work) or an untrusted repo.
    """
    trust = trust_policy(trust_remote_code)
    if not repo_ids:
        repo_ids = [e.repo_id for e in load_registry().entries]
    if not repo_ids:
        raise KernelHubError("nothing to lock: name a repo or add kernels to registry.yaml")
    target = Path(path) if path is not None else default_lock_path()
    if target.is_dir():
        raise KernelHubError(f"lock file {target} is a folder; name a file (-o FILE)")
    if not target.parent.is_dir():
        raise KernelHubError(f"cannot write the lock file {target}: folder {target.parent} does not exist")
    found: dict[tuple[str, str, str | None], LockedKernel] = {}
    locked = LockFile([lock_one(r, version=version, revision=revision, framework=framework, backend=backend,
                                source=source, trust=trust, dependencies=found)
                       for r in repo_ids])
    locked.dependencies = [found[k] for k in sorted(found, key=lambda k: (k[0], k[1], str(k[2])))]
    locked.write(target)
    return locked


def _local_source(entry: LockedKernel, source: Source | None) -> LocalSource:
    """The kernel folder a local entry names, only where the registry serves that repo from that very folder:
    a lock file cannot point the loader at any other folder on this machine."""
    registry_entry = load_registry().get(entry.repo_id)
    folder = Path(entry.location)
    if registry_entry is None or registry_entry.source is None or registry_entry.source.resolve() != folder.resolve():
        served = registry_entry.source if registry_entry is not None and registry_entry.source else "no source path"
        raise KernelHubError(f"{entry.repo_id}: the lock file names local folder {folder}, but the registry serves "
                             f"it from {served}; re-run kernel-hub lock")
    if isinstance(source, LocalSource) and source.kernel_dir == folder.resolve():
        return source
    return LocalSource(folder)


def fetch_locked(repo_id: str, *, lockfile: str | Path | None = None, framework: str | None = None,
                 source: Source | None = None) -> tuple[LockedKernel, Build]:
    """The locked commit and variant on local disk, every file checked against the lock (nothing imported)."""
    entry = read_lock(lockfile).find(repo_id, framework)
    return entry, fetch_entry(entry, source)


def served_by(entry: LockedKernel, source: Source | None = None) -> str:
    """Where a locked load comes from, in get_kernel's `__kernel_hub_source__` words: "local <folder>" for a local
    entry, else "hub <endpoint>" of the source fetching it (the one handed in, or the default Hub)."""
    if entry.source == "local":
        return f"local {entry.location}"
    return f"hub {_hub(source).endpoint}"


def _hub(source: Source | None) -> HubSource:
    """The Hub source a hub entry is fetched from: the one handed in, else the default (HF_ENDPOINT)."""
    from ..sources.hub.source import HubSource

    if source is None:
        return HubSource()
    if not isinstance(source, HubSource):
        raise KernelHubError(f"a Hub lock entry is fetched from a Hub source, not from {source.describe()}")
    return source


def same_endpoint(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def fetched_origin(entry: LockedKernel, hub: HubSource) -> Origin:
    """Where a locked entry's code comes from on this load: a local entry's folder (checked against the registry
    by _local_source), else the endpoint of the Hub source fetching it, never the endpoint the lock file records.
    A hub entry recorded at another endpoint is refused: a lock file chooses neither where code comes from nor who
    is trusted (the default organisations are trusted at https://huggingface.co only)."""
    if entry.source == "local":
        return entry.origin
    if not same_endpoint(entry.location, hub.endpoint):
        raise TrustError(f"{entry.repo_id}: the lock file was made against {entry.location[:200]}, but this load "
                         f"fetches from {hub.endpoint} (HF_ENDPOINT, or the source given); a lock file does not "
                         "choose where code comes from or who is trusted: re-run kernel-hub lock against "
                         f"{hub.endpoint}")
    return Origin("hub", entry.hub_repo or entry.repo_id, hub.endpoint)


def fetch_entry(entry: LockedKernel, source: Source | None = None) -> Build:
    """One lock entry's build on local disk, every file checked against the entry (a hub entry only from the
    endpoint it was locked at: fetched_origin)."""
    repo_id = entry.repo_id
    variant = variant_from_json(entry.variant)
    if entry.source == "local":
        local = _local_source(entry, source)
        if local.commit != entry.commit:
            raise IntegrityError(f"{repo_id}: {entry.location} changed since it was locked "
                                 f"(commit {local.commit[:12]}, lock has {entry.commit[:12]}); re-run kernel-hub lock")
        build = local.fetch(repo_id, entry.commit, variant)
    else:
        hub = _hub(source)
        fetched_origin(entry, hub)
        if entry.hub_repo is not None and hub.hub_repo(repo_id) != entry.hub_repo:
            hub.aliases[repo_id] = entry.hub_repo  # fetch the repo that was locked (and trusted), not the alias
        build = hub.fetch(repo_id, entry.commit, variant, expected=entry.files)
    if dict(build.digests) != entry.files:
        raise IntegrityError(f"{repo_id}@{entry.commit[:12]}: files differ from the lock")
    return build


def get_locked_kernel(repo_id: str, *, lockfile: str | Path | None = None, framework: str | None = None,
                      source: Source | None = None, trust_remote_code: TrustSetting = False) -> ModuleType:
    """Load exactly the locked commit and variant, trust checked first, every file checked against the lock
    before import; its kernel-depends load from the commits the lock pins (never a branch's newer head).

    Args:
        repo_id: the repo as the lock file names it.
        lockfile: the lock file (default: kernel-hub.lock here, or $KERNEL_HUB_LOCK).
        framework: which of the repo's locked entries ("jax", "torch"; None: the only one).
        source: a Hub source to fetch from instead of HF_ENDPOINT's.
        trust_remote_code: as for get_kernel.
    Returns:
        The imported kernel module.
    Raises:
        TrustError: a malformed setting or an untrusted repo. IntegrityError: a file differs from the lock.
    """
    return load_locked(repo_id, lockfile=lockfile, framework=framework, source=source,
                       trust=trust_policy(trust_remote_code))


def load_locked(repo_id: str, *, lockfile: str | Path | None = None, framework: str | None = None,
                source: Source | None = None, trust: TrustPolicy) -> ModuleType:
    """get_locked_kernel below the public edge: the trust policy already read."""
    locked = read_lock(lockfile)
    entry = locked.find(repo_id, framework)
    with walk(entry.repo_id) as graph:
        module = _load_entry(locked, entry, graph, source, trust, asked_for=repo_id)
    module.__kernel_hub_source__ = served_by(entry, source)  # type: ignore[attr-defined]
    return module


def _load_entry(locked: LockFile, entry: LockedKernel, graph: Graph, source: Source | None, trust: TrustPolicy,
                asked_for: str) -> ModuleType:
    if entry.source == "hub":
        source = _hub(source)  # one source for the trust check and the fetch: the endpoint judged is the one used
    check_trust(fetched_origin(entry, source), trust, asked_for=asked_for)
    build = survive_prune(lambda: fetch_entry(entry, source), lambda: fetch_entry(entry, source), entry.repo_id)
    unpinned = sorted({repo_id for repo_id, _, _ in build.kernel_depends} - set(entry.depends))
    if unpinned:
        raise KernelHubError(f"{entry.repo_id}@{entry.commit[:12]} depends on {', '.join(unpinned)}, which the lock "
                             "file does not pin; re-run kernel-hub lock")
    deps: dict[str, ModuleType] = {}
    framework = entry.variant.get("framework")
    for repo_id, commit in entry.depends.items():
        def load(repo_id: str = repo_id, commit: str = commit) -> ModuleType:
            dep = locked.dependency(repo_id, commit, framework, entry.repo_id)
            with walk(repo_id) as g:
                return _load_entry(locked, dep, g, source, trust, asked_for=repo_id)

        deps[repo_id] = load_dependency(graph, repo_id, (repo_id, commit, framework), f"commit {commit[:12]}", load)
    with hf_kernel_deps(deps):
        module = survive_prune(lambda: import_build(build), lambda: import_build(fetch_entry(entry, source)),
                               entry.repo_id)
    if deps:
        module.__kernel_deps__ = deps  # type: ignore[attr-defined]
    return module
