"""File digests and the rule for what may run: computed over a package tree, checked before anything in it is
imported.

Only Python source that a digest covers runs (the loader compiles it from the checked bytes). Files Python or the
dynamic loader can run *without* reading a .py (bytecode, `__pycache__`, native extensions, `.pth`) are never part
of a build: a Hub build holding one is refused. A local kernel folder (the user's own working copy) may hold
Python's caches; they are left out of its digests and never run, because the loader never reads bytecode.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ..errors import IntegrityError
from ..names import check_relative_path

#: Folders Python and pytest fill on their own in a working copy: never shipped, never run.
CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache"})
#: Suffixes of files that run without their source being read: bytecode, native extensions, path hooks.
NOT_SOURCE_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dylib", ".dll", ".pth")
_BYTECODE = (".pyc", ".pyo")
_SHA256_HEX = frozenset("0123456789abcdef")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _SHA256_HEX


def not_source_reason(rel: str) -> str | None:
    """Why a file at relative path `rel` could run without a digest-checked .py, or None when it cannot."""
    parts = rel.split("/")
    if any(p == "__pycache__" for p in parts[:-1]):
        return "a __pycache__ folder (bytecode)"
    lower = parts[-1].lower()
    for suffix in NOT_SOURCE_SUFFIXES:
        if lower.endswith(suffix) or (suffix == ".so" and ".so." in lower):
            kind = "bytecode" if suffix in _BYTECODE else "a .pth path hook" if suffix == ".pth" else "native code"
            return f"{kind} ({suffix})"
    return None


_MACHO = (b"\xfe\xed\xfa\xce", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe",
          b"\xbe\xba\xfe\xca")


def native_code_reason(head: bytes) -> str | None:
    """Why a file whose first bytes are `head` (1 KiB is enough) is native code the dynamic loader would run,
    whatever its name: an ELF, Mach-O (fat included) or PE image; None for anything else."""
    if head.startswith(b"\x7fELF"):
        return "native code (an ELF image)"
    if head[:4] in _MACHO:
        return "native code (a Mach-O image)"
    if head.startswith(b"MZ") and len(head) >= 0x40:
        offset = int.from_bytes(head[0x3C:0x40], "little")
        if head[offset:offset + 4] == b"PE\0\0":
            return "native code (a PE image)"
    return None


def file_head(path: Path, size: int = 1024) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def package_files(root: Path, *, within: Path | None = None) -> list[Path]:
    """The files of a local package tree that ship, in a stable order: every file but Python's caches and
    hidden (dot) files.

    Links to folders are not followed. With `within`, a link whose target lies outside that folder is refused
    (publish reads a kernel folder: nothing outside it may leak into a build).
    """
    root = Path(root)
    limit = Path(within).resolve() if within is not None else None
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in CACHE_DIRS and not d.startswith("."))
        for name in [*dirnames, *filenames]:
            path = here / name
            if limit is not None and path.is_symlink():
                target = path.resolve()
                if target != limit and limit not in target.parents:
                    rel = path.relative_to(root).as_posix()
                    raise IntegrityError(f"{root}: {rel} is a link to {target}, outside {limit}; copy the file in")
        out += [here / f for f in filenames
                if not f.startswith(".") and not f.endswith(_BYTECODE) and (here / f).is_file()]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def all_files(root: Path, what: str) -> list[str]:
    """Every entry under `root` as relative POSIX paths, for a downloaded build: nothing skipped, and a link,
    a device or anything but a plain file or folder is refused (our own unpacking never makes one)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            mode = path.lstat().st_mode
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise IntegrityError(f"{what}: {rel} is a link or special file, not a plain file")
            if stat.S_ISREG(mode):
                out.append(rel)
    return sorted(out)


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every shipped file under `root`, keyed by its POSIX path relative to root."""
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in package_files(root)}


def combined_digest(digests: dict[str, str]) -> str:
    """One digest for a whole tree: stable over file order, changes with any name or content."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\n".encode())
    return h.hexdigest()


def check_digests(digests: object, what: str) -> dict[str, str]:
    """A digest map from a lock file or a build's metadata: relative paths of plain names to sha256 hex, and no
    file that could run without its source being checked."""
    if not isinstance(digests, dict) or not digests:
        raise IntegrityError(f"{what}: the file digests must be a non-empty mapping of path to sha256")
    for name, digest in digests.items():
        check_relative_path(name, f"{what}: file")
        reason = not_source_reason(name)
        if reason is not None:
            raise IntegrityError(f"{what}: file {name} is {reason}; builds hold Python source only")
        if not is_sha256(digest):
            raise IntegrityError(f"{what}: file {name} has no sha256 (got {str(digest)[:20]!r})")
    return dict(digests)


def verify_tree(root: Path, expected: dict[str, str], what: str, *, ignore: frozenset[str] = frozenset(),
                strict: bool = False) -> None:
    """Raise IntegrityError naming the first file whose digest differs, is missing or is unexpected.

    `ignore`: relative paths that may be present without a recorded digest (a build's own metadata file).
    `strict` (downloaded builds): every entry counts, Python's caches included, and links are refused;
    otherwise (a local folder) Python's caches are left out, as they never run.
    """
    check_digests(expected, what)
    present = all_files(root, what) if strict and root.is_dir() else (
        sorted(p.relative_to(root).as_posix() for p in package_files(root)) if root.is_dir() else [])
    for name in present:
        reason = not_source_reason(name)
        if reason is None and strict:
            reason = native_code_reason(file_head(root.joinpath(*name.split("/"))))
        if reason is not None and name not in ignore:
            raise IntegrityError(f"{what}: {name} is {reason}; only digest-checked source may run")
    for name, digest in sorted(expected.items()):
        path = root.joinpath(*name.split("/"))
        if path.is_symlink() and strict:
            raise IntegrityError(f"{what}: file {name} is a link")
        if not path.is_file():
            raise IntegrityError(f"{what}: file {name} is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise IntegrityError(
                f"{what}: file {name} has sha256 {actual[:12]}..., expected {digest[:12]}... (tampered or corrupt)"
            )
    unexpected = [n for n in present if n not in expected and n not in ignore]
    if unexpected:
        raise IntegrityError(f"{what}: unexpected file {unexpected[0]} not in the recorded digests")
