"""Real command-line clients against `kernel-hub serve`: HF `kernels variants --all-versions` (PyPI kernels 0.19.1;
it replaces the deprecated `kernels versions`), which reads each version's build variants by its full ref name, and
huggingface_hub's `hf repos delete-files`.

Each runs as a subprocess with HF_ENDPOINT on the server and every proxy variable on a local recorder:
a request meant for any other host would reach the recorder (and fail there), never the network.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("kernels")
hf = pytest.importorskip("huggingface_hub")

from huggingface_hub import HfApi  # noqa: E402

from tests.hub_server import hf_kernels_toy, hub_env  # noqa: E402

TOKEN = "clients-token"
REPO = "acme/relu"


def seed_server(srv, root: Path) -> None:
    """The `server` fixture's store (tests/conftest.py): REPO with one release, branch v1 and tag v1.0.0."""
    api = HfApi(endpoint=srv.url, token=TOKEN)
    api.create_repo(REPO, repo_type="kernel")
    first = api.upload_folder(repo_id=REPO, repo_type="kernel", folder_path=hf_kernels_toy(root / "v1")).oid
    api.create_branch(REPO, branch="v1", revision=first, repo_type="kernel")
    api.create_tag(REPO, tag="v1.0.0", revision=first, repo_type="kernel")


@dataclass
class Recorder:
    url: str
    seen: list[bytes] = field(default_factory=list)


@pytest.fixture
def proxy_recorder() -> Iterator[Recorder]:
    """A loopback listener standing in for every proxy: it records what would have left the machine."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(4096))
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    recorder = Recorder(f"http://127.0.0.1:{listener.getsockname()[1]}")
    seen = recorder.seen
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _env(server, cache: Path, recorder: Recorder, **extra: str) -> dict[str, str]:
    env = hub_env(server, cache, **extra)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[name] = recorder.url
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1"  # the server is reached directly; nothing else is
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"  # kernels 0.17.2 could not download with it (DESIGN.md); 0.19.1 can
    return env


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def test_hf_kernels_variants_lists_versions_and_variants(server, tmp_path: Path, proxy_recorder) -> None:
    env = _env(server, tmp_path / "cache", proxy_recorder)
    server.reset()
    proc = subprocess.run([_bin("kernels"), "variants", REPO, "--all-versions", "--json"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deprecated" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["repo_id"] == REPO
    assert [(r["version"], r["revision"]) for r in doc["revisions"]] == [(1, "refs/heads/v1")]
    [cpu] = [v for v in doc["revisions"][0]["variants"] if v["variant"] == "torch-cpu"]
    assert cpu["compatible"] and cpu["preferred"] and cpu["reason"] is None, cpu
    paths = [(p, status) for _, p, status in server.requests()]
    # kernels asks for the variants of v1 by its full ref name (refs%2Fheads%2Fv1)
    assert (f"/api/kernels/{REPO}/tree/refs/heads/v1/build", 200) in paths
    assert proxy_recorder.seen == []  # nothing tried to leave the machine


def test_hf_repos_delete_files_deletes_a_folder(server, tmp_path: Path, proxy_recorder) -> None:
    api = HfApi(endpoint=server.url, token=TOKEN)
    repo = "acme/pruned"
    api.create_repo(repo, repo_type="kernel")
    api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=hf_kernels_toy(tmp_path / "src"))
    env = _env(server, tmp_path / "cache", proxy_recorder, HF_TOKEN=TOKEN)
    proc = subprocess.run([_bin("hf"), "repos", "delete-files", repo, "build/torch-cpu/relu/", "--repo-type", "kernel",
                           "--commit-message", "drop the package"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Files deleted" in proc.stdout
    assert sorted(api.list_repo_files(repo, repo_type="kernel")) == [".gitattributes", "build/torch-cpu/metadata.json"]
    assert api.list_repo_commits(repo, repo_type="kernel")[0].title == "drop the package"
    assert proxy_recorder.seen == []


def test_the_recorder_catches_a_request_for_any_other_host(server, tmp_path: Path, proxy_recorder) -> None:
    """The control for the two tests above: huggingface_hub's HTTP session does go through the recorder."""
    script = ("from huggingface_hub.utils import get_session\n"
              "try:\n    get_session().get('https://huggingface.co/api/whoami-v2', timeout=10)\n"
              "except Exception as exc:\n    print(type(exc).__name__)\n")
    env = _env(server, tmp_path / "cache", proxy_recorder)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(b"huggingface.co" in request for request in proxy_recorder.seen), proxy_recorder.seen
