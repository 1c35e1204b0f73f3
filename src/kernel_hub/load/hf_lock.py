"""HF `kernels`' project files, read and written as it does (0.19.1), beside kernel-hub's own lock.

- pyproject.toml `[tool.kernels.dependencies]`: `"org/name" = <major version>` per kernel.
- kernels.lock: a JSON list of `{"dependency": {"repo-id": ..., "version": N | "revision": ...},
  "lock": {"commit": <40 hex>}}`. It pins commits only (no digests, no variant): loading from it resolves that
  commit like `get_kernel(revision=commit)`, trust check and digest checks included.

`lock_project(dir)` locks what `[tool.kernels]` names and writes both kernels.lock (HF's, so `kernels` and
transformers read it) and kernel-hub.lock (ours: the variant and every file's sha256). Everything read is
untrusted: every repo id and commit is checked before use.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KernelHubError, MetadataError, UnsafeNameError
from ..files import check_writable, read_capped_text, write_atomic
from ..names import check_commit, check_ref_name, check_repo_id
from .trust import TrustSetting, trust_policy

HF_LOCK_FILE = "kernels.lock"
MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class HfLockEntry:
    repo_id: str
    version: int | None     # the major version asked for, or None with `revision`
    revision: str | None
    commit: str

    def to_json(self) -> dict[str, Any]:
        dependency: dict[str, Any] = {"repo-id": self.repo_id}
        if self.version is not None:
            dependency["version"] = self.version
        else:
            dependency["revision"] = self.revision
        return {"dependency": dependency, "lock": {"commit": self.commit}}


#: The largest major version a pyproject or kernels.lock may name (HF kernels' branches are v0, v1, ...).
MAX_MAJOR = 10**6


def _read_text(path: Path, what: str) -> str:
    """A project file's text: a regular file of at most MAX_BYTES (files.read_capped_text: a FIFO, a device or a
    folder is refused before any read)."""
    try:
        return read_capped_text(path, MAX_BYTES, what)
    except FileNotFoundError:
        raise KernelHubError(f"no {what} at {path}") from None


def _major(value: object) -> bool:
    """True for a major version HF kernels accepts: an integer in 0..MAX_MAJOR (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MAJOR


def _table(data: object, key: str) -> object:
    return data.get(key) if isinstance(data, dict) else None


def tool_kernels(pyproject: Path) -> dict[str, int]:
    """`[tool.kernels.dependencies]` of a pyproject.toml: repo id -> major version (HF kernels' meaning)."""
    try:
        data = tomllib.loads(_read_text(pyproject, "pyproject.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise MetadataError(f"{pyproject}: not valid TOML ({exc})") from None
    except RecursionError:
        raise MetadataError(f"{pyproject}: not valid TOML (nested too deep)") from None
    except ValueError as exc:  # an integer too long to read, a date out of range
        raise MetadataError(f"{pyproject}: not valid TOML ({str(exc)[:120]})") from None
    deps = _table(_table(_table(data, "tool"), "kernels"), "dependencies")
    if not isinstance(deps, dict) or not deps:
        raise MetadataError(f"{pyproject}: no [tool.kernels.dependencies] table "
                            '(e.g. "kernel-hub/ragged-dot-tpu" = 1)')
    out = {}
    for repo_id, version in deps.items():
        try:
            check_repo_id(repo_id, "[tool.kernels.dependencies] repo id")
        except UnsafeNameError as exc:
            raise MetadataError(f"{pyproject}: {exc}") from None
        if not _major(version):
            raise MetadataError(f"{pyproject}: [tool.kernels.dependencies] {repo_id} = {_shown(version)}: a major "
                                f"version (an integer in 0..{MAX_MAJOR}) is expected")
        out[repo_id] = version
    return out


def _shown(value: object) -> str:
    """A value for an error message, short whatever it is (an integer of thousands of digits included)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MAJOR:
        return "an integer of more than 7 digits" if value > 0 else "a negative integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_hf_lock(path: Path) -> bool:
    """True when `path` holds HF kernels' lock format (a JSON list) rather than kernel-hub's (an object)."""
    try:
        return _read_text(Path(path), "a lock file").lstrip().startswith("[")
    except KernelHubError:
        return False


def read_hf_lock(path: Path) -> list[HfLockEntry]:
    """Every entry of a kernels.lock, checked as HF kernels would: one entry per dependency (repo and version or
    revision), no key twice in an object, a major version in 0..MAX_MAJOR."""
    from .lock import lock_json

    path = Path(path)
    data = lock_json(_read_text(path, "kernels.lock"), path)
    if not isinstance(data, list):
        raise MetadataError(f"{path}: HF kernels' lock file is a JSON list")
    out: list[HfLockEntry] = []
    for i, raw in enumerate(data):
        where = f"{path}: entry {i}"
        dep = raw.get("dependency") if isinstance(raw, dict) else None
        lock = raw.get("lock") if isinstance(raw, dict) else None
        if not isinstance(dep, dict) or not isinstance(lock, dict):
            raise MetadataError(f"{where}: expected {{'dependency': ..., 'lock': ...}}")
        try:
            repo_id = check_repo_id(dep.get("repo-id"), f"{where} repo-id")
            commit = check_commit(lock.get("commit"), f"{where} commit")
            version, revision = dep.get("version"), dep.get("revision")
            if revision is not None:
                check_ref_name(revision, f"{where} revision")
        except UnsafeNameError as exc:
            raise MetadataError(str(exc)) from None
        if (version is None) == (revision is None) or (version is not None and not _major(version)):
            raise MetadataError(f"{where}: a dependency has an integer 'version' (0..{MAX_MAJOR}) or a 'revision'"
                                + (f", not version {_shown(version)}" if version is not None else ""))
        if any((e.repo_id, e.version, e.revision) == (repo_id, version, revision) for e in out):
            raise MetadataError(f"{where}: {repo_id} {'version' if revision is None else 'revision'} "
                                f"{version if revision is None else revision} is locked twice; one entry each")
        out.append(HfLockEntry(repo_id, version, revision, commit))
    return out


def find(entries: list[HfLockEntry], repo_id: str, path: Path) -> HfLockEntry:
    for entry in entries:
        if entry.repo_id == repo_id:
            return entry
    locked = ", ".join(sorted(e.repo_id for e in entries)) or "nothing"
    raise KernelHubError(f"{repo_id} is not in {path} (it locks: {locked}); lock it with "
                         "kernel_hub.load.hf_lock.lock_project(project_dir) or `kernels lock`")


def write_hf_lock(entries: list[HfLockEntry], path: Path) -> None:
    """kernels.lock as HF kernels writes it (a JSON list, two-space indent), replaced in one rename (a link at
    `path` is refused, never written through)."""
    write_atomic(Path(path), (json.dumps([e.to_json() for e in entries], indent=2) + "\n").encode(), "kernels.lock")


def lock_project(project_dir: str | Path, *, framework: str = "jax", backend: str | None = None,
                 trust_remote_code: TrustSetting = False) -> list[HfLockEntry]:
    """Lock every kernel `[tool.kernels.dependencies]` names (as get_kernel resolves it, trust check included) and
    write DIR/kernels.lock (HF's format) and DIR/kernel-hub.lock (kernel-hub's, with every file's sha256).

    Args:
        project_dir: the folder holding pyproject.toml.
        framework, backend, trust_remote_code: as for get_kernel.
    Returns:
        The kernels.lock entries written.
    """
    from .lock import LOCK_FILE, LockFile, lock_one

    project = Path(project_dir)
    trust = trust_policy(trust_remote_code)
    wanted = tool_kernels(project / "pyproject.toml")
    ours = [lock_one(repo, version=major, framework=framework, backend=backend, trust=trust)
            for repo, major in wanted.items()]
    entries = [HfLockEntry(k.repo_id, wanted[k.repo_id], None, k.commit) for k in ours]
    check_writable(project / HF_LOCK_FILE, "kernels.lock")
    check_writable(project / LOCK_FILE, "the lock file")
    write_hf_lock(entries, project / HF_LOCK_FILE)
    LockFile(ours).write(project / LOCK_FILE)
    return entries
