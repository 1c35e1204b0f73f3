"""A server killed mid-write never breaks its store for good: lock files and temporary objects it left are cleared
at the next start (only its own store's, only those names), objects are written through unique temporary names,
a branch moves in one compare-and-swap, and no error shows the store's path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("dulwich")

from dulwich.objects import Blob
from huggingface_hub import CommitOperationAdd, HfApi
from starlette.testclient import TestClient

from kernel_hub.server import build_app
from kernel_hub.server.blobfiles import loose_object
from kernel_hub.server.errors import HubError
from kernel_hub.server.gitstore import GitStore
from tests.hub_server import running_server

TOKEN = "recovery-token"
CONTENT = b"the same bytes a killed server was writing\n"
REPO = "acme/recover"


def _git_dir(store: Path) -> Path:
    return store / "kernels" / f"{REPO}.git"


def _plant_killed_writer(store: Path) -> list[Path]:
    """What `kernel-hub serve` killed mid-commit leaves: dulwich's lock files for an object and for main."""
    git_dir = _git_dir(store)
    blob = Blob.from_string(CONTENT)
    obj_lock = loose_object(git_dir, blob.id.decode()).with_name(blob.id.decode()[2:] + ".lock")
    obj_lock.parent.mkdir(parents=True, exist_ok=True)
    obj_lock.write_bytes(b"half an object")
    ref_lock = git_dir / "refs" / "heads" / "main.lock"
    ref_lock.write_bytes(b"0" * 40 + b"\n")
    return [obj_lock, ref_lock]


def test_restart_clears_a_killed_commits_locks_and_commits_work(tmp_path: Path) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    outside = tmp_path / "outside.lock"  # a lock file outside the store: never touched
    outside.write_text("not ours")
    planted = _plant_killed_writer(store)
    with running_server(store, token=TOKEN) as server:
        api = HfApi(endpoint=server.url, token=TOKEN)
        info = api.create_commit(REPO, [CommitOperationAdd("a.txt", CONTENT)], commit_message="after restart",
                                 repo_type="kernel")
        assert api.list_repo_refs(REPO, repo_type="kernel").branches[0].target_commit == info.oid
    assert not any(p.exists() for p in planted)
    assert outside.read_text() == "not ours"
    fsck = subprocess.run(["git", "--git-dir", str(_git_dir(store)), "fsck", "--full"], capture_output=True,
                          text=True)
    assert fsck.returncode == 0 and "bad sha1" not in fsck.stderr + fsck.stdout, fsck.stderr


def test_recover_only_while_holding_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    planted = _plant_killed_writer(store)
    first = GitStore(store)
    assert first.recover() is not None
    _plant_killed_writer(store)
    # a second process on the same store (the first one still serving) clears nothing of the first one's
    code = ("import sys; from kernel_hub.server.gitstore import GitStore; "
            "print(GitStore(sys.argv[1]).recover() is None)")
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert out.stdout.strip() == "True", out.stderr
    assert all(p.exists() for p in planted)


def test_a_locked_ref_is_a_503_that_never_shows_the_store_path(tmp_path: Path) -> None:
    store = tmp_path / "store"
    repo = GitStore(store).create("kernel", REPO)
    (_git_dir(store) / "refs" / "heads" / "main.lock").write_bytes(b"")
    oid = repo.add_blob(CONTENT)  # an object write never waits for a lock file
    with pytest.raises(HubError) as err:
        repo.commit_changes("main", "m", "", [("a.txt", oid)], [], [], None)
    assert err.value.status == 503 and str(store) not in err.value.message and "main" in err.value.message


def test_an_internal_error_answers_without_the_exception_text(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    from kernel_hub.server import gitstore

    def broken(self, *args, **kwargs):
        raise OSError(f"[Errno 5] Input/output error: '{store}/secret/place'")

    monkeypatch.setattr(gitstore.GitRepo, "refs", broken)
    client = TestClient(build_app(store, token=TOKEN), raise_server_exceptions=False)
    answer = client.get(f"/api/kernels/{REPO}/refs")
    assert answer.status_code == 500
    assert str(store) not in answer.text and str(store) not in answer.headers.get("x-error-message", "")
    assert "OSError" in answer.json()["error"]


def test_branch_moves_in_one_compare_and_swap(tmp_path: Path) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    client = TestClient(build_app(store, token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    refs = client.get(f"/api/kernels/{REPO}/refs").json()
    first = refs["branches"][0]["targetCommit"]
    repo = GitStore(store).get("kernel", REPO)
    oid = repo.add_blob(CONTENT)
    second, _ = repo.commit_changes("main", "two", "", [("a.txt", oid)], [], [], None)

    def move(expected: str | None, target: str) -> int:
        body = {"startingPoint": target, "move": True, "expectedCommit": expected}
        return client.post(f"/api/kernels/{REPO}/branch/v1", content=json.dumps(body), headers=auth).status_code

    assert move(first, first) == 412          # v1 does not exist: expected must be null
    assert move(None, first) == 200
    assert move(None, second) == 412          # it exists now: a stale reader is refused
    seen: list[str] = []
    stop = threading.Event()

    reader = TestClient(build_app(store, token=TOKEN))

    def watch() -> None:  # v1 never disappears while it moves
        while not stop.is_set():
            names = [b["name"] for b in reader.get(f"/api/kernels/{REPO}/refs").json()["branches"]]
            seen.append("v1" if "v1" in names else "missing")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(20):
            assert move(first, second) == 200
            assert move(second, first) == 200
    finally:
        stop.set()
        watcher.join()
    assert seen and "missing" not in seen
