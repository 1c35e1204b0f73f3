"""Where kernels come from. A source lists a repo's refs, the variants at a commit, and fetches one
variant's files to local disk. The embedded registry and get_local_kernel use `LocalSource`; the Hub
source lives in sources/hub/ and follows the same protocol; `HubOrLocal` serves a registry entry that names both."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..decide.variants import Variant
from ..decide.versions import Ref
from ..errors import IntegrityError, KernelHubError, KernelNotFoundError
from ..package.integrity import sha256_file
from ..package.metadata import METADATA_FILE, KernelMetadata, load_metadata
from ..package.vendoring import assembled_files, assembled_in_cache, content_commit, file_digests


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
    #: how the files were checked before import: "sha256 (bundle metadata)", "sha256 (metadata digest)", "no digest:
    #: git blob ids of the tree listing", "local folder"
    verified: str = "sha256 (bundle metadata)"
    kernel_depends: tuple[tuple[str, str, str], ...] = ()  # kernel-builder: (repo id, "version"|"revision", value)
    kernels_minver: str | None = None                      # kernel-builder: the HF kernels version it asks for


@dataclass(frozen=True)
class Origin:
    """Where a repo's code actually comes from: what the trust check judges and a lock file records."""

    kind: str        # "local" (a kernel folder on this machine) | "hub" (an endpoint)
    repo_id: str     # the repo fetched: a registry entry's `hub:` repo where it names one
    location: str    # the kernel folder, or the endpoint


class Source(Protocol):
    """What get_kernel, lock and the CLI need of any place kernels live."""

    def describe(self) -> str:
        """One line for reports: where kernels come from (and, for a fallback, why)."""
        ...

    def origin(self, repo_id: str) -> Origin:
        """Where `repo_id`'s code comes from (after refs() for a source that decides on first use)."""
        ...

    def refs(self, repo_id: str) -> list[Ref]:
        """The repo's tags and branches."""
        ...

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        """Every build variant at `commit`."""
        ...

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        """The variants to choose among, as cheaply as the source can: `names` are the preferred ones, best
        first; a source may return only the first of them that exists, or all variants."""
        ...

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        """The variant's files on local disk, every digest checked."""
        ...

    def verification(self, repo_id: str, commit: str, variant: Variant) -> str:
        """How a fetch of `variant` will check its bytes (for `resolve` and `info`; nothing is imported)."""
        ...


class LocalSource:
    """A kernel folder (kernel.yaml + package + the shared files it vendors) as a one-release repo.

    Its refs are the release tag `v<version>` and the major branch `v<major>`, both at a commit id that is the
    digest of kernel.yaml and every shipped file, vendored ones included (vendoring.py), so a changed file, in
    the package or in the shared code it vendors, is a different commit. A package that vendors nothing is
    imported in place; one that does is assembled once per commit into the cache and imported from there.
    """

    def __init__(self, kernel_dir: Path, metadata: KernelMetadata | None = None):
        """`metadata`: kernel.yaml as the caller already loaded it from this folder (publish reads it first)."""
        self.kernel_dir = Path(kernel_dir).resolve()
        self.metadata = metadata if metadata is not None else load_metadata(self.kernel_dir)
        #: Every file the package ships (path inside the package -> the file it is read from).
        self.files = assembled_files(self.kernel_dir, self.metadata)
        self.digests = file_digests(self.files)
        self.metadata_digest = sha256_file(self.kernel_dir / METADATA_FILE)  # kernel.yaml as read now
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

    def origin(self, repo_id: str) -> Origin:
        return Origin("local", repo_id, str(self.kernel_dir))

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

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        return self.variants(repo_id, commit)  # all on disk already: nothing to save

    def verification(self, repo_id: str, commit: str, variant: Variant) -> str:
        return LOCAL_VERIFIED

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        """The folder's build of `variant`: kernel.yaml's own variant of that name, and only when `variant` (which may
        come from a lock file) says exactly what kernel.yaml says (its entry file above all)."""
        variant = own_variant(self.variants(repo_id, commit), variant, self.kernel_dir / "kernel.yaml")
        return Build(
            repo_id=repo_id,
            version=self.metadata.version,
            commit=commit,
            variant=variant,
            package_dir=self.package_dir,
            source=str(self.kernel_dir),
            digests=self.digests,
            metadata=self.metadata,
            verified=LOCAL_VERIFIED,
        )


LOCAL_VERIFIED = "local folder (sha256 of its files now)"


def own_variant(known: list[Variant], asked: Variant, where: Path) -> Variant:
    """The variant of `known` (a kernel.yaml's) named like `asked`, refused unless `asked` matches it field for
    field: a lock file's variant JSON never picks another entry file, backend or requirement for a local kernel."""
    own = next((v for v in known if v.name == asked.name), None)
    if own is None:
        raise IntegrityError(f"variant {asked.name!r} is not in {where} (it has {', '.join(v.name for v in known)}); "
                             "re-run kernel-hub lock")
    if own != asked:
        fields = [f for f in ("framework", "backend", "entry", "tpu_generations", "requires")
                  if getattr(own, f) != getattr(asked, f)]
        diff = "; ".join(f"{f} {getattr(asked, f)!r}, kernel.yaml {getattr(own, f)!r}" for f in fields)
        raise IntegrityError(f"variant {asked.name} differs from {where} ({diff}); re-run kernel-hub lock")
    return own


class HubOrLocal:
    """A registry kernel with both a Hub repo and a source path: the Hub when it answers, else the source.

    The choice is made once, at the first refs() call (any other call asks refs first), and describe()
    and origin() say which was used.
    """

    def __init__(self, hub: Source, local: LocalSource):
        self.hub, self.local = hub, local
        self.active: Source | None = None
        self.reason = ""

    def _source(self, repo_id: str) -> Source:
        if self.active is None:
            self.refs(repo_id)
        assert self.active is not None
        return self.active

    def refs(self, repo_id: str) -> list[Ref]:
        if self.active is None:
            try:
                refs = self.hub.refs(repo_id)
                self.active, self.reason = self.hub, "the Hub answered"
                return refs
            except KernelHubError as exc:
                self.active, self.reason = self.local, f"Hub unavailable ({exc}); source path serves"
        return self.active.refs(repo_id)

    def origin(self, repo_id: str) -> Origin:
        return self._source(repo_id).origin(repo_id)

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        return self._source(repo_id).variants(repo_id, commit)

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        return self._source(repo_id).candidate_variants(repo_id, commit, names)

    def fetch(self, repo_id: str, commit: str, variant: Variant) -> Build:
        return self._source(repo_id).fetch(repo_id, commit, variant)

    def verification(self, repo_id: str, commit: str, variant: Variant) -> str:
        return self._source(repo_id).verification(repo_id, commit, variant)

    def describe(self) -> str:
        active = self.active or self.hub
        return f"{active.describe()} ({self.reason or 'not asked yet'})"
