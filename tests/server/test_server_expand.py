"""`expand` (each entry's last commit) costs one walk of history, bounded; the server stops soon after SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import stat
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("dulwich")

from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from kernel_hub.server import gitstore
from kernel_hub.server.errors import HubError
from kernel_hub.server.gitstore import GitStore
from tests.hub_server import running_server

REPO = "acme/big"
FOLDERS, PER_FOLDER, COMMITS = 20, 100, 302  # 2000 files, 302 commits (a large real-world repo's size)


def _commit(tree: bytes, parents: list[bytes], message: str, when: int) -> Commit:
    commit = Commit()
    commit.tree, commit.parents = tree, parents
    commit.author = commit.committer = b"t <t@localhost>"
    commit.author_time = commit.commit_time = when
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = message.encode()
    return commit


def _build(store_root: Path) -> tuple[GitStore, list[bytes]]:
    """A repo of 2000 files whose history of 302 commits each changes one file (commit i: file i-1), built
    straight in the object store. Returns the store and the commit ids, oldest first."""
    store = GitStore(store_root)
    repo = store.create("kernel", REPO)
    git = Repo(str(repo.path), bare=True)
    objects = git.object_store
    folders: list[dict[bytes, bytes]] = []
    for f in range(FOLDERS):
        files = {}
        for i in range(PER_FOLDER):
            blob = Blob.from_string(f"{f}/{i} v0\n".encode())
            objects.add_object(blob)
            files[f"f{i:03d}.txt".encode()] = blob.id
        folders.append(files)

    def root_tree() -> bytes:
        root = Tree()
        for f, files in enumerate(folders):
            sub = Tree()
            for name, oid in files.items():
                sub.add(name, 0o100644, oid)
            objects.add_object(sub)
            root.add(f"d{f:02d}".encode(), stat.S_IFDIR, sub.id)
        objects.add_object(root)
        return root.id

    ids: list[bytes] = []
    first = _commit(root_tree(), [], "all files", 1_700_000_000)
    objects.add_object(first)
    ids.append(first.id)
    for n in range(1, COMMITS):
        f, i = divmod(n - 1, PER_FOLDER)
        blob = Blob.from_string(f"{f}/{i} v{n}\n".encode())
        objects.add_object(blob)
        folders[f][f"f{i:03d}.txt".encode()] = blob.id
        commit = _commit(root_tree(), [ids[-1]], f"change d{f:02d}/f{i:03d}", 1_700_000_000 + n)
        objects.add_object(commit)
        ids.append(commit.id)
    git.refs[b"refs/heads/main"] = ids[-1]
    git.close()
    return store, ids


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[GitStore, list[bytes]]:
    return _build(tmp_path_factory.mktemp("store"))


def _oracle(store: GitStore, commit: bytes, path: str) -> str | None:
    """The newest first-parent commit where `path`'s (mode, id) differs from its parent's: path by path."""
    git = Repo(str(store.get("kernel", REPO).path), bare=True)
    try:
        def at(c: Commit) -> tuple[int, bytes] | None:
            try:
                return git.object_store[c.tree].lookup_path(git.object_store.__getitem__, path.encode())
            except KeyError:
                return None
        current = git[commit]
        while True:
            parent = git[current.parents[0]] if current.parents else None
            if parent is None or at(parent) != at(current):
                return current.id.decode()
            current = parent
    finally:
        git.close()


def test_last_commits_walks_each_commit_once_and_matches_a_path_by_path_oracle(big, monkeypatch) -> None:
    store, ids = big
    repo = store.get("kernel", REPO)
    diffs: Counter[tuple[bytes | None, bytes]] = Counter()
    real = gitstore.tree_changes

    def counting(object_store, old, new, *args, **kwargs):
        diffs[(old, new)] += 1
        return real(object_store, old, new, *args, **kwargs)

    monkeypatch.setattr(gitstore, "tree_changes", counting)
    head = ids[-1].decode()
    entries = repo.list_tree(head, recursive=True)
    assert sum(e.kind == "file" for e in entries) == FOLDERS * PER_FOLDER
    started = time.perf_counter()
    last = repo.last_commits(head, [e.path for e in entries])
    print(f"last_commits over {len(entries)} paths, {COMMITS} commits: {time.perf_counter() - started:.3f} s")
    # One diff per commit of the history (every path needs the walk to reach the root), none twice.
    assert max(diffs.values()) == 1
    assert sum(diffs.values()) == COMMITS
    assert set(last) == {e.path for e in entries}
    for path in ["d00/f000.txt", "d02/f099.txt", "d03/f001.txt", "d19/f099.txt", "d00", "d03", "d19"]:
        assert last[path].oid == _oracle(store, ids[-1], path), path
    assert last["d00/f005.txt"].oid == ids[6].decode()
    assert last["d19/f099.txt"].oid == ids[0].decode()
    assert last["d03"].oid == ids[-1].decode()


def test_last_commits_stops_when_every_path_is_found(big, monkeypatch) -> None:
    store, ids = big
    calls = []
    real = gitstore.tree_changes
    monkeypatch.setattr(gitstore, "tree_changes", lambda s, a, b, *r, **k: calls.append(b) or real(s, a, b, *r, **k))
    last = store.get("kernel", REPO).last_commits(ids[-1].decode(), ["d03/f000.txt"])  # changed 302 - 301 = 1 back
    assert last["d03/f000.txt"].oid == ids[301].decode()
    assert len(calls) == 1


def test_last_commits_is_bounded_and_cancellable(big) -> None:
    store, ids = big
    repo = store.get("kernel", REPO)
    head = ids[-1].decode()
    bounded = repo.last_commits(head, ["d03", "d19/f099.txt"], budget=10)
    assert bounded["d03"].oid == head and "d19/f099.txt" not in bounded  # not reached within the budget
    with pytest.raises(HubError) as err:
        repo.last_commits(head, ["d19/f099.txt"], cancelled=lambda: True)
    assert err.value.status == 503


def test_tree_expand_over_http_answers_every_entry(big) -> None:
    store, ids = big
    with running_server(store.root) as server:
        started = time.perf_counter()
        url = f"{server.url}/api/kernels/{REPO}/tree/main?recursive=1&expand=1"
        with urllib.request.urlopen(url, timeout=60) as response:
            listing = json.load(response)
        print(f"tree?recursive=1&expand=1 over HTTP: {time.perf_counter() - started:.3f} s")
        body = json.dumps({"paths": ["d00/f005.txt", "d19"], "expand": True}).encode()
        request = urllib.request.Request(f"{server.url}/api/kernels/{REPO}/paths-info/main", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            info = {item["path"]: item for item in json.load(response)}
    items = {item["path"]: item for item in listing}
    assert len(items) == FOLDERS * PER_FOLDER + FOLDERS
    assert items["d00/f005.txt"]["lastCommit"]["id"] == ids[6].decode()
    assert info["d00/f005.txt"]["lastCommit"]["id"] == ids[6].decode()
    assert info["d19"]["lastCommit"]["id"] == ids[0].decode()


def test_serve_exits_soon_after_sigterm_during_a_slow_request(tmp_path: Path) -> None:
    with running_server(tmp_path / "store") as server:
        server.fault("/api/kernels/acme/slow", delay=60)

        def slow() -> None:
            with contextlib.suppress(OSError, http.client.HTTPException):  # the server goes away mid-request
                urllib.request.urlopen(f"{server.url}/api/kernels/acme/slow", timeout=90).read()

        caller = threading.Thread(target=slow, daemon=True)
        caller.start()
        time.sleep(1.0)  # the request is in: it sleeps 60 s in the server
        assert caller.is_alive()
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("kernel-hub serve still ran 15 s after SIGTERM during a slow request")
        print(f"serve stopped {time.monotonic() - started:.2f} s after SIGTERM")
        assert time.monotonic() - started < 10
