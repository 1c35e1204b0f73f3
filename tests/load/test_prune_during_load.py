"""`kernel-hub cache prune` beside a running load: a load that races a prune either succeeds (the build fetched
again) or fails with one KernelHubError, never a raw FileNotFoundError; a kernel loaded before a prune keeps working,
its validation module included (its verified bytes were read at load, not from the pruned folder later)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

import kernel_hub as kh
from kernel_hub import cli
from kernel_hub.load import loader
from kernel_hub.package import integrity
from kernel_hub.publish.release import publish
from tests.client_env import point_at
from tests.toy_folder import copy_toy

TOKEN = "test-token"
REPO = "acme/pruned"
TRUST = ["acme"]


def seed_server(srv, root: Path) -> None:
    publish(copy_toy(root / "toy"), repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True,
            skip_tpu_compile=True, log=lambda _: None)


@pytest.fixture
def hub_cache(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub-cache"
    point_at(monkeypatch, server.url, cache)
    monkeypatch.delenv("KERNELS_CACHE", raising=False)
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "kh-cache"))
    return cache


def _repo_folder(cache: Path) -> Path:
    return cache / "kernels--acme--pruned"


def _load(**kw: object):
    return kh.get_kernel(REPO, version=1, backend="cpu", trust_remote_code=TRUST, **kw)


def test_validate_after_a_prune_uses_the_bytes_verified_at_load(hub_cache: Path) -> None:
    module = _load()
    loader._loaded.clear()  # the next test loads afresh
    assert cli.main(["cache", "prune", "--all"]) == 0
    assert not _repo_folder(hub_cache).exists()
    report = kh.validate(module, backend="cpu")
    assert report.passed and report.cases
    assert module.scale(np.ones(2), 3.0).tolist() == [3.0, 3.0]


def test_a_prune_in_the_middle_of_checking_the_cached_build_refetches(hub_cache: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk lists the cached build's files, then another process removes the repo folder before each file is
    looked at: the load fetches the build again."""
    _load()
    loader._loaded.clear()
    real_walk = os.walk
    pruned: list[Path] = []

    def walk_then_prune(top, *args, **kwargs):
        for step in real_walk(top, *args, **kwargs):
            if not pruned and "kernels--acme--pruned" in str(top):
                pruned.append(Path(top))
                shutil.rmtree(_repo_folder(hub_cache))
            yield step

    monkeypatch.setattr(integrity.os, "walk", walk_then_prune)
    module = _load()
    assert pruned and module.scale(np.ones(1), 2.0).tolist() == [2.0]
    loader._loaded.clear()


def test_a_prune_between_verifying_and_importing_refetches(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_verify = loader.verify_tree
    pruned: list[bool] = []

    def verify_then_prune(root, *args, **kwargs):
        real_verify(root, *args, **kwargs)
        if not pruned:
            pruned.append(True)
            shutil.rmtree(_repo_folder(hub_cache))

    monkeypatch.setattr(loader, "verify_tree", verify_then_prune)
    module = _load()
    assert pruned and module.scale(np.ones(1), 2.0).tolist() == [2.0]
    loader._loaded.clear()


def test_loads_beside_a_pruning_loop_succeed_or_fail_in_one_line(hub_cache: Path) -> None:
    stop = threading.Event()

    def pruner() -> None:
        while not stop.is_set():
            shutil.rmtree(_repo_folder(hub_cache), ignore_errors=True)

    thread = threading.Thread(target=pruner, daemon=True)
    thread.start()
    outcomes: list[str] = []
    try:
        for _ in range(12):
            try:
                module = _load()
                outcomes.append("ok" if module.scale(np.ones(1), 2.0).tolist() == [2.0] else "wrong")
            except kh.KernelHubError as exc:
                assert "\n" not in str(exc).strip()
                outcomes.append("error")
            loader._loaded.clear()
    finally:
        stop.set()
        thread.join(30)
    assert outcomes and set(outcomes) <= {"ok", "error"}, outcomes
    assert _load().scale(np.ones(1), 2.0).tolist() == [2.0]  # and once the pruning stops, the load works
    loader._loaded.clear()
