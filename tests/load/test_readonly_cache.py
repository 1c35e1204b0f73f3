"""A read-only warm cache (a pre-baked pod image) loads online: the cache's bookkeeping (refs.json, listings) is
best-effort, and a cached, verified build needs no write at all."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

import kernel_hub as kh
from kernel_hub.publish.release import publish
from tests.client_env import point_at
from tests.hub_server import running_server
from tests.toy_folder import copy_toy

TOKEN = "ro-token"
REPO = "acme/ro-toy"


def _read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Make `root` refuse writes: chmod where that binds (not root), else every Python-level write under it raises
    EROFS (root ignores permission bits, and no read-only mount is available in a test)."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
        return
    root = root.resolve()

    def inside(path) -> bool:
        try:
            return root in Path(os.fsdecode(path)).resolve().parents or Path(os.fsdecode(path)).resolve() == root
        except (TypeError, ValueError):
            return False

    def refuse(path) -> OSError:
        return OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

    real_open, real_os_open = open, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, str | bytes | os.PathLike) and any(c in mode for c in "wax+") and inside(file):
            raise refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & writes and inside(path):
            raise refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def guarded(real):
        def call(src, *args, **kwargs):
            if inside(src) or any(inside(a) for a in args if isinstance(a, str | os.PathLike)):
                raise refuse(src)
            return real(src, *args, **kwargs)
        return call

    monkeypatch.setattr("builtins.open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("replace", "rename", "mkdir", "makedirs", "unlink", "remove", "rmdir", "utime", "chmod"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))
    monkeypatch.setattr(shutil, "rmtree", guarded(shutil.rmtree))


def test_a_read_only_warm_cache_loads_online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    with running_server(tmp_path / "store", token=TOKEN) as server:
        publish(copy_toy(tmp_path / "k", "1.0.0"), repo_id=REPO, endpoint=server.url, token=TOKEN, skip_validation=True,
                skip_tpu_compile=True, log=lambda _: None)
        point_at(monkeypatch, server.url, cache)
        monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "kh-cache"))
        warm = kh.get_kernel(REPO, version=1, backend="cpu", trust_remote_code=True)
        assert float(warm.scale(2.0, 3.0)) == 6.0
        try:
            with monkeypatch.context() as patch:
                _read_only(patch, cache)
                again = kh.get_kernel(REPO, version=1, backend="cpu", trust_remote_code=True)  # online, read-only
                assert float(again.scale(2.0, 3.0)) == 6.0
                assert again.__kernel_hub__.commit == warm.__kernel_hub__.commit
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(cache)], check=False)
