"""File digests: computed over a package tree, checked before anything in it is imported."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import IntegrityError

_SKIP_DIRS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_files(root: Path) -> list[Path]:
    """The files of a package tree that ship, in a stable order (every file but Python's caches)."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _SKIP_DIRS for part in rel.parts) or path.suffix in _SKIP_SUFFIXES:
            continue
        if path.is_file():
            out.append(path)
    return out


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every shipped file under `root`, keyed by its POSIX path relative to root."""
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in package_files(root)}


def combined_digest(digests: dict[str, str]) -> str:
    """One digest for a whole tree: stable over file order, changes with any name or content."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\n".encode())
    return h.hexdigest()


def verify_tree(root: Path, expected: dict[str, str], what: str, *, ignore: frozenset[str] = frozenset()) -> None:
    """Raise IntegrityError naming the first file whose digest differs, is missing or is unexpected.

    `ignore`: relative paths that may be present without a recorded digest (a build's own metadata file).
    """
    for name, digest in sorted(expected.items()):
        path = root / name
        if not path.is_file():
            raise IntegrityError(f"{what}: file {name} is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise IntegrityError(
                f"{what}: file {name} has sha256 {actual[:12]}..., expected {digest[:12]}... (tampered or corrupt)"
            )
    extra = sorted(p.relative_to(root).as_posix() for p in package_files(root)) if root.is_dir() else []
    unexpected = [n for n in extra if n not in expected and n not in ignore]
    if unexpected:
        raise IntegrityError(f"{what}: unexpected file {unexpected[0]} not in the recorded digests")
