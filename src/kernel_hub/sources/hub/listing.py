"""What a commit publishes under build/: read from ONE recursive tree listing, checked, and kept (in memory and in
the cache; commits are immutable) so later steps and offline runs need no request.

A listing is {"bundles": {variant: blob id of build/<variant>.tar}, "trees": {variant: {path in the variant: blob
id}}, "sizes": {path under build/: bytes}}. The server and the cache are untrusted: unsafe names and ids that are
not git blob ids are left out, and a listing naming one path twice or too many entries is refused whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import IntegrityError, UnsafeNameError
from ...names import check_commit, check_relative_path, check_variant_name
from ...package import buildfmt as fmt
from .cache import HubCache, note_json, read_json
from .client import MAX_LISTING_ENTRIES, HubClient

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoFile, RepoFolder


def is_variant_name(name: str) -> bool:
    try:
        check_variant_name(name)
    except UnsafeNameError:
        return False
    return True


def checked_listing(data: object) -> dict[str, Any] | None:
    """A build listing from the server or the cache with only safe names and real blob ids kept (None: not a
    listing of this format, e.g. an older cache entry)."""
    if not isinstance(data, dict) or not isinstance(data.get("bundles"), dict) or not isinstance(
            data.get("trees"), dict):
        return None
    bundles = {k: v for k, v in data["bundles"].items() if is_variant_name(k) and fmt.is_blob_id(v)}
    trees: dict[str, dict[str, str]] = {}
    for name, files in data["trees"].items():
        if not is_variant_name(name) or not isinstance(files, dict) or len(files) > fmt.MAX_BUNDLE_FILES:
            continue
        kept = {}
        for rel, blob in files.items():
            try:
                check_relative_path(rel)
            except UnsafeNameError:
                continue
            if fmt.is_blob_id(blob):
                kept[rel] = blob
        if kept:
            trees[name] = kept
    raw_sizes = data.get("sizes")
    sizes = {k: v for k, v in raw_sizes.items() if isinstance(k, str) and isinstance(v, int)
             and not isinstance(v, bool) and v >= 0} if isinstance(raw_sizes, dict) else {}
    return {"bundles": bundles, "trees": trees, "sizes": sizes}


def listing_from_tree(entries: Sequence[RepoFile | RepoFolder], label: str) -> dict[str, Any]:
    """The listing of a tree listing's entries (huggingface_hub's RepoFile/RepoFolder). Refused whole: more than
    MAX_LISTING_ENTRIES entries, or one path named twice (which of two ids would it be?)."""
    from huggingface_hub.hf_api import RepoFile

    if len(entries) > MAX_LISTING_ENTRIES:
        raise IntegrityError(f"{label}: the Hub lists more than {MAX_LISTING_ENTRIES} entries "
                             f"under {fmt.BUILD_DIR}/; refused")
    paths = [e.path for e in entries if isinstance(getattr(e, "path", None), str)]
    if len(set(paths)) != len(paths):
        twice = sorted(p for p in set(paths) if paths.count(p) > 1)
        raise IntegrityError(f"{label}: the Hub's listing names {twice[0]} twice; refused")
    raw: dict[str, Any] = {"bundles": {}, "trees": {}, "sizes": {}}
    for e in entries:
        if isinstance(e, RepoFile) and isinstance(e.path, str):
            rel = e.path[len(fmt.BUILD_DIR) + 1:] if e.path.startswith(f"{fmt.BUILD_DIR}/") else ""
            name, _, inner = rel.partition("/")
            size = e.lfs.size if e.lfs is not None else e.size
            if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                raw["sizes"][rel] = size
            if inner:
                raw["trees"].setdefault(name, {})[inner] = e.blob_id
            elif name.endswith(fmt.BUNDLE_SUFFIX):
                raw["bundles"][name[:-len(fmt.BUNDLE_SUFFIX)]] = e.blob_id
    return checked_listing(raw) or {"bundles": {}, "trees": {}, "sizes": {}}


class BuildListings:
    """The listings of one source's repos: asked of the Hub at most once per commit, then kept."""

    def __init__(self, client: HubClient, cache: HubCache):
        self.client = client
        self.cache = cache
        self._known: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, repo_id: str, commit: str) -> dict[str, Any]:
        """The listing of `commit`: remembered, else cached, else (online) ONE tree listing, then cached."""
        key = (repo_id, check_commit(commit))
        if key in self._known:
            return self._known[key]
        saved = self.cache.listing_file(repo_id, commit)
        data = checked_listing(read_json(saved))
        if data is None:
            if self.client.offline:
                raise self.client.not_cached(repo_id, f"the build listing of commit {commit[:12]}")
            entries = self.client.list_build_tree(repo_id, self.cache.hub_repo(repo_id), commit)
            data = listing_from_tree(entries, f"{repo_id}@{commit[:12]}")
            note_json(saved, data)
        self._known[key] = data
        return data

    def known(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        """The listing already at hand (remembered or cached), with no request; None where there is none."""
        return self._known.get((repo_id, commit)) or checked_listing(
            read_json(self.cache.listing_file(repo_id, commit)))

    def sizes(self, repo_id: str, commit: str) -> dict[str, int]:
        """Sizes (path under build/ -> bytes) a listing at hand gives; {} where none is known."""
        known = self.known(repo_id, commit)
        return known.get("sizes", {}) if known else {}

    def bundles(self, repo_id: str, commit: str) -> dict[str, str]:
        """The bundles a listing at hand names; {} where none is known yet (no request)."""
        known = self.known(repo_id, commit)
        return known["bundles"] if known else {}

    def forget(self, repo_id: str, commit: str) -> None:
        """Drop a listing (memory and cache): the next use lists again."""
        self._known.pop((repo_id, commit), None)
        with contextlib.suppress(OSError):
            self.cache.listing_file(repo_id, commit).unlink(missing_ok=True)
