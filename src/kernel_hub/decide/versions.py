"""Version resolution: (refs of a repo, what the user asked) -> one commit, with the reason.

Pure: no I/O. The Hub convention is release tags `vX.Y.Z` and major branches `vN`; an int asks for the
branch `v<N>`, a string is a PEP 440 specifier over the release tags, a revision is any ref or commit.
Refs come from a server: one whose name is not a safe ref name (an option, a 40-hex "commit") or whose target
is not a commit id is ignored, and a full commit id is always that commit, never a ref of that name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..errors import UnsafeNameError, VersionSpecError
from ..names import check_commit, check_ref_name

_TAG = re.compile(r"^v(\d+\.\d+\.\d+(?:[.+-]?\w+)*)$")
_BRANCH = re.compile(r"^v(\d+)$")
_HEX40 = re.compile(r"^[0-9a-fA-F]{40}$")
_HEX = re.compile(r"^[0-9a-fA-F]{7,40}$")


@dataclass(frozen=True)
class Ref:
    name: str    # "v1.2.0", "v1", "main"
    kind: str    # "tag" | "branch"
    commit: str


@dataclass(frozen=True)
class Resolution:
    commit: str
    ref: str | None        # the ref name that led here, None for a bare commit
    version: str | None    # "1.2.0" where a release tag names this commit
    reason: str


def tag_version(name: str) -> Version | None:
    """The release version a tag names, or None for tags that are not `vX.Y.Z`."""
    match = _TAG.match(name)
    if not match:
        return None
    try:
        return Version(match.group(1))
    except InvalidVersion:
        return None


MAX_SPEC = 200


def parse_spec(spec: str) -> SpecifierSet:
    """A PEP 440 specifier; a bare version "1.2.0" means exactly that version. At most MAX_SPEC characters (no
    version has thousands of digits, and Python refuses to read such numbers)."""
    text = spec.strip()
    if len(text) > MAX_SPEC:
        raise VersionSpecError(f"version {text[:20]!r}...: {len(text)} characters is not a PEP 440 specifier (at most "
                               f"{MAX_SPEC})")
    if text.startswith("v") and tag_version(text):
        text = text[1:]
    try:
        Version(text)
        text = f"=={text}"
    except InvalidVersion:
        pass
    if any(not part.strip() for part in text.split(",")):
        raise VersionSpecError(f"version {spec!r} is not a PEP 440 specifier (empty clause): write e.g. '>=1.2,<2'")
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise VersionSpecError(
            f"version {spec!r} is not a PEP 440 specifier: write e.g. '>=1.2,<2', '~=1.3' or an int major version"
        ) from None


def _version_at(refs: list[Ref], commit: str) -> str | None:
    versions = [v for r in refs if r.kind == "tag" and r.commit == commit and (v := tag_version(r.name))]
    return str(max(versions)) if versions else None


def _available(refs: list[Ref]) -> str:
    names = sorted({r.name for r in refs})
    return ", ".join(names) if names else "none"


def safe_refs(refs: list[Ref]) -> list[Ref]:
    """The refs that may steer resolution: safe names, tag or branch, pointing at a full commit id."""
    out = []
    for r in refs:
        try:
            check_ref_name(r.name)
            check_commit(r.commit)
        except UnsafeNameError:
            continue
        if r.kind in ("tag", "branch"):
            out.append(r)
    return out


def resolve(refs: list[Ref], *, version: int | str | None = None, revision: str | None = None) -> Resolution:
    """Pick the commit that `version` or `revision` names among `refs` (unsafe refs ignored)."""
    refs = safe_refs(refs)
    if version is not None and revision is not None:
        raise VersionSpecError("give either version= or revision=, not both")
    if revision is not None:
        return _resolve_revision(refs, revision)
    if version is None:
        raise VersionSpecError("no version given: pass version= (an int major, or a spec) or revision=")
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise VersionSpecError(f"version must be an int or a string, not {type(version).__name__}")
    if isinstance(version, int):
        return _resolve_major(refs, version)
    return _resolve_spec(refs, version)


#: The largest major version asked for by number (a branch v<N>); a larger int is refused before it is printed.
MAX_MAJOR = 10**6


def _resolve_major(refs: list[Ref], major: int) -> Resolution:
    if major < 0:
        raise VersionSpecError("major version must be >= 0, got a negative number")
    if major > MAX_MAJOR:
        raise VersionSpecError(f"major version must be at most {MAX_MAJOR}, got a larger number")
    branch = next((r for r in refs if r.kind == "branch" and r.name == f"v{major}"), None)
    if branch is None:
        majors = sorted({r.name for r in refs if r.kind == "branch" and _BRANCH.match(r.name)})
        raise VersionSpecError(
            f"no branch v{major} (major versions available: {', '.join(majors) or 'none'})"
        )
    found = _version_at(refs, branch.commit)
    return Resolution(branch.commit, branch.name, found, f"version={major} -> branch {branch.name}")


def major_hint(spec: str) -> str:
    """For a spec written like a major branch ("v1"): the hint that a major version is the bare int."""
    match = re.fullmatch(r"\s*[vV](\d+)\s*", spec)
    if not match:
        return ""
    major = int(match.group(1))
    return (f"; {spec.strip()!r} reads as the exact release {major}.0.0: for the major branch v{major} pass the "
            f"int {major} (--version {major}, version={major}), or --revision v{major} for the branch itself")


def _unconstrained(specifier: SpecifierSet) -> bool:
    """A spec every release meets (">=0"): "the newest", whatever the repo's versions are called."""
    return all(Version(v) in specifier for v in ("0", "0.0.1", "1", "99999"))


