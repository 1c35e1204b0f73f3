"""Lock files: exactly the locked build, no requests when cached (even with the server stopped), every digest
checked before import, tampering refetched online and refused in one line offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from kernel_hub.errors import IntegrityError, KernelNotFoundError
from kernel_hub.load.lock import get_locked_kernel, lock, read_lock
from kernel_hub.publish.release import publish
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import cli_command, hub_env, hub_requests
from tests.toy_folder import copy_toy

TOKEN = "test-token"
REPO = "acme/locked"
TRUST = ["acme"]  # the test org: trusted by name, as a user would


def seed_server(srv, root: Path) -> None:
    """The `fresh_server` fixture's store (tests/conftest.py; one server per test: some tests stop it): the toy
    kernel, published."""
    publish(copy_toy(root / "toy"), repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True,
            skip_tpu_compile=True, log=lambda _: None)


def test_lock_records_and_loads_exactly_that_with_no_requests(fresh_server, tmp_path: Path) -> None:
    cache, lockfile = tmp_path / "cache", tmp_path / "kernel-hub.lock"
    src = HubSource(endpoint=fresh_server.url, cache_dir=cache)
    locked = lock([REPO], version=1, framework="jax", backend="cpu", path=lockfile, source=src, trust_remote_code=TRUST)
    entry = read_lock(lockfile).find(REPO)
    assert entry == locked.kernels[0]
    assert entry.version == "1.2.0" and entry.spec == {"version": 1} and entry.variant["name"] == "jax-cpu"
    assert len(entry.commit) == 40 and {"__init__.py", "ops.py"} <= set(entry.files)
    assert all(len(h) == 64 for h in entry.files.values())

    fresh_server.reset()
    module = get_locked_kernel(REPO, lockfile=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
                               trust_remote_code=TRUST)
    assert module.scale(np.ones(2)).tolist() == [2.0, 2.0]
    assert module.__kernel_hub__.commit == entry.commit
    assert module.__kernel_hub_source__ == f"hub {fresh_server.url}"  # as get_kernel says which source served it
    assert hub_requests(fresh_server) == []

    fresh_server.stop()  # a locked, cached load needs no server at all
    offline = HubSource(endpoint=fresh_server.url, cache_dir=cache)
    module = get_locked_kernel(REPO, lockfile=lockfile, source=offline, trust_remote_code=TRUST)
    assert module.scale(np.ones(1)).tolist() == [2.0]


def test_fresh_locked_load_is_one_download(fresh_server, tmp_path: Path) -> None:
    lockfile = tmp_path / "k.lock"
    lock([REPO], version=">=1.0,<2", backend="cpu", path=lockfile,
         source=HubSource(endpoint=fresh_server.url, cache_dir=tmp_path / "one"), trust_remote_code=TRUST)
    fresh_server.reset()
    module = get_locked_kernel(REPO, lockfile=lockfile, trust_remote_code=TRUST,
                               source=HubSource(endpoint=fresh_server.url, cache_dir=tmp_path / "two"))
    assert module.scale(np.ones(1)).tolist() == [2.0]
    assert [m for m, _, _ in hub_requests(fresh_server)] == ["HEAD", "GET"]  # no refs, no listing


def _cached_file(cache: Path, name: str) -> Path:
    return next(cache.glob(f"kernels--acme--locked/kernel-hub/builds/*/jax-cpu/toy_scale/{name}"))


def test_tampered_file_is_refetched_online(fresh_server, tmp_path: Path) -> None:
    cache, lockfile = tmp_path / "cache", tmp_path / "k.lock"
    lock([REPO], version=1, backend="cpu", path=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
         trust_remote_code=TRUST)
    ops = _cached_file(cache, "ops.py")
    good = ops.read_text()
    ops.write_text(good + "\nimport os  # injected\n")
    # The Hub cache's bundle is damaged as well: only a fresh download repairs it.
    blob = next((cache / "kernels--acme--locked" / "blobs").iterdir())
    blob.write_bytes(blob.read_bytes()[:-10] + b"x" * 10)
    fresh_server.reset()
    module = get_locked_kernel(REPO, lockfile=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
                               trust_remote_code=TRUST)
    assert module.scale(np.ones(1)).tolist() == [2.0]
    assert _cached_file(cache, "ops.py").read_text() == good
    assert [m for m, _, _ in hub_requests(fresh_server)] == ["HEAD", "GET"]


def test_tampered_file_offline_is_one_line_and_nothing_imports(fresh_server, tmp_path: Path) -> None:
    cache, lockfile = tmp_path / "cache", tmp_path / "k.lock"
    lock([REPO], version=1, backend="cpu", path=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
         trust_remote_code=TRUST)
    ops = _cached_file(cache, "ops.py")
    ops.write_text(ops.read_text() + "\nraise SystemExit('tampered code ran')\n")
    shutil.rmtree(cache / "kernels--acme--locked" / "blobs")  # no clean copy left in the cache
    with pytest.raises(IntegrityError) as exc:
        get_locked_kernel(REPO, lockfile=lockfile, trust_remote_code=TRUST,
                          source=HubSource(endpoint=fresh_server.url, cache_dir=cache, offline=True))
    assert "\n" not in str(exc.value) and "ops.py" in str(exc.value)


def test_edited_lock_file_is_refused(fresh_server, tmp_path: Path) -> None:
    cache, lockfile = tmp_path / "cache", tmp_path / "k.lock"
    lock([REPO], version=1, backend="cpu", path=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
         trust_remote_code=TRUST)
    data = json.loads(lockfile.read_text())
    data["kernels"][0]["files"]["ops.py"] = "0" * 64
    lockfile.write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="ops.py"):
        get_locked_kernel(REPO, lockfile=lockfile, source=HubSource(endpoint=fresh_server.url, cache_dir=cache),
                               trust_remote_code=TRUST)
    with pytest.raises(KernelNotFoundError, match="not in the lock file"):
        get_locked_kernel("acme/other", lockfile=lockfile)


def test_lock_cli_and_offline_locked_load(fresh_server, tmp_path: Path) -> None:
    cache, lockfile = tmp_path / "cache", tmp_path / "kernel-hub.lock"
    env = hub_env(fresh_server, cache, KERNEL_HUB_TRUSTED_ORGS="acme")
    proc = subprocess.run([*cli_command(), "lock", REPO, "--version", "1", "--backend", "cpu", "-o", str(lockfile)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"locked {REPO} 1.2.0" in proc.stdout
    fresh_server.stop()
    script = ("import kernel_hub as kh, numpy as np\n"
              f"m = kh.get_locked_kernel({REPO!r}, lockfile={str(lockfile)!r})\n"
              "print(m.scale(np.ones(1)).tolist())\n")
    proc = subprocess.run([sys.executable, "-c", script], env={**env, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2.0]"
