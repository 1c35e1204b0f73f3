"""publish moves `v<N>` (and main) in one step: a publish killed while moving leaves the old release in place and a
re-run repairs the branch; concurrent publishes leave `v1` and main on the newest release; loads during publishes
always find `v1`; a Hub without compare-and-swap gets the release committed onto the branch."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from huggingface_hub import HfApi

from kernel_hub.decide.versions import resolve
from kernel_hub.errors import KernelHubError
from kernel_hub.publish.release import publish
from kernel_hub.sources.hub.client import HubClient
from kernel_hub.sources.hub.source import HubSource
from tests.toy_folder import copy_toy

TOKEN = "branch-token"


def _publish(server, folder: Path, repo: str):
    return publish(folder, repo_id=repo, endpoint=server.url, token=TOKEN, skip_validation=True,
                   skip_tpu_compile=True, log=lambda _: None)


def _refs(server, repo: str) -> tuple[dict[str, str], dict[str, str]]:
    refs = HfApi(endpoint=server.url, token=TOKEN).list_repo_refs(repo, repo_type="kernel")
    return {t.name: t.target_commit for t in refs.tags}, {b.name: b.target_commit for b in refs.branches}


def _kill_on_branch_write(monkeypatch: pytest.MonkeyPatch, branch: str) -> None:
    """The publish dies at the moment it writes `branch` (after its delete, where a publish deletes first)."""
    def killed(self, repo_id, name, *args, **kwargs):
        if name == branch:
            raise KernelHubError("killed")
        return real_create(self, repo_id, name, *args, **kwargs)

    real_create = HubClient.create_branch
    monkeypatch.setattr(HubClient, "create_branch", killed)
    monkeypatch.setattr(HubClient, "move_branch", killed, raising=False)


def test_a_publish_killed_while_moving_the_branch_keeps_v1_and_a_rerun_repairs_it(server, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    repo = "acme/killed-move"
    first = _publish(server, copy_toy(tmp_path / "a", "1.0.0"), repo)
    newer = copy_toy(tmp_path / "b", "1.1.0", "\n# 1.1.0\n")
    with monkeypatch.context() as patch:
        _kill_on_branch_write(patch, "v1")
        with pytest.raises(KernelHubError, match="killed"):
            _publish(server, newer, repo)
    tags, branches = _refs(server, repo)
    assert branches.get("v1") == first.commit  # never without v1, still on the last complete release
    again = _publish(server, newer, repo)
    tags, branches = _refs(server, repo)
    assert branches["v1"] == tags["v1.1.0"] == again.commit
    assert again.repaired and not again.unchanged and "now does" in again.summary()
    assert _publish(server, newer, repo).unchanged  # and then there is nothing to do


def test_concurrent_publishes_leave_v1_and_main_on_the_newest(server, tmp_path: Path, monkeypatch) -> None:
    """The older publish reads the refs first and uploads last: the worst order for a delete+create move."""
    repo = "acme/race"
    _publish(server, copy_toy(tmp_path / "base", "1.0.0"), repo)
    newer_done = threading.Event()
    real_upload = HubClient.upload

    def upload(self, repo_id, root, add, delete, message, *args, **kwargs):
        if "1.0.1" in message:
            assert newer_done.wait(120)
        return real_upload(self, repo_id, root, add, delete, message, *args, **kwargs)

    monkeypatch.setattr(HubClient, "upload", upload)
    errors: list[BaseException] = []

    def older() -> None:
        try:
            _publish(server, copy_toy(tmp_path / "older", "1.0.1", "\n# 1.0.1\n"), repo)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=older)
    thread.start()
    try:
        newest = _publish(server, copy_toy(tmp_path / "newer", "1.2.0", "\n# 1.2.0\n"), repo)
    finally:
        newer_done.set()
        thread.join(120)
    assert not errors, errors
    tags, branches = _refs(server, repo)
    assert {"v1.0.0", "v1.0.1", "v1.2.0"} <= set(tags)
    assert branches["v1"] == branches["main"] == newest.commit == tags["v1.2.0"]
    assert not [b for b in branches if b.startswith("kernel-hub-publish-")]  # no staging branch left
    hub = HubClient(endpoint=server.url, token=TOKEN)
    older_files = hub.build_blob_ids(repo, tags["v1.0.1"])
    assert older_files and older_files != hub.build_blob_ids(repo, "main")  # 1.0.1's content is its own commit


def test_loads_during_publishes_always_find_v1(server, tmp_path: Path) -> None:
    repo = "acme/busy"
    _publish(server, copy_toy(tmp_path / "v0", "1.0.0"), repo)
    stop = threading.Event()
    failures: list[str] = []
    count = [0]

    def load() -> None:
        hub = HubSource(endpoint=server.url, token=False, cache_dir=tmp_path / "cache")
        while not stop.is_set():
            try:
                resolve(hub.refs(repo), version=1)
            except KernelHubError as exc:
                failures.append(str(exc))
            count[0] += 1

    reader = threading.Thread(target=load)
    reader.start()
    try:
        for minor in (1, 2, 3):
            _publish(server, copy_toy(tmp_path / f"v{minor}", f"1.{minor}.0", f"\n# 1.{minor}.0\n"), repo)
    finally:
        stop.set()
        reader.join(60)
    assert count[0] > 10 and not failures, failures[:3]


def test_a_hub_without_compare_and_swap_gets_the_release_committed_onto_the_branch(server, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """The Hub refuses an existing branch with 409 (no move): the release's files are committed onto v1 instead."""
    repo = "acme/plain-hub"
    _publish(server, copy_toy(tmp_path / "a", "1.0.0"), repo)

    def no_cas(self, repo_id, branch, commit, expected):
        if expected is None:
            self.create_branch(repo_id, branch, commit)
            return True
        return False

    monkeypatch.setattr(HubClient, "move_branch", no_cas)
    newer = _publish(server, copy_toy(tmp_path / "b", "1.1.0", "\n# 1.1.0\n"), repo)
    _, branches = _refs(server, repo)
    hub = HubClient(endpoint=server.url, token=TOKEN)
    assert branches["v1"] != newer.commit  # a commit of its own on v1 ...
    assert hub.build_blob_ids(repo, branches["v1"]) == hub.build_blob_ids(repo, newer.commit)  # ... with 1.1.0
    assert _publish(server, copy_toy(tmp_path / "c", "1.1.0", "\n# 1.1.0\n"), repo).unchanged  # a re-run: nothing
