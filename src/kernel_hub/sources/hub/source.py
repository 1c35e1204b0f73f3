"""The Hub source: kernel repos on the Hugging Face Hub (or `kernel-hub serve`), as the Source protocol.

Loading a version costs: the refs (1 request), the listing of `build/` at the resolved commit (1), and the one
bundle through hf_hub_download (HEAD + GET), into the Hub cache. The refs and listings are kept there too, so with
HF_HUB_OFFLINE=1 a warm cache resolves and loads with no network. HubSource composes the jobs: the requests
(client.py), the cache layout (cache.py), the build listings (listing.py) and the fetch of a build (download.py).

The server, the bundles and the cache are all untrusted: every ref, commit, variant and file name is checked
with kernel_hub.names before it names a path or steers resolution.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from ...decide.variants import KERNEL_BUILDER, Variant
from ...decide.versions import Ref
from ...errors import KernelHubError, KernelNotFoundError, UnsafeNameError
from ...names import check_commit, check_ref_name, check_repo_id
from ...package import buildfmt as fmt
from ...package.metadata import KernelMetadata
from ...ui.display import one_line
from ..base import Build, Origin
from . import builder
from .builder import builder_variant
from .cache import HubCache, note_json, read_json
from .client import HubClient
from .download import BuildFetcher
from .listing import BuildListings, is_variant_name


class AliasedEntry(Protocol):
    """A registry entry as the Hub source reads it: the repo it is published under, where that is another."""

    @property
    def hub_repo(self) -> str | None: ...

_MAX_PUBLISHED_METADATA = 1 << 20  # bytes of a published kernel.yaml that `info` will parse


def checked_refs(raw: list[tuple[str, str, str]]) -> list[Ref]:
    """Refs from a server or a cache, keeping only names no tool reads as an option or a commit id and
    targets that are real commit ids: nothing else can steer resolution."""
    out = []
    for name, kind, commit in raw:
        try:
            out.append(Ref(check_ref_name(name), kind, check_commit(commit)))
        except UnsafeNameError:
            continue
    return out


def published_metadata(client: HubClient, repo_id: str, commit: str, repo: str | None = None) -> KernelMetadata | None:
    """The kernel.yaml a release publishes at its root (requirements and generations of every variant), with
    one small download and nothing unpacked or imported. None where it is missing, too large or not a valid
    kernel.yaml (the caller keeps what the names say). `repo`: the repo requested (default `repo_id`)."""
    from ...package.metadata import METADATA_FILE, parse_metadata, read_yaml

    try:
        repo, revision = check_repo_id(repo or repo_id), check_commit(commit)
        if not client.offline:  # the size first: an oversized kernel.yaml is never downloaded at all
            size = client.file_size(repo_id, repo, METADATA_FILE, revision)
            if size is None or size > _MAX_PUBLISHED_METADATA:
                return None
        path = client.download(repo_id, repo, METADATA_FILE, revision, max_bytes=_MAX_PUBLISHED_METADATA)
        if path.stat().st_size > _MAX_PUBLISHED_METADATA:  # a cached copy (offline) is checked as well
            return None
        return parse_metadata(read_yaml(path), f"{repo_id}@{commit[:12]} {METADATA_FILE}")
    except (KernelHubError, OSError, ValueError):
        return None


class HubSource:
    """Kernel repos behind a Hub endpoint (HF_ENDPOINT), cached in KERNELS_CACHE (HF kernels' cache root) or else
    the Hub cache (HF_HUB_CACHE). `aliases`: repo asked for -> repo fetched (a registry entry's `hub:`)."""

    kind = "hub"

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 cache_dir: str | Path | None = None, offline: bool | None = None,
                 aliases: dict[str, str] | None = None):
        self.client = HubClient(endpoint, token, cache_dir, offline)
        self.aliases = {check_repo_id(k): check_repo_id(v, "registry 'hub' repo") for k, v in (aliases or {}).items()}
        self.cache = HubCache(self.client.cache_dir, self.hub_repo)
        self.listings = BuildListings(self.client, self.cache)
        self.fetcher = BuildFetcher(self.client, self.cache, self.listings)

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    @property
    def cache_dir(self) -> Path:
        return self.client.cache_dir

    @property
    def offline(self) -> bool:
        return self.client.offline

    @classmethod
    def for_repo(cls, repo_id: str, registry_entry: AliasedEntry | None = None) -> HubSource:
        hub_repo = registry_entry.hub_repo if registry_entry is not None else None
        return cls(aliases={repo_id: hub_repo} if hub_repo else None)

    def describe(self) -> str:
        return f"Hub {self.endpoint}" + (" (offline: cache only)" if self.offline else "")

    def origin(self, repo_id: str) -> Origin:
        return Origin("hub", self.hub_repo(repo_id), self.endpoint)

    def hub_repo(self, repo_id: str) -> str:
        """The repo actually fetched for `repo_id` (a registry entry's `hub:` alias, else itself)."""
        return check_repo_id(self.aliases.get(repo_id, repo_id))

    # -- Source protocol --------------------------------------------------------------------------
    def refs(self, repo_id: str) -> list[Ref]:
        """Tags and branches (1 request); kept in the cache so offline resolution works. Refs whose name or
        target is not safe are dropped (see checked_refs)."""
        saved = self.cache.refs_file(repo_id)
        if self.offline:
            data = read_json(saved)
            if not isinstance(data, dict) or not isinstance(data.get("refs"), list):
                raise self.client.not_cached(repo_id, "its list of versions")
            return checked_refs([(r.get("name"), r.get("kind"), r.get("commit")) for r in data["refs"]
                                 if isinstance(r, dict) and r.get("kind") in ("tag", "branch")])
        branches, tags = self.client.list_refs(repo_id, self.hub_repo(repo_id))
        refs = checked_refs([(name, "branch", commit) for name, commit in branches]
                            + [(name, "tag", commit) for name, commit in tags])
        note_json(saved, {"endpoint": self.endpoint,
                          "refs": [{"name": r.name, "kind": r.kind, "commit": r.commit} for r in refs]})
        return refs

    def listing(self, repo_id: str, commit: str) -> dict[str, Any]:
        """What `commit` publishes under build/ (listing.py), from ONE recursive tree listing, then cached."""
        return self.listings.get(repo_id, commit)

    def published_metadata(self, repo_id: str, commit: str) -> KernelMetadata | None:
        """The kernel.yaml a release publishes at its root: what `info` shows before a build is cached."""
        return published_metadata(self.client, repo_id, commit, self.aliases.get(repo_id))

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        """The variants at `commit`, with their full metadata where a build of that commit is cached: our bundles,
        and kernel-builder trees (a tree beside a bundle of the same name is the bundle's HF-kernels copy)."""
        listed = self.listing(repo_id, commit)
        out = []
        for name in sorted(listed["bundles"]):
            v = self.cache.cached_variant(repo_id, commit, name) or fmt.variant_from_name(name)
            if v is not None:
                out.append(v)
        for name in sorted(set(listed["trees"]) - set(listed["bundles"])):
            out.append(self.cache.cached_variant(repo_id, commit, name) or builder_variant(name))
        return out

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        """The variants to choose from, without a listing request where one is not cached.

        Fetching the first preferred name that exists (HEAD + GET) stands in for the listing, so a fresh
        load costs refs + HEAD + GET = 3 requests; a name not published at `commit` costs one HEAD.
        """
        if self.listings.known(repo_id, commit) is not None:  # a listing of an older client's is not one
            return self.variants(repo_id, commit)
        if self.offline:
            found = [v for n in self.cache.cached_names(repo_id, commit) if is_variant_name(n)
                     and (v := self.cache.cached_variant(repo_id, commit, n)) is not None]
            if not found:
                raise self.client.not_cached(repo_id, f"a build of commit {commit[:12]}")
            return found
        for name in names:
            guess = fmt.variant_from_name(name)
            if guess is None:
                continue
            try:
                return [self.fetch(repo_id, commit, guess).variant]
            except KernelNotFoundError:
                continue  # not published at this commit
        return self.variants(repo_id, commit)  # nothing preferred exists: list, so the trace shows what does

    def fetch(self, repo_id: str, commit: str, variant: Variant,
              expected: dict[str, str] | None = None) -> Build:
        """The variant's package on local disk, every digest checked (and against `expected`, a lock's); see
        download.BuildFetcher.fetch for the order it tries and what anchors a cached build."""
        return self.fetcher.fetch(repo_id, commit, variant, expected)

    def verification(self, repo_id: str, commit: str, variant: Variant) -> str:
        """How a fetch of `variant` checks its bytes, for `resolve` and `info`: a kernel-builder tree's metadata.json
        is read (one small download, nothing imported) to say whether it records a digest."""
        if variant.dialect != KERNEL_BUILDER:
            cached = self.cache.cached_variant(repo_id, commit, variant.name)
            if cached is None or cached.dialect != KERNEL_BUILDER:
                return "sha256 of every file (the bundle's metadata.json), bundle against the Hub listing"
            variant = cached  # the bundle was another build than the tree beside it: the tree was fetched
        folder = self.cache.build_dir(repo_id, commit, variant.name)
        if folder.is_dir():
            with contextlib.suppress(KernelHubError):
                return fmt.read_build_info(folder, repo_id, variant.name).verified + " (cached)"
        files = self.listing(repo_id, commit)["trees"].get(variant.name) or {}
        if fmt.VARIANT_METADATA not in files:
            return f"unverifiable: no {fmt.VARIANT_METADATA} in build/{variant.name}/"
        label = f"{repo_id}@{commit[:12]} [{variant.name}]"
        try:
            data = self.fetcher.download_file(repo_id, commit,
                                              f"{fmt.BUILD_DIR}/{variant.name}/{fmt.VARIANT_METADATA}",
                                              files[fmt.VARIANT_METADATA], force=False,
                                              max_bytes=builder.MAX_METADATA_BYTES)
            meta = builder.parse_builder_metadata(data, label)
        except KernelHubError as exc:
            return f"unverifiable: {one_line(str(exc), 200)}"
        return builder.WITH_DIGEST if meta.digest is not None else builder.NO_DIGEST