def _major_branches(refs: list[Ref]) -> list[Ref]:
    return sorted((r for r in refs if r.kind == "branch" and _BRANCH.match(r.name)), key=lambda r: int(r.name[1:]))


def _resolve_spec(refs: list[Ref], spec: str) -> Resolution:
    specifier = parse_spec(spec)
    tagged = [(v, r) for r in refs if r.kind == "tag" and (v := tag_version(r.name)) is not None]
    if not tagged:  # a repo without release tags (kernel-builder's: `v<N>` branches only)
        majors = _major_branches(refs)
        if majors and _unconstrained(specifier):
            newest = majors[-1]
            return Resolution(newest.commit, newest.name, None,
                              f"version={spec!r}, no release tags -> newest major branch {newest.name}")
        branches = ", ".join(sorted(r.name for r in refs if r.kind == "branch")) or "none"
        hint = (f"pass an int major (version={int(majors[-1].name[1:])}) or revision=" if majors
                else "pass revision=")
        raise VersionSpecError(f"version {spec!r} is a PEP 440 spec over release tags, and this repo has none "
                               f"(branches: {branches}); {hint}")
    matching = [(v, r) for v, r in tagged if v in specifier]
    if not matching:
        have = ", ".join(str(v) for v, _ in sorted(tagged, key=lambda p: p[0])) or "none"
        raise VersionSpecError(f"no release matches version {spec!r} (releases: {have}){major_hint(spec)}")
    best, ref = max(matching, key=lambda p: p[0])
    return Resolution(ref.commit, ref.name, str(best), f"version={spec!r} -> highest matching tag {ref.name}")


def _resolve_revision(refs: list[Ref], revision: str) -> Resolution:
    if not isinstance(revision, str) or not revision.strip():
        raise VersionSpecError(f"revision must be a branch, tag or commit id, got {revision!r}")
    if _HEX40.match(revision):  # a full commit id is that commit: no ref can shadow it
        commit = revision.lower()
        at = "commit" if any(r.commit == commit for r in refs) else "commit (at no ref)"
        return Resolution(commit, None, _version_at(refs, commit), f"revision={revision} -> {at}")
    try:
        check_ref_name(revision, "revision")
    except UnsafeNameError as exc:
        raise VersionSpecError(str(exc)) from None
    for kind in ("tag", "branch"):
        ref = next((r for r in refs if r.kind == kind and r.name == revision), None)
        if ref is not None:
            return Resolution(ref.commit, ref.name, _version_at(refs, ref.commit), f"revision={revision} -> {kind}")
    prefix = revision.lower()
    commits = {r.commit for r in refs if r.commit.startswith(prefix)} if _HEX.match(revision) else set()
    if len(commits) == 1:
        commit = commits.pop()
        return Resolution(commit, None, _version_at(refs, commit), f"revision={revision} -> commit")
    if len(commits) > 1:
        raise VersionSpecError(f"revision {revision!r} is an ambiguous commit prefix")
    raise VersionSpecError(f"no ref or commit {revision!r} (refs: {_available(refs)})")
