"""A version is immutable: of two publishes racing to publish one version with different content, one wins and the
other is refused before it moves anything, so main, the tag vX.Y.Z and branch v<N> always hold the same release.

The races are forced, not hoped for: both publishers read the refs before either commits (a barrier in front of the
first upload), or one commits and the other publishes before the first one tags, or both commit onto staging
branches (main holds a newer release) and race for the tag.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from kernel_hub.errors import KernelHubError
from kernel_hub.sources.hub.client import HubClient
from tests.publish.test_publish_branch_moves import TOKEN, _publish, _refs
from tests.toy_folder import copy_toy

REFUSED = r"already published with different content|published by another publish meanwhile"


def _race(server, folders: list[Path], repo: str) -> tuple[list, list]:
    """Publish `folders` from two threads at once -> (results, errors)."""
    results, errors = [], []

    def one(folder: Path) -> None:
        try:
            results.append(_publish(server, folder, repo))
        except KernelHubError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(f,)) for f in folders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return results, errors


def _barrier_before_first_upload(monkeypatch) -> None:
    """Each publisher's first upload waits for the other's: both have read the refs before either commits."""
    barrier, local, real = threading.Barrier(2, timeout=60), threading.local(), HubClient.upload

    def upload(self, *args, **kwargs):
        if not getattr(local, "waited", False):
            local.waited = True
            barrier.wait()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HubClient, "upload", upload)


def _agree(server, repo: str, winner, version: str) -> None:
    tags, branches = _refs(server, repo)
    hub = HubClient(endpoint=server.url, token=TOKEN)
    assert hub.build_blob_ids(repo, tags[f"v{version}"]) == hub.build_blob_ids(repo, winner.commit)
    assert tags[f"v{version}"] == winner.commit
    assert not [b for b in branches if b.startswith("kernel-hub-publish-")]


@pytest.mark.parametrize("round_", range(4))
def test_two_racing_publishes_of_one_version_one_wins_main_tag_and_branch_agree(server, tmp_path, monkeypatch,
                                                                                round_):
    repo = f"acme/immutable-{round_}"
    _barrier_before_first_upload(monkeypatch)
    folders = [copy_toy(tmp_path / "a", "1.0.0", "\n# content a\n"),
               copy_toy(tmp_path / "b", "1.0.0", "\n# content b\n")]
    results, errors = _race(server, folders, repo)
    assert len(results) == 1 and len(errors) == 1, (results, errors)
    assert re.search(REFUSED, str(errors[0])), errors[0]
    _agree(server, repo, results[0], "1.0.0")
    tags, branches = _refs(server, repo)
    assert branches["main"] == branches["v1"] == tags["v1.0.0"] == results[0].commit


def test_a_publish_between_the_others_commit_and_tag_is_refused(server, tmp_path, monkeypatch):
    repo = "acme/immutable-untagged"
    first, second = copy_toy(tmp_path / "a", "1.0.0", "\n# a\n"), copy_toy(tmp_path / "b", "1.0.0", "\n# b\n")
    real_tag, second_done = HubClient.create_tag, threading.Event()

    def create_tag(self, repo_id, tag, commit, message):
        if threading.current_thread() is not threading.main_thread():  # the first publisher: tags last
            assert second_done.wait(120)
        return real_tag(self, repo_id, tag, commit, message)

    monkeypatch.setattr(HubClient, "create_tag", create_tag)
    results: list = []
    thread = threading.Thread(target=lambda: results.append(_publish(server, first, repo)))
    committed, real_upload = threading.Event(), HubClient.upload

    def upload(self, *args, **kwargs):
        out = real_upload(self, *args, **kwargs)
        committed.set()
        return out

    monkeypatch.setattr(HubClient, "upload", upload)
    thread.start()
    assert committed.wait(120)
    try:
        with pytest.raises(KernelHubError, match=r"v1\.0\.0 is already published with different content"):
            _publish(server, second, repo)
    finally:
        second_done.set()
        thread.join(120)
    assert len(results) == 1
    tags, branches = _refs(server, repo)
    assert branches["main"] == branches["v1"] == tags["v1.0.0"] == results[0].commit


def test_racing_publishes_of_an_older_version_race_for_the_tag(server, tmp_path, monkeypatch):
    repo = "acme/immutable-staged"
    newest = _publish(server, copy_toy(tmp_path / "n", "1.1.0", "\n# newest\n"), repo)
    _barrier_before_first_upload(monkeypatch)
    folders = [copy_toy(tmp_path / "a", "1.0.5", "\n# a\n"), copy_toy(tmp_path / "b", "1.0.5", "\n# b\n")]
    results, errors = _race(server, folders, repo)
    assert len(results) == 1 and len(errors) == 1, (results, errors)
    assert re.search(REFUSED, str(errors[0])), errors[0]
    _agree(server, repo, results[0], "1.0.5")
    tags, branches = _refs(server, repo)
    assert branches["main"] == branches["v1"] == tags["v1.1.0"] == newest.commit  # the newer release stays
