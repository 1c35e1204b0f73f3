"""kernel-hub's state inside the Hub cache: where a repo's refs, listings and unpacked builds live, the JSON notes
kept there, and the cleanup of what killed processes left behind.

Everything sits in the cache's folder for the repo (`kernels--ORG--NAME/kernel-hub/`), so deleting that folder
deletes it too; every write and delete of ours stays inside it (names.safe_join / names.safe_rmtree). The cache is
untrusted like the server: a note that is not JSON, too large or of another shape reads as missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...decide.variants import Variant
from ...errors import KernelHubError
from ...json_types import JsonValue
from ...names import check_commit, check_variant_name, safe_join, safe_rmtree
from ...package import buildfmt as fmt

#: A cache file (refs.json, a listing) larger than this is neither written nor read.
MAX_CACHED_JSON = 4 << 20
#: A leftover .partial/.trash folder older than this is no unpack in progress (an unpack takes seconds).
STALE_SECONDS = 3600.0


def write_json_atomic(path: Path, data: JsonValue) -> None:
    """Readers see the old file or the new one, never a torn write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def note_json(path: Path, data: JsonValue) -> bool:
    """Cache bookkeeping (refs, listings): written where it fits under MAX_CACHED_JSON and the cache is writable,
    else skipped. A read-only cache (a pre-baked image) loads what it holds; the next run asks the Hub again.
    Returns whether it was written."""
    if len(json.dumps(data)) > MAX_CACHED_JSON:
        return False
    try:
        write_json_atomic(path, data)
    except OSError:
        return False
    return True


def read_json(path: Path) -> Any | None:
    """A cache file's JSON, or None where it is missing, unreadable, not JSON or over MAX_CACHED_JSON."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CACHED_JSON + 1)
        return json.loads(raw) if len(raw) <= MAX_CACHED_JSON else None
    except (OSError, ValueError):
        return None


class HubCache:
    """The cache layout for the repos of one source. `hub_repo` maps the name asked for to the repo fetched (a
    registry alias), so two names of one repo share its folder."""

    def __init__(self, cache_dir: Path, hub_repo: Callable[[str], str]):
        self.cache_dir = cache_dir
        self.hub_repo = hub_repo
        self._cleaned: set[str] = set()

    def repo_dir(self, repo_id: str) -> Path:
        """The Hub cache's folder for this repo: every write and delete of ours stays inside it."""
        from huggingface_hub.file_download import repo_folder_name

        return self.cache_dir / repo_folder_name(repo_id=self.hub_repo(repo_id), repo_type=fmt.REPO_TYPE)

    def root(self, repo_id: str) -> Path:
        """Our state for one repo, inside the Hub cache's folder for it (deleted along with it)."""
        return self.repo_dir(repo_id) / fmt.KH_KEY

    def builds_root(self, repo_id: str) -> Path:
        return self.root(repo_id) / "builds"

    def build_dir(self, repo_id: str, commit: str, variant: str) -> Path:
        return safe_join(self.builds_root(repo_id), check_commit(commit), check_variant_name(variant))

    def refs_file(self, repo_id: str) -> Path:
        return self.root(repo_id) / "refs.json"

    def listing_file(self, repo_id: str, commit: str) -> Path:
        return safe_join(self.root(repo_id), "listings", f"{check_commit(commit)}.json")

    def cached_variant(self, repo_id: str, commit: str, name: str) -> Variant | None:
        """The variant an unpacked build of `commit` describes (None: no readable build of that name here)."""
        folder = self.build_dir(repo_id, commit, name)
        if not folder.is_dir():
            return None
        try:
            return fmt.read_build_info(folder, f"{repo_id}@{commit[:12]} [{name}]", name).variant
        except KernelHubError:
            return None

    def cached_names(self, repo_id: str, commit: str) -> list[str]:
        """The entries of `commit`'s builds folder (unchecked names; [] where there is none)."""
        commit_dir = safe_join(self.builds_root(repo_id), check_commit(commit))
        return sorted(p.name for p in commit_dir.iterdir()) if commit_dir.is_dir() else []

    def clean_stale(self, repo_id: str) -> list[Path]:
        """Remove what killed processes left in this repo's cache folder, once per source: our .partial/.trash
        folders and .tmp files older than STALE_SECONDS, and huggingface_hub's `*.incomplete` blobs that no
        download holds the lock of. Returns what was removed."""
        if repo_id in self._cleaned:
            return []
        self._cleaned.add(repo_id)
        removed = []
        builds = self.builds_root(repo_id)
        now = time.time()
        root = self.root(repo_id)
        ours = [*builds.glob("*/*"), *root.glob(".*.tmp"), *root.glob("listings/.*.tmp")] if root.is_dir() else []
        for path in ours:
            if path.name.endswith((".partial", ".trash", ".tmp")):
                with contextlib.suppress(OSError):
                    if now - path.lstat().st_mtime > STALE_SECONDS:
                        safe_rmtree(root, path)
                        removed.append(path)
        blobs = self.repo_dir(repo_id) / "blobs"
        for path in blobs.glob("*.incomplete") if blobs.is_dir() else []:
            if self._download_dead(repo_id, path, now):
                with contextlib.suppress(OSError, KernelHubError):
                    safe_rmtree(blobs, path)
                    removed.append(path)
        return removed

    def _download_dead(self, repo_id: str, incomplete: Path, now: float) -> bool:
        """True when no process is downloading into `incomplete`: huggingface_hub holds the blob's lock
        (`.locks/<repo folder>/<etag>.lock`) for the whole download, so a lock we can take proves it dead."""
        etag = incomplete.name.split(".", 1)[0]
        if not fmt.is_blob_id(etag) and not re.fullmatch(r"[0-9a-f]{64}", etag):
            return False
        lock_path = self.cache_dir / ".locks" / self.repo_dir(repo_id).name / f"{etag}.lock"
        try:
            from filelock import FileLock, Timeout

            lock = FileLock(str(lock_path), timeout=0)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                return False
            lock.release()
            return True
        except Exception:  # no usable lock here: fall back to age
            try:
                return now - incomplete.lstat().st_mtime > STALE_SECONDS
            except OSError:
                return False
