"""`kernel-hub cache ls` / `cache prune`: what the kernel caches hold, and removing it.

Two roots: the Hub cache (KERNELS_CACHE, else HF_HUB_CACHE), where each kernel repo is a `kernels--ORG--NAME`
folder (huggingface_hub's files plus kernel-hub's verified builds inside it), and kernel-hub's own cache
(KERNEL_HUB_CACHE: assembled local folders, validation results, TPU compile results). `cache_entries` lists them,
`prune_plan` decides what goes (pure, with the reason), `prune` removes it: only folders directly inside their
root, never through a link, and only what kernel-hub made and recognises by name: a `kernels--ORG--NAME` folder
laid out as a Hub cache repo, and the parts of KERNEL_HUB_CACHE that system.CACHE_PARTS names. Either root may be a
folder shared with other tools (the Hub cache, ~/.cache, a home folder): their models, datasets, pip caches or
anything else are never listed, so never removed; nor is the TPU environment `kernel-hub setup-tpu` built.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..decide.system import CACHE_PARTS
from ..errors import KernelHubError, UnsafeNameError
from ..names import check_repo_id, safe_rmtree

REPO_PREFIX = "kernels--"
#: What a Hub cache repo folder holds (huggingface_hub's layout, and kernel-hub's state inside it): a
#: `kernels--ORG--NAME` folder with none of these is not one the cache made.
REPO_LAYOUT = ("blobs", "snapshots", "refs", "kernel-hub")


@dataclass(frozen=True)
class CacheEntry:
    kind: str          # "repo" (a kernel repo in the Hub cache) or "kernel-hub" (a part of KERNEL_HUB_CACHE)
    name: str          # the repo id, or the part's folder name
    path: Path
    root: Path         # the root it lies directly in
    size: int          # bytes of its files (links not followed, so a blob is counted once)


def _size(path: Path) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total


def repo_from_folder(name: str) -> str | None:
    """`kernels--ORG--NAME` -> ORG/NAME (None for anything else, or a name that is not a valid repo id)."""
    if not name.startswith(REPO_PREFIX):
        return None
    parts = name[len(REPO_PREFIX):].split("--")
    if len(parts) != 2:
        return None
    try:
        return check_repo_id("/".join(parts))
    except UnsafeNameError:
        return None


def _plain_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def is_cached_repo(path: Path) -> bool:
    """A kernel repo the Hub cache made: named `kernels--ORG--NAME` (a valid repo id), a plain folder (not a link)
    holding the Hub cache's layout."""
    return (repo_from_folder(path.name) is not None and _plain_folder(path)
            and any((path / part).is_dir() for part in REPO_LAYOUT))


def cache_entries(hub_cache: Path, kh_cache: Path) -> list[CacheEntry]:
    """Every kernel repo in the Hub cache and every part of kernel-hub's cache that kernel-hub recognises (links
    and anything of another name skipped, whatever shares those folders), sorted."""
    out: list[CacheEntry] = []
    for child in sorted(hub_cache.iterdir()) if hub_cache.is_dir() else []:
        if is_cached_repo(child):
            out.append(CacheEntry("repo", str(repo_from_folder(child.name)), child, hub_cache, _size(child)))
    for part in CACHE_PARTS:
        child = kh_cache / part
        if _plain_folder(child) and child.resolve() != hub_cache.resolve():
            out.append(CacheEntry("kernel-hub", part, child, kh_cache, _size(child)))
    return out


def prune_plan(entries: Sequence[CacheEntry], repos: Sequence[str], everything: bool) -> tuple[list[CacheEntry], str]:
    """(what to remove, why). `repos`: these kernel repos; `everything`: every entry. Neither: refused, so a bare
    `prune` never empties a cache by surprise. A named repo not cached is refused naming the cached ones. Pure."""
    if everything and repos:
        raise KernelHubError("cache prune takes repo ids or --all, not both")
    if everything:
        return list(entries), "--all: every kernel repo in the Hub cache and every part of kernel-hub's cache"
    if not repos:
        raise KernelHubError("cache prune needs repo ids (ORG/NAME ...) or --all; `kernel-hub cache ls` lists them")
    cached = {e.name: e for e in entries if e.kind == "repo"}
    missing = [check_repo_id(r) for r in repos if r not in cached]
    if missing:
        known = ", ".join(sorted(cached)) or "none"
        raise KernelHubError(f"{missing[0]} is not in the cache (cached kernel repos: {known})")
    return [cached[r] for r in dict.fromkeys(repos)], f"the named repos: {', '.join(dict.fromkeys(repos))}"


def prune(chosen: Sequence[CacheEntry]) -> int:
    """Remove each chosen entry inside its own root (safe_rmtree refuses anything else); bytes freed."""
    freed = 0
    for entry in chosen:
        if entry.path.parent != entry.root or entry.path.is_symlink():
            raise KernelHubError(f"{entry.path} is not a folder directly inside {entry.root}; not removing it")
        ours = is_cached_repo(entry.path) if entry.kind == "repo" else entry.path.name in CACHE_PARTS
        if not ours:
            raise KernelHubError(f"{entry.path} is not a cache folder kernel-hub made; not removing it")
        safe_rmtree(entry.root, entry.path)
        freed += entry.size
    return freed


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
