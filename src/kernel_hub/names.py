"""One rule for names: everything that names a repo, a variant, a package, a file or a ref is checked here
before it is used, and every path built from such a name stays inside its own root.

Names come from servers, bundles, caches, lock files and kernel.yaml: all untrusted. A name that passes
these checks cannot be absolute, cannot climb out of a folder, cannot be read as a command-line option,
and cannot be mistaken for a commit id. Paths are joined with `safe_join`, deleted with `safe_rmtree`:
both resolve the target and refuse anything outside the root they were given.
"""

from __future__ import annotations

import keyword
import re
import shutil
from pathlib import Path

from .errors import UnsafeNameError

#: One side of ORG/NAME, as the Hub allows it (letters, digits, '.', '_', '-'; no '--' or '..').
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
#: A build variant: lowercase words joined by '-' ("jax-tpu", "torch-cpu", HF's "torch28-cxx11-cu128-x86_64-linux").
#: Kernel-builder's arch names carry dotted versions in up to 11 further words
#: (`torch-2.13-cxx11-cuda-12.8-cpython-3.11-abi3-x86_64-linux`): a dot only inside a word, never two in a row.
_VARIANT = re.compile(r"^[a-z][a-z0-9_]{0,31}(?:-[a-z0-9_](?:[a-z0-9_]|\.(?!\.)){0,30}(?<!\.)){0,11}$")
#: A Python package or module name.
_PYTHON = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: One component of a relative file path inside a package or repo.
_PATH_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
#: A branch or tag name: components as above, joined by '/'.
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}(?:/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}){0,7}$")
_HEX40 = re.compile(r"^[0-9a-fA-F]{40}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_repo_id(repo_id: object, what: str = "repo id") -> str:
    """ORG/NAME with both parts Hub-legal."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise UnsafeNameError(f"{what} must look like ORG/NAME, got {_shown(repo_id)}")
    for part in repo_id.split("/"):
        if not _REPO_PART.fullmatch(part) or ".." in part or "--" in part or part.endswith(".git"):
            raise UnsafeNameError(
                f"{what} {_shown(repo_id)}: {part!r} may hold only letters, digits, '.', '_', '-' "
                "(no '..' or '--', not starting or ending with a symbol)"
            )
    return repo_id


def check_variant_name(name: object, what: str = "variant name") -> str:
    """A build variant name: lowercase words joined by '-', never a path."""
    if not isinstance(name, str) or not _VARIANT.fullmatch(name):
        raise UnsafeNameError(f"{what} {_shown(name)} is not a variant name like 'jax-tpu' or 'torch-cpu'")
    return name


def check_python_name(name: object, what: str = "python_name") -> str:
    """An importable package or module name (no dots, not a keyword)."""
    if not isinstance(name, str) or not _PYTHON.fullmatch(name) or keyword.iskeyword(name):
        raise UnsafeNameError(f"{what} {_shown(name)} is not a Python identifier like 'ragged_dot'")
    return name


def check_entry_file(name: object, what: str = "entry") -> str:
    """A variant's entry: one .py file at the top of the package."""
    if not isinstance(name, str) or not name.endswith(".py") or not _PYTHON.fullmatch(name[:-3]):
        raise UnsafeNameError(f"{what} {_shown(name)} must be a .py file at the package's top, like 'torch_api.py'")
    return name


def check_relative_path(path: object, what: str = "path") -> str:
    """A POSIX path relative to some root: no absolute path, no '.', '..' or empty parts, no hidden files."""
    if not isinstance(path, str) or not path or "\\" in path or "\0" in path:
        raise UnsafeNameError(f"{what} {_shown(path)} is not a relative POSIX path")
    parts = path.split("/")
    if len(parts) > 16 or not all(_PATH_PART.fullmatch(p) and p not in (".", "..") and ".." not in p for p in parts):
        raise UnsafeNameError(f"{what} {_shown(path)} must be a relative path of plain names (no '..', no leading '.')")
    return path


def check_ref_name(name: object, what: str = "ref name") -> str:
    """A branch or tag name that git and the Hub accept, that no tool reads as an option, and that cannot be
    taken for a commit id."""
    if not isinstance(name, str) or not _REF.fullmatch(name) or ".." in name or name.endswith((".lock", ".")):
        raise UnsafeNameError(f"{what} {_shown(name)} is not a valid branch or tag name")
    if _HEX40.fullmatch(name):
        raise UnsafeNameError(f"{what} {_shown(name)} looks like a commit id; refs may not be 40 hex digits")
    return name


def check_commit(commit: object, what: str = "commit") -> str:
    """A full lowercase 40-hex commit id."""
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise UnsafeNameError(f"{what} {_shown(commit)} is not a 40-hex commit id")
    return commit


def is_within(root: Path, target: Path) -> bool:
    """True when `target`, resolved (links followed), is `root` itself or lies under it."""
    root_r, target_r = Path(root).resolve(), Path(target).resolve()
    return target_r == root_r or root_r in target_r.parents


def safe_join(root: Path, *parts: str) -> Path:
    """root / parts, each part checked as a relative path, and the result checked to stay under root."""
    target = Path(root)
    for part in parts:
        target = target / check_relative_path(part)
    if not is_within(root, target):
        raise UnsafeNameError(f"{'/'.join(parts)!r} leads outside {root}")
    return target


def safe_rmtree(root: Path, target: Path) -> None:
    """Delete `target` (a folder or file) only if it lies strictly inside `root`; a link is removed, never
    followed. Refuses anything else with an error instead of deleting it."""
    root_r = Path(root).resolve()
    target = Path(target)
    parent = target.parent.resolve()
    if not (parent == root_r or root_r in parent.parents):
        raise UnsafeNameError(f"refusing to delete {target}: not inside {root}")
    if target.is_symlink() or target.is_file():
        target.unlink(missing_ok=True)
    elif target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
