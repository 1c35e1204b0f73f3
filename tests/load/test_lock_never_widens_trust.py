"""A lock file never widens trust: the trust check judges the endpoint the code actually comes from (HF_ENDPOINT, or
the source given), never the `location` the lock records. A lock claiming https://huggingface.co for a repo served
by a mirror is refused on every locked path (get_locked_kernel, get_kernel(lockfile=), `validate --lockfile`), and
nothing of the repo is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

import kernel_hub as kh
from kernel_hub.errors import TrustError
from kernel_hub.load.lock import get_locked_kernel, lock
from kernel_hub.load.trust import TRUST_ENV
from kernel_hub.publish.release import publish
from kernel_hub.sources.hub.source import HubSource
from tests.client_env import point_at
from tests.hub_server import cli_command, hub_env
from tests.toy_folder import copy_toy

TOKEN = "test-token"
REPO = "kernel-hub/toy-mirrored"  # a default organisation: trusted at https://huggingface.co only
MARK = "KH_LOCK_TRUST_IMPORTED"
HF = "https://huggingface.co"


def seed_server(srv, root: Path) -> None:
    toy = copy_toy(root / "toy", ops_extra=f"import os\nos.environ['{MARK}'] = '1'\n")
    publish(toy, repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True, skip_tpu_compile=True,
            log=lambda _: None)


@pytest.fixture
def claimed_lock(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock made at the mirror with explicit trust, then edited to claim it came from huggingface.co."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.delenv(MARK, raising=False)
    path = tmp_path / "kernel-hub.lock"
    lock([REPO], version=1, backend="cpu", path=path, trust_remote_code=["kernel-hub"],
         source=HubSource(endpoint=server.url, cache_dir=tmp_path / "locking"))
    data = json.loads(path.read_text())
    assert data["kernels"][0]["location"] == server.url
    data["kernels"][0]["location"] = HF
    path.write_text(json.dumps(data))
    return path


def test_get_locked_kernel_judges_the_endpoint_used_not_the_lock(server, claimed_lock: Path, tmp_path: Path) -> None:
    import os

    with pytest.raises(TrustError, match=f"made against {HF}, but this load fetches from {server.url}"):
        get_locked_kernel(REPO, lockfile=claimed_lock, source=HubSource(endpoint=server.url, cache_dir=tmp_path / "c"))
    assert MARK not in os.environ  # nothing of the repo ran


def test_get_kernel_with_a_lockfile_judges_hf_endpoint(server, claimed_lock: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    point_at(monkeypatch, server.url, tmp_path / "hub-cache")  # HF_ENDPOINT is the mirror
    with pytest.raises(TrustError, match="lock file was made against"):
        kh.get_kernel(REPO, lockfile=claimed_lock, backend="cpu")
    assert MARK not in os.environ


def test_a_matching_lock_at_a_mirror_still_needs_trust(server, claimed_lock: Path, tmp_path: Path) -> None:
    """The lock's own endpoint agrees with the one used: the default organisation is still untrusted there."""
    data = json.loads(claimed_lock.read_text())
    data["kernels"][0]["location"] = server.url + "/"
    claimed_lock.write_text(json.dumps(data))
    src = HubSource(endpoint=server.url, cache_dir=tmp_path / "c")
    with pytest.raises(TrustError, match="trusted by default only at https://huggingface.co"):
        get_locked_kernel(REPO, lockfile=claimed_lock, source=src)
    module = get_locked_kernel(REPO, lockfile=claimed_lock, source=src, trust_remote_code=["kernel-hub"])
    assert module.__kernel_hub_source__ == f"hub {server.url}"


def test_validate_lockfile_cli_refuses_in_one_line(server, claimed_lock: Path, tmp_path: Path) -> None:
    env = hub_env(server, tmp_path / "cli-cache")
    proc = subprocess.run([*cli_command(), "validate", REPO, "--lockfile", str(claimed_lock), "--backend", "cpu"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "lock file was made against" in err[0] and "Traceback" not in proc.stderr
    script = (f"import os, kernel_hub as kh\ntry:\n    kh.get_kernel({REPO!r}, lockfile={str(claimed_lock)!r})\n"
              f"except kh.KernelHubError as e:\n    print(type(e).__name__)\nprint(os.environ.get({MARK!r}))\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["TrustError", "None"], proc.stderr
