"""Where kernels come from. A source lists a repo's refs, the variants at a commit, and fetches one
variant's files to local disk. The embedded registry and get_local_kernel use `LocalSource`; the Hub
source lives in hub.py and follows the same protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .errors import KernelNotFoundError
from .metadata import KernelMetadata, load_metadata
from .variants import Variant
from .vendoring import assembled_files, assembled_in_cache, content_commit, file_digests
from .versions import Ref


@dataclass(frozen=True)
class Build:
    """One variant of one commit on local disk, verified and ready to import."""

    repo_id: str
    version: str | None
    commit: str
    variant: Variant
    package_dir: Path                 # the python package folder
    source: str                       # where it came from, for reports: a path or an endpoint
    digests: dict[str, str] = field(default_factory=dict)  # relative path -> sha256, checked
    metadata: KernelMetadata | None = None


class Source(Protocol):
    """What get_kernel needs of any place kernels live."""

    def refs(self, repo_id: str) -> list[Ref]: ...

    def variants(self, repo_id: str, commit: str) -> list[Variant]: ...

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build: ...


class LocalSource:
    """A kernel folder (kernel.yaml + package + the shared files it vendors) as a one-release repo.

    Its refs are the release tag `v<version>` and the major branch `v<major>`, both at a commit id that is the
    digest of kernel.yaml and every shipped file, vendored ones included (vendoring.py), so a changed file, in
    the package or in the shared code it vendors, is a different commit. A package that vendors nothing is
    imported in place; one that does is assembled once per commit into the cache and imported from there.
    """

    def __init__(self, kernel_dir: Path):
        self.kernel_dir = Path(kernel_dir).resolve()
        self.metadata = load_metadata(self.kernel_dir)
        files = assembled_files(self.kernel_dir, self.metadata)
        self.digests = file_digests(files)
        self.commit = content_commit(self.kernel_dir, self.metadata, self.digests)
        self._source_package = self.kernel_dir / self.metadata.python_name
        self._package_dir: Path | None = None if self.metadata.vendor else self._source_package

    @property
    def package_dir(self) -> Path:
        """The importable package: the source folder itself, or its assembly in the cache."""
        if self._package_dir is None:
            self._package_dir = assembled_in_cache(self.kernel_dir, self.metadata, self.digests, self.commit)
        return self._package_dir

    def describe(self) -> str:
        return f"source path {self.kernel_dir}"

    def _check(self, repo_id: str) -> None:
        if repo_id != self.metadata.repo_id:
            raise KernelNotFoundError(f"{self.kernel_dir} holds {self.metadata.repo_id}, not {repo_id}")

    def refs(self, repo_id: str) -> list[Ref]:
        self._check(repo_id)
        major = self.metadata.version.split(".")[0]
        return [Ref(f"v{self.metadata.version}", "tag", self.commit), Ref(f"v{major}", "branch", self.commit)]

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        self._check(repo_id)
        if commit != self.commit:
            raise KernelNotFoundError(f"{repo_id}: commit {commit[:12]} is not in {self.kernel_dir}")
        return list(self.metadata.variants)

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        self.variants(repo_id, commit)
        return Build(
            repo_id=repo_id,
            version=self.metadata.version,
            commit=commit,
            variant=variant,
            package_dir=self.package_dir,
            source=str(self.kernel_dir),
            digests=self.digests,
            metadata=self.metadata,
        )
