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


def _read_text(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise MetadataError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not {what}")
        return path.read_text()
    except FileNotFoundError:
        raise KernelHubError(f"no {what} at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetadataError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def tool_kernels(pyproject: Path) -> dict[str, int]:
    """`[tool.kernels.dependencies]` of a pyproject.toml: repo id -> major version (HF kernels' meaning)."""
    try:
        data = tomllib.loads(_read_text(pyproject, "pyproject.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise MetadataError(f"{pyproject}: not valid TOML ({exc})") from None
    deps = data.get("tool", {}).get("kernels", {}).get("dependencies")
    if not isinstance(deps, dict) or not deps:
        raise MetadataError(f"{pyproject}: no [tool.kernels.dependencies] table "
                            '(e.g. "kernel-hub/ragged-dot-tpu" = 1)')
    out = {}
    for repo_id, version in deps.items():
        try:
            check_repo_id(repo_id, "[tool.kernels.dependencies] repo id")
        except UnsafeNameError as exc:
            raise MetadataError(f"{pyproject}: {exc}") from None
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise MetadataError(f"{pyproject}: [tool.kernels.dependencies] {repo_id} = {version!r}: a major version "
                                "(an integer) is expected")
        out[repo_id] = version
    return out


def is_hf_lock(path: Path) -> bool:
    """True when `path` holds HF kernels' lock format (a JSON list) rather than kernel-hub's (an object)."""
    try:
        return _read_text(Path(path), "a lock file").lstrip().startswith("[")
    except KernelHubError:
        return False


def read_hf_lock(path: Path) -> list[HfLockEntry]:
    """Every entry of a kernels.lock, checked."""
    path = Path(path)
    try:
        data = json.loads(_read_text(path, "kernels.lock"))
    except ValueError as exc:
        raise MetadataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise MetadataError(f"{path}: HF kernels' lock file is a JSON list")
    out = []
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
        if (version is None) == (revision is None) or (version is not None and (
                isinstance(version, bool) or not isinstance(version, int))):
            raise MetadataError(f"{where}: a dependency has an integer 'version' or a 'revision'")
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
    """kernels.lock as HF kernels writes it (a JSON list, two-space indent)."""
    Path(path).write_text(json.dumps([e.to_json() for e in entries], indent=2) + "\n")


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
    write_hf_lock(entries, project / HF_LOCK_FILE)
    LockFile(ours).write(project / LOCK_FILE)
    return entries
