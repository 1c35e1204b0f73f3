"""Names in requests, checked before they reach the store: repo ids, ref names and paths in a repo.

Built on kernel_hub.names (one rule for names in the project); what the server adds is what the Hub
allows on top of it: full ref names (`refs/heads/v1`, `refs/tags/v1.0.0`), git's own ref-format rules,
and dot-files such as `.gitattributes` in a repo. A refused name is a 400 naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass

from dulwich.refs import check_ref_format

from ..errors import UnsafeNameError
from ..names import check_commit, check_ref_name, check_relative_path, check_repo_id
from .errors import HubError

REPO_TYPES = ("model", "kernel", "dataset")
REF_PREFIXES = {"branch": "refs/heads/", "tag": "refs/tags/"}
_RESERVED_REFS = {"HEAD"}


def _refused(exc: UnsafeNameError) -> HubError:
    return HubError(400, str(exc))


def repo_id(namespace: str, name: str) -> str:
    """ORG/NAME as the Hub allows it (kernel_hub.names.check_repo_id)."""
    try:
        return check_repo_id(f"{namespace}/{name}")
    except UnsafeNameError as exc:
        raise _refused(exc) from None


def namespace(name: str) -> str:
    return repo_id(name, "x").split("/")[0]


def repo_type(value: object) -> str:
    if value not in REPO_TYPES:
        raise HubError(400, f"unknown repo type {str(value)[:40]!r} (this store keeps {', '.join(REPO_TYPES)})")
    return str(value)


def ref_name(name: object, kind: str) -> str:
    """A branch or tag name, short (`v1`) or full (`refs/heads/v1` for a branch) -> the short name.

    Refused: option-like names (`--force`), 40-hex names (a ref that reads as a commit id), names git
    refuses (`a.lock`, `x/.y`), `HEAD`, and a full name of the other kind (`refs/tags/x` as a branch).
    """
    if isinstance(name, str):
        for other, prefix in REF_PREFIXES.items():
            if name.startswith(prefix):
                if other != kind:
                    raise HubError(400, f"{name!r} names a {other}, not a {kind}")
                name = name[len(prefix):]
                break
    try:
        short = check_ref_name(name, f"{kind} name")
    except UnsafeNameError as exc:
        raise _refused(exc) from None
    if (short in _RESERVED_REFS or short.startswith("refs/") or any(p.endswith(".lock") for p in short.split("/"))
            or not check_ref_format(f"{REF_PREFIXES[kind]}{short}".encode())):
        raise HubError(400, f"{kind} name {short!r} is not a valid git ref name")
    return short


@dataclass(frozen=True)
class Revision:
    """What a revision in a URL names: a commit id, a branch or tag (kind known from a full name), or a
    name to look up as a branch first, then a tag."""

    name: str
    kind: str | None  # "commit" | "branch" | "tag" | None (either)


def commit_id(value: object, what: str = "expectedCommit") -> str:
    """A full 40-hex commit id (400 otherwise)."""
    try:
        return check_commit(value if isinstance(value, str) else "", what)
    except UnsafeNameError as exc:
        raise _refused(exc) from None


def revision(value: str) -> Revision:
    """A revision from a URL: a 40-hex commit id, a full ref name, or a short branch/tag name."""
    try:
        return Revision(check_commit(value), "commit")
    except UnsafeNameError:
        pass
    for kind, prefix in REF_PREFIXES.items():
        if value.startswith(prefix):
            return Revision(ref_name(value, kind), kind)
    try:
        return Revision(check_ref_name(value, "revision"), None)
    except UnsafeNameError as exc:
        raise _refused(exc) from None


def repo_path(path: object, what: str = "path in repo") -> str:
    """A file or folder path inside a repo: kernel_hub.names.check_relative_path, plus dot-files
    (`.gitattributes`, `.github/x`) that a Hub repo may hold; never `.git` or `..`."""
    if not isinstance(path, str):
        raise HubError(400, f"{what} must be a string, got {type(path).__name__}")
    parts = path.split("/")
    if any(p.lower() == ".git" for p in parts):
        raise HubError(400, f"{what} {path[:80]!r} may not name a .git folder")
    undotted = "/".join(p[1:] if p.startswith(".") and len(p) > 1 else p for p in parts)
    try:
        check_relative_path(undotted, what)
    except UnsafeNameError:
        raise HubError(400, f"{what} {path[:80]!r} must be a relative path of plain names "
                            "(letters, digits, '.', '_', '-'; no '..', no empty parts)") from None
    return path
