"""Lock files: pin each kernel to one commit and variant with the sha256 of every file, and load exactly that.

`kernel-hub lock` resolves like get_kernel and writes kernel-hub.lock (JSON). `get_locked_kernel` then
needs neither refs nor a listing: with the build cached it makes no request at all (the server may be
down), otherwise one bundle download; every file is checked against the lock before anything is
imported, and a tampered file is refetched where online, refused in one line otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import IntegrityError, KernelHubError, KernelNotFoundError, MetadataError

LOCK_FILE = "kernel-hub.lock"
LOCK_ENV = "KERNEL_HUB_LOCK"
LOCK_FORMAT = 1


@dataclass(frozen=True)
class LockedKernel:
    repo_id: str
    spec: dict[str, Any]        # what was asked: {"version": 1} / {"version": ">=1.2,<2"} / {"revision": ...}
    version: str | None         # the release the commit carries
    commit: str
    variant: dict[str, Any]     # hub.variant_to_json
    files: dict[str, str]       # package-relative path -> sha256
    source: str                 # "hub" (an endpoint) or "local" (an embedded kernel folder)
    location: str               # the endpoint, or the kernel folder


@dataclass
class LockFile:
    kernels: list[LockedKernel] = field(default_factory=list)

    def find(self, repo_id: str, framework: str | None = None) -> LockedKernel:
        found = [k for k in self.kernels if k.repo_id == repo_id
                 and (framework is None or k.variant.get("framework") == framework)]
        if not found:
            locked = ", ".join(sorted({k.repo_id for k in self.kernels})) or "nothing"
            raise KernelNotFoundError(f"{repo_id} is not in the lock file (it locks: {locked}); run kernel-hub lock")
        return found[0]

    def to_json(self) -> str:
        return json.dumps({"kernel-hub-lock": LOCK_FORMAT, "kernels": [asdict(k) for k in self.kernels]},
                          indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


def default_lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or LOCK_FILE)


def read_lock(path: str | Path | None = None) -> LockFile:
    path = Path(path) if path is not None else default_lock_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise KernelNotFoundError(f"no lock file at {path}; run `kernel-hub lock` first") from None
    except ValueError as exc:
        raise MetadataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("kernel-hub-lock") != LOCK_FORMAT:
        raise MetadataError(f"{path}: not a kernel-hub lock file (format {LOCK_FORMAT})")
    try:
        return LockFile([LockedKernel(**k) for k in data.get("kernels", [])])
    except TypeError as exc:
        raise MetadataError(f"{path}: malformed kernel entry ({exc})") from None


def lock_one(repo_id: str, *, version: int | str | None = None, revision: str | None = None,
             framework: str = "jax", backend: str | None = None, source: Any = None) -> LockedKernel:
    """Resolve and fetch one kernel as get_kernel would, and record exactly what was loaded."""
    from .api import plan_load
    from .errors import NoVariantError
    from .hub import variant_to_json
    from .sources import LocalSource

    plan = plan_load(repo_id, version=version, revision=revision, backend=backend, framework=framework,
                     source=source)
    if plan.choice.variant is None:
        raise NoVariantError(f"no build of {repo_id} fits this system:\n" + "\n".join(plan.choice.trace_lines()))
    build = plan.source.fetch(repo_id, plan.resolution.commit, plan.choice.variant)
    if isinstance(plan.source, LocalSource):
        kind, location = "local", str(plan.source.kernel_dir)
    else:
        kind, location = "hub", getattr(plan.source, "endpoint", "")
    if revision is not None:
        spec: dict[str, Any] = {"revision": revision}
    else:
        spec = {"version": version if version is not None else plan.resolution.reason}
    return LockedKernel(repo_id=repo_id, spec=spec, version=build.version or plan.resolution.version,
                        commit=plan.resolution.commit, variant=variant_to_json(build.variant),
                        files=dict(build.digests), source=kind, location=location)


def lock(repo_ids: list[str] | None = None, *, version: int | str | None = None, revision: str | None = None,
         framework: str = "jax", backend: str | None = None, path: str | Path | None = None,
         source: Any = None) -> LockFile:
    """Lock `repo_ids` (default: every kernel in the registry) and write the lock file."""
    from .registry import load_registry

    if not repo_ids:
        repo_ids = [e.repo_id for e in load_registry().entries]
    if not repo_ids:
        raise KernelHubError("nothing to lock: name a repo or add kernels to registry.yaml")
    locked = LockFile([lock_one(r, version=version, revision=revision, framework=framework, backend=backend,
                                source=source) for r in repo_ids])
    locked.write(Path(path) if path is not None else default_lock_path())
    return locked


def get_locked_kernel(repo_id: str, *, lockfile: str | Path | None = None, framework: str | None = None,
                      source: Any = None) -> ModuleType:
    """Load exactly the locked commit and variant, every file checked against the lock before import."""
    from .hub import HubSource, variant_from_json
    from .loader import import_build
    from .sources import LocalSource

    entry = read_lock(lockfile).find(repo_id, framework)
    variant = variant_from_json(entry.variant)
    if entry.source == "local":
        local = source if isinstance(source, LocalSource) else LocalSource(Path(entry.location))
        if local.commit != entry.commit:
            raise IntegrityError(f"{repo_id}: {entry.location} changed since it was locked "
                                 f"(commit {local.commit[:12]}, lock has {entry.commit[:12]}); re-run kernel-hub lock")
        build = local.fetch(repo_id, entry.commit, variant)
    else:
        hub = source if source is not None else HubSource()
        build = hub.fetch(repo_id, entry.commit, variant, expected=entry.files)
    if dict(build.digests) != entry.files:
        raise IntegrityError(f"{repo_id}@{entry.commit[:12]}: files differ from the lock")
    return import_build(build)


def cmd_lock(args: argparse.Namespace) -> int:
    spec: int | str | None = int(args.spec) if args.spec and args.spec.isdigit() else args.spec
    out = Path(args.output)
    locked = lock(args.repos or None, version=spec, revision=args.revision, framework=args.framework,
                  backend=args.backend, path=out)
    for k in locked.kernels:
        print(f"locked {k.repo_id} {k.version or '-'} at {k.commit[:12]} [{k.variant['name']}] "
              f"({len(k.files)} files, {k.source})")
    print(f"wrote {out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lock", help="pin kernels to a commit and variant with every file's sha256",
        description="Resolve each kernel as get_kernel would and write a lock file (repo, spec, version, commit, "
                    "variant, sha256 of every file). kernel_hub.get_locked_kernel loads exactly that.",
    )
    p.add_argument("repos", nargs="*", help="ORG/NAME repo ids (default: every kernel in the registry)")
    p.add_argument("--version", dest="spec", help="int major (1) or PEP 440 spec; default: the registry's")
    p.add_argument("--revision", help="any branch, tag or commit (instead of --version)")
    p.add_argument("--framework", choices=["jax", "torch"], default="jax", help="tensors the build takes")
    p.add_argument("--backend", choices=["tpu", "cuda", "rocm", "cpu"], help="override the detected backend")
    p.add_argument("--output", "-o", default=str(default_lock_path()), help=f"lock file (default {LOCK_FILE})")
    p.set_defaults(func=cmd_lock)
