"""One writing server per store: a second `kernel-hub serve --token` on a store in use refuses to start (one line
naming the live server's pid), a second one without a token serves it read-only and says so on its startup line,
and no server's start deletes the temporary files of a writer that is still running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("dulwich")

from huggingface_hub import CommitOperationAdd, HfApi

from kernel_hub.server.blobfiles import TMP_OBJECT_PREFIX, loose_object
from kernel_hub.server.gitstore import GitStore
from tests.hub_server import cli_command, running_server

TOKEN = "lock-token"
REPO = "acme/locked"


def test_a_second_read_write_server_refuses_and_a_read_only_one_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    with running_server(store, token=TOKEN) as first:
        env = {**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
        second = subprocess.run([*cli_command(), "serve", "--store", str(store), "--port", "0", "--token", "other"],
                                capture_output=True, text=True, timeout=60, env=env)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.process.pid}" in lines[0] and "read-only" in lines[0], second.stderr
        with running_server(store, token=None) as reader:
            startup = reader.log_text()
            assert "read-only" in startup and f"pid {first.process.pid} serves this store read-write" in startup
            assert HfApi(endpoint=reader.url).list_repo_refs(REPO, repo_type="kernel").branches
        # the first one still writes
        api = HfApi(endpoint=first.url, token=TOKEN)
        api.create_commit(REPO, [CommitOperationAdd("a.txt", b"still the writer\n")], commit_message="after",
                          repo_type="kernel")


def test_recovery_leaves_a_live_writers_temporary_files_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    GitStore(store).create("kernel", REPO)
    git_dir = store / "kernels" / f"{REPO}.git"
    objects = loose_object(git_dir, "ab" + "0" * 38).parent
    objects.mkdir(parents=True, exist_ok=True)
    blobs = git_dir / "kernel-hub" / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        planted = {}
        for who, pid in (("live", live.pid), ("dead", dead.pid)):
            planted[who] = [objects / f"{TMP_OBJECT_PREFIX}p{pid}-{'c' * 32}",
                            blobs / f".{'d' * 40}.p{pid}-{'e' * 32}.tmp"]
            for p in planted[who]:
                p.write_bytes(b"half written")
        removed = GitStore(store).recover()
        assert removed is not None and set(planted["dead"]) <= set(removed)
        assert all(p.exists() for p in planted["live"]) and not any(p.exists() for p in planted["dead"])
    finally:
        live.kill()
        live.wait()
