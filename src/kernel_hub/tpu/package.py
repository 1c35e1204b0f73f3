"""The kernel package a TPU worker may import: a build the parent fetched and verified, with its digests.

The compile gate and the cost model run kernel code in a subprocess (the TPU environment). That import is one
more path that runs kernel code, so it passes the same checks as get_kernel: the parent resolves, trust-checks,
fetches and verifies the build, then hands the worker the package folder *and the digests it verified*; the
worker imports through kernel_hub.load.loader (each file read once, checked against its sha256, compiled from those
bytes, no bytecode). A file changed on disk between the parent's verification and the worker's import, or a file
the digests do not list, is refused before anything of the package runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IntegrityError
from ..names import check_commit, check_entry_file, check_repo_id, check_variant_name
from ..package.integrity import check_digests, combined_digest, tree_digests

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import ModuleType

    from ..decide.variants import Variant
    from ..json_types import JsonDict, JsonValue
    from ..sources.base import Build


@dataclass(frozen=True)
class VerifiedPackage:
    """One variant of one kernel commit on local disk, verified by the parent: what a worker loads."""

    repo_id: str
    version: str | None
    commit: str
    variant: str
    package_dir: Path
    entry: str
    digests: Mapping[str, str] = field(default_factory=dict)  # package-relative path -> sha256
    framework: str = "jax"

    @property
    def label(self) -> str:
        return f"{self.repo_id}@{self.version or self.commit[:12]} [{self.variant}]"

    def request(self) -> JsonDict:
        """JSON for the worker's request."""
        return {"repo_id": self.repo_id, "version": self.version, "commit": self.commit, "variant": self.variant,
                "framework": self.framework, "dir": str(self.package_dir), "entry": self.entry,
                "digests": dict(self.digests)}


def from_build(build: Build) -> VerifiedPackage:
    """A sources.Build (fetched and digest-checked) as a VerifiedPackage."""
    return VerifiedPackage(build.repo_id, build.version, build.commit, build.variant.name, Path(build.package_dir),
                           build.variant.entry, dict(build.digests), build.variant.framework)


def from_request(spec: JsonValue) -> VerifiedPackage:
    """The worker side: the request's package, every name and digest checked again (the request is a file)."""
    if not isinstance(spec, dict):
        raise IntegrityError("the worker request names no package")
    label = f"worker request for {str(spec.get('repo_id'))[:80]}"
    try:
        version = spec.get("version")
        return VerifiedPackage(
            repo_id=check_repo_id(spec["repo_id"]), version=None if version is None else str(version),
            commit=check_commit(spec["commit"]), variant=check_variant_name(spec["variant"]),
            package_dir=Path(str(spec["dir"])), entry=check_entry_file(spec["entry"]),
            digests=check_digests(spec["digests"], label), framework=str(spec.get("framework", "jax")),
        )
    except KeyError as exc:
        raise IntegrityError(f"{label}: no {exc.args[0]!r}") from None


def import_verified(package: VerifiedPackage) -> ModuleType:
    """Import `package` through the client's verified loader (worker side): IntegrityError if any file differs
    from the digests the parent verified, KernelImportError if the import itself fails."""
    from ..decide.variants import Variant
    from ..load.loader import import_build
    from ..sources.base import Build

    variant = Variant(name=package.variant, framework=package.framework, backend="tpu", entry=package.entry)
    return import_build(Build(repo_id=package.repo_id, version=package.version, commit=package.commit,
                              variant=variant, package_dir=package.package_dir, source=str(package.package_dir),
                              digests=dict(package.digests)))


def tpu_variant(variants: Iterable[Variant], label: str) -> Variant:
    """The variant the compile cases load through: jax-tpu, else torch-tpu (same package files)."""
    from ..errors import KernelHubError

    tpu = [v for v in variants if v.backend == "tpu"]
    for v in sorted(tpu, key=lambda v: v.framework != "jax"):
        return v
    raise KernelHubError(f"{label} has no TPU variant (jax-tpu or torch-tpu): nothing to compile for a TPU")


def folder_package(kernel_dir: Path) -> VerifiedPackage:
    """A kernel folder's TPU build (its vendored files assembled, every file hashed now)."""
    from ..sources.base import LocalSource

    source = LocalSource(Path(kernel_dir))
    meta = source.metadata
    variant = tpu_variant(meta.variants, meta.repo_id)
    return from_build(source.fetch(meta.repo_id, source.commit, variant))


def local_package(package_dir: Path, entry: str = "__init__.py") -> VerifiedPackage:
    """A package folder on this machine, hashed now (the user's own files, as get_local_kernel treats a kernel
    folder); the entry picks the framework (a torch_*.py entry is a torch build)."""
    package_dir = Path(package_dir)
    digests = tree_digests(package_dir)
    torch = entry.startswith("torch")
    name = re.sub(r"[^A-Za-z0-9._-]", "-", package_dir.name) or "package"
    return VerifiedPackage(f"local/{name}", None, combined_digest(digests)[:40], "torch-tpu" if torch else "jax-tpu",
                           package_dir, entry, digests, "torch" if torch else "jax")
