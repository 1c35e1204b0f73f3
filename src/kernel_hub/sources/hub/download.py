"""Fetching one build of a commit into the cache: our bundle (`build/<variant>.tar`, one download, unpacked), or a
kernel-builder tree (`build/<variant>/`, file by file), every byte checked before it lands where the loader looks.

A build is unpacked beside its place (`kernel-hub/builds/<commit>/<variant>`), checked, and renamed into place in
one step, so a cut-off or concurrent download never leaves a half entry; a damaged build is moved aside and
deleted, then fetched again.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from ...decide.builder_names import parse_builder_name
from ...decide.variants import KERNEL_BUILDER, Variant
from ...errors import IntegrityError, KernelHubError, KernelNotFoundError, MetadataError, UnsafeNameError
from ...names import safe_join, safe_rmtree
from ...package import buildfmt as fmt
from ...package.integrity import sha256_bytes, verify_tree
from ..base import Build
from ..http_limits import MAX_DOWNLOAD_ENV, build_byte_cap, operation
from . import builder
from .builder import builder_variant
from .cache import HubCache
from .client import HubClient
from .listing import BuildListings

_DAMAGED = (IntegrityError, MetadataError, UnsafeNameError)  # a cached copy that is not a clean build


def _file_blob(path: Path) -> str | None:
    """The git blob id of a file, or None where it cannot be read."""
    try:
        return fmt.git_blob_id(path)
    except OSError:
        return None


def check_unpacked(folder: Path, label: str, name: str) -> fmt.BuildInfo:
    """An unpacked variant: a plain folder whose metadata.json describes `name`, every file against the sha256
    it records, nothing extra (no bytecode, no links, nothing outside the package)."""
    if folder.is_symlink() or not folder.is_dir():
        raise IntegrityError(f"{label}: the cached build is not a plain folder")
    info = fmt.read_build_info(folder, label, name)
    verify_tree(folder, info.sha256, label, ignore=frozenset({fmt.VARIANT_METADATA}), strict=True)
    return info


class BuildFetcher:
    """Builds of one source's repos, fetched through its client into its cache, checked against its listings."""

    def __init__(self, client: HubClient, cache: HubCache, listings: BuildListings):
        self.client = client
        self.cache = cache
        self.listings = listings

    def fetch(self, repo_id: str, commit: str, variant: Variant, expected: dict[str, str] | None = None) -> Build:
        """The variant's package on local disk, every digest checked (and against `expected`, a lock's).

        Tries the unpacked build, then the bundle already in the Hub cache, then (online) a fresh
        download; a damaged step is removed before the next, so a tampered file is refetched.

        Trust anchor: the unpacked build is checked against its own metadata.json, not against the Hub again, so
        whoever can write the cache can rewrite both consistently; only `expected` (a lock's digests) pins the
        files from outside the cache (docs/trust.md: "What anchors a cached build").

        A file that vanishes meanwhile (another process pruning the cache) costs one fresh try, then one
        KernelHubError: never a raw OSError.
        """
        try:
            return self._fetch_once(repo_id, commit, variant, expected)
        except OSError:  # a cached file vanished under us (another process pruning the cache): once more, afresh
            pass
        try:
            return self._fetch_once(repo_id, commit, variant, expected)
        except OSError as exc:
            raise KernelHubError(f"{repo_id}@{commit[:12]} [{variant.name}]: {exc.filename or 'a cached file'}: "
                                 f"{exc.strerror or exc} while fetching into the cache (another process may be "
                                 "pruning it); load it again") from None

    def _fetch_once(self, repo_id: str, commit: str, variant: Variant, expected: dict[str, str] | None) -> Build:
        final = self.cache.build_dir(repo_id, commit, variant.name)
        self.cache.clean_stale(repo_id)
        label = f"{repo_id}@{commit[:12]} [{variant.name}]"
        problem: KernelHubError | None = None
        tree = variant.dialect == KERNEL_BUILDER
        offline = self.client.offline
        for attempt in ("unpacked", "cached bundle", "download"):
            if attempt == "unpacked" and not (final.exists() or final.is_symlink()):
                continue
            if attempt == "download" and offline:
                break
            try:
                cached = self.cache.cached_variant(repo_id, commit, variant.name) if attempt == "unpacked" else None
                if cached is not None and cached.dialect == KERNEL_BUILDER:
                    tree, variant = True, cached  # unpacked from the tree at this commit (HF kernels' choice)
                if attempt == "unpacked" and not tree and self._bundle_superseded(
                        repo_id, commit, variant.name, _file_blob(final / fmt.VARIANT_METADATA), listed_only=True):
                    raise IntegrityError(f"{label}: the cached build is the bundle, but build/{variant.name}/ at this "
                                         "commit (what HF kernels loads) is another build")
                if attempt != "unpacked" and not tree:
                    bundle = self.download_bundle(repo_id, commit, variant.name, force=attempt == "download")
                    if self._bundle_superseded(repo_id, commit, variant.name, fmt.bundle_metadata_blob(bundle)):
                        tree, variant = True, builder_variant(variant.name)  # HF kernels' choice: the tree
                    else:
                        self._unpack(bundle, final, label)
                if attempt != "unpacked" and tree:
                    self._assemble_tree(repo_id, commit, variant, final, label, force=attempt == "download")
                return self._checked_build(repo_id, commit, final, variant.name, expected, label)
            except _DAMAGED as exc:
                problem = exc
                self._discard(repo_id, final)
            except KernelHubError:
                if problem is None or not offline:
                    raise
                raise IntegrityError(f"{problem}; offline, and no clean copy is cached to restore it") from None
        assert problem is not None
        raise problem

    def _bundle_superseded(self, repo_id: str, commit: str, name: str, bundle_metadata: str | None,
                           listed_only: bool = False) -> bool:
        """One rule for a commit that holds both `build/<name>.tar` and a `build/<name>/` tree: where HF kernels reads
        that tree (a torch variant name it parses), kernel-hub loads what HF kernels loads. The bundle stands only
        when it is the same build: its metadata.json is the tree's (git blob id `bundle_metadata`), as our publish
        writes them; otherwise the tree wins. listed_only: decide from a listing already at hand (no request)."""
        if parse_builder_name(name) is None:
            return False
        known = self.listings.known(repo_id, commit)
        if known is None:
            if listed_only or self.client.offline:
                return False
            known = self.listings.get(repo_id, commit)
        tree_metadata = known["trees"].get(name, {}).get(fmt.VARIANT_METADATA)
        return tree_metadata is not None and tree_metadata != bundle_metadata

    def download_bundle(self, repo_id: str, commit: str, name: str, force: bool) -> Path:
        """`build/<name>.tar` in the Hub cache, checked against the listing (or its ETag) and the build cap."""
        path_in_repo = fmt.bundle_path(name)
        cap = build_byte_cap()
        listed_size = self.listings.sizes(repo_id, commit).get(f"{name}{fmt.BUNDLE_SUFFIX}")
        if listed_size is not None and listed_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is {listed_size} bytes, over the "
                                 f"{cap}-byte cap on one build ({MAX_DOWNLOAD_ENV} sets it); not downloaded")
        path = self.client.download(repo_id, self.cache.hub_repo(repo_id), path_in_repo, commit, force=force,
                                    max_bytes=cap)
        if path.stat().st_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is over the {cap}-byte cap on one build "
                                 f"({MAX_DOWNLOAD_ENV} sets it)")
        listed = self.listings.bundles(repo_id, commit).get(name)
        if listed and fmt.git_blob_id(path) != listed and not self.client.offline:
            # The listing may be the wrong one (a cached listing from a hostile answer): drop it, list again.
            self.listings.forget(repo_id, commit)
            listed = self.listings.get(repo_id, commit)["bundles"].get(name)
        if listed and fmt.git_blob_id(path) != listed:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} does not match the Hub listing")
        blob = path.resolve().name  # the Hub cache stores a file under its ETag: the git blob id here
        if not listed and len(blob) == 40 and fmt.git_blob_id(path) != blob:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} does not match its ETag")
        return path

    def download_file(self, repo_id: str, commit: str, path_in_repo: str, blob: str, force: bool,
                      max_bytes: int | None = None) -> bytes:
        """One file of a tree at `commit`, its bytes checked against the git blob id the listing gave. At most
        `max_bytes` (default: the build cap): refused from the listing's size before any request, cut while it
        streams, and never read past the bound from the cache."""
        cap = build_byte_cap() if max_bytes is None else max_bytes
        listed_size = self.listings.sizes(repo_id, commit).get(path_in_repo[len(fmt.BUILD_DIR) + 1:])
        if listed_size is not None and listed_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is {listed_size} bytes, over its "
                                 f"{cap}-byte bound; not downloaded")
        path = self.client.download(repo_id, self.cache.hub_repo(repo_id), path_in_repo, commit, force=force,
                                    max_bytes=max_bytes)
        with open(path, "rb") as handle:
            data = handle.read(cap + 1)
        if len(data) > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is larger than its {cap}-byte bound")
        if fmt.git_blob_id_bytes(data) != blob:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: file {path_in_repo} does not match the Hub listing")
        return data

    def _assemble_tree(self, repo_id: str, commit: str, variant: Variant, final: Path, label: str,
                       force: bool) -> None:
        """A kernel-builder variant: its metadata.json, then every file, each checked against the metadata's
        sha256 digest (or, with none, the listing's blob id) before anything is written where the loader looks;
        then the import folder is renamed into place in one step."""
        files = self.listings.get(repo_id, commit)["trees"].get(variant.name)
        if not files or fmt.VARIANT_METADATA not in files:
            raise KernelNotFoundError(f"{label}: the variant has no {fmt.VARIANT_METADATA} at this commit")
        base = f"{fmt.BUILD_DIR}/{variant.name}"
        meta = builder.parse_builder_metadata(self.download_file(
            repo_id, commit, f"{base}/{fmt.VARIANT_METADATA}", files[fmt.VARIANT_METADATA], force,
            max_bytes=builder.MAX_METADATA_BYTES), label)
        builder.check_python_depends(meta.python_depends, label)
        expected = builder.expected_files(meta, files, label)
        kind, where = builder.package_files(meta, sorted(expected), label)
        cap = build_byte_cap()
        sizes = self.listings.sizes(repo_id, commit)
        listed = sum(sizes.get(f"{variant.name}/{rel}", 0) for rel in expected)
        if listed > cap:
            raise IntegrityError(f"{label}: the build's files are {listed} bytes in the Hub listing, over the "
                                 f"{cap}-byte cap on one build ({MAX_DOWNLOAD_ENV} sets it); nothing downloaded")
        verified = builder.WITH_DIGEST if meta.digest is not None else builder.NO_DIGEST
        tmp = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.partial")
        try:
            writer = builder.BuildWriter(tmp, meta, label)
            fetched = written = 0
            with operation(f"fetching {label}", download=True, max_bytes=cap):
                for rel, (algorithm, value) in sorted(expected.items()):
                    data = self.download_file(repo_id, commit, f"{base}/{rel}", files[rel], force,
                                              max_bytes=cap - fetched)
                    fetched += len(data)
                    if algorithm == "sha256" and sha256_bytes(data) != value:
                        raise IntegrityError(f"{label}: file {rel} does not match metadata.json's digest (tampered "
                                             "or corrupt); refused before any import")
                    if kind == "zip" and rel == where:
                        written += builder.unzip_to(data, writer.add, label, cap - written)
                    elif (kind == "package" and rel.startswith(where)) or kind == "root":
                        written += len(data)
                        if written > cap:
                            raise IntegrityError(f"{label}: the build is over the {cap}-byte cap on one build "
                                                 f"({MAX_DOWNLOAD_ENV} sets it)")
                        writer.add(rel[len(where):] if kind == "package" else rel, [data])
                    del data  # memory: one file at a time
            writer.finish(variant, verified, repo_id)
            check_unpacked(tmp, label, final.name)
            _rename_into_place(tmp, final)
        finally:
            if tmp.exists():
                safe_rmtree(final.parent, tmp)

    def _unpack(self, bundle: Path, final: Path, label: str) -> None:
        """Unpack into a private folder beside `final`, check it, then rename it into place in one step."""
        tmp = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.partial")
        try:
            fmt.unpack_bundle(bundle, tmp, label, build_byte_cap())
            check_unpacked(tmp, label, final.name)
            _rename_into_place(tmp, final)
        finally:
            if tmp.exists():
                safe_rmtree(final.parent, tmp)

    def _discard(self, repo_id: str, final: Path) -> None:
        """Move a damaged build aside, then delete it: readers never see a half-deleted build. Only ever inside
        this repo's builds folder."""
        builds = self.cache.builds_root(repo_id)
        if not (final.exists() or final.is_symlink()):
            return
        trash = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.trash")
        with contextlib.suppress(OSError):
            os.rename(final, trash)
            safe_rmtree(builds, trash)

    def _checked_build(self, repo_id: str, commit: str, folder: Path, name: str, expected: dict[str, str] | None,
                       label: str) -> Build:
        info = check_unpacked(folder, label, name)
        digests = info.package_digests()
        if expected is not None and expected != digests:
            changed = sorted(set(expected) ^ set(digests)) or sorted(
                k for k in expected if expected[k] != digests.get(k))
            raise IntegrityError(f"{label}: file {changed[0]} differs from the lock")
        if info.python_depends:  # what is installed can change between loads of a cached build
            builder.check_python_depends(info.python_depends, label)
        return Build(repo_id=repo_id, version=info.version, commit=commit, variant=info.variant,
                     package_dir=safe_join(folder, info.python_name), source=self.client.endpoint, digests=digests,
                     metadata=None, verified=info.verified, kernel_depends=info.kernel_depends,
                     kernels_minver=info.kernels_minver)


def _rename_into_place(tmp: Path, final: Path) -> None:
    """One rename; losing a race to another process that put the same build there is no failure."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
