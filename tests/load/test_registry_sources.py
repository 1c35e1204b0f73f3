"""A registry entry naming both a Hub repo and a source path: the Hub when it answers, else the source."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.api import plan_load
from tests.hub_server import running_server
from tests.toy_folder import set_version

TOKEN = "test-token"


def _registry(tmp_path: Path, source: Path, hub: str) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(
        "kernels:\n"
        "  - repo_id: test-org/toy-scale\n"
        f"    source: {source}\n"
        f"    hub: {hub}\n"
        '    version: ">=1.0,<3"\n'
    )
    return path


def test_unreachable_hub_falls_back_to_the_source_path(tmp_path, toy_kernel, monkeypatch):
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(_registry(tmp_path, toy_kernel, "test-org/toy-scale")))
    plan = plan_load("test-org/toy-scale", backend="cpu")  # HF_ENDPOINT is a closed port (conftest)
    described = plan.source.describe()
    assert "source path" in described and "Hub unavailable" in described and "127.0.0.1:9" in described
    mod = kh.get_kernel("test-org/toy-scale", backend="cpu")
    assert mod.__kernel_hub__.source == str(toy_kernel) and float(mod.scale(np.ones(1), 2.0)[0]) == 2.0


def test_reachable_hub_serves_before_the_source_path(tmp_path, toy_kernel):
    from kernel_hub.publish.release import publish
    from tests.hub_server import hub_env

    published = tmp_path / "published"
    shutil.copytree(toy_kernel, published)
    set_version(published, "2.0.0")  # the Hub holds a newer release than the source path
    registry = _registry(tmp_path, toy_kernel, "test-org/toy-scale")
    script = (
        "import kernel_hub as kh\n"
        "m = kh.get_kernel('test-org/toy-scale', backend='cpu', trust_remote_code=True)\n"
        "print(m.__kernel_hub__.version, m.__kernel_hub__.source)\n"
    )
    with running_server(tmp_path / "store", token=TOKEN) as srv:
        publish(published, repo_id="test-org/toy-scale", endpoint=srv.url, token=TOKEN, skip_validation=True,
                skip_tpu_compile=True, log=lambda _: None)
        env = hub_env(srv, tmp_path / "hf-cache", KERNEL_HUB_REGISTRY=str(registry))
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2.0.0", srv.url]


@pytest.mark.parametrize("hub", ["test-org/toy-scale"])
def test_entry_without_hub_never_asks_the_hub(tmp_path, toy_kernel, monkeypatch, hub):
    path = tmp_path / "registry.yaml"
    path.write_text(f"kernels:\n  - repo_id: {hub}\n    source: {toy_kernel}\n    version: '>=1'\n")
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(path))
    assert plan_load(hub, backend="cpu").source.describe() == f"source path {toy_kernel}"


def test_lock_while_the_hub_is_down_records_the_source_path_it_used(tmp_path, toy_kernel, monkeypatch):
    from kernel_hub.load.lock import get_locked_kernel, lock, read_lock

    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(_registry(tmp_path, toy_kernel, "test-org/toy-scale")))
    lockfile = tmp_path / "kernel-hub.lock"
    lock(["test-org/toy-scale"], backend="cpu", path=lockfile)   # HF_ENDPOINT is a closed port (conftest)
    entry = read_lock(lockfile).find("test-org/toy-scale")
    assert (entry.source, entry.location) == ("local", str(toy_kernel))
    module = get_locked_kernel("test-org/toy-scale", lockfile=lockfile)
    assert module.__kernel_hub__.source == str(toy_kernel) and float(module.scale(np.ones(1), 2.0)[0]) == 2.0
    assert module.__kernel_hub_source__ == f"local {toy_kernel}"  # get_kernel's words for the source it used


def test_a_lock_cannot_point_the_loader_at_another_folder(tmp_path, toy_kernel, toy_registry):
    import json

    from kernel_hub.errors import KernelHubError
    from kernel_hub.load.lock import get_locked_kernel, lock

    lockfile = tmp_path / "kernel-hub.lock"
    lock(["test-org/toy-scale"], backend="cpu", path=lockfile)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(toy_kernel, elsewhere)   # same content, same commit: only the registry decides the folder
    data = json.loads(lockfile.read_text())
    data["kernels"][0]["location"] = str(elsewhere)
    lockfile.write_text(json.dumps(data))
    with pytest.raises(KernelHubError, match="the registry serves it from"):
        get_locked_kernel("test-org/toy-scale", lockfile=lockfile)


@pytest.mark.parametrize("edit", [{"entry": "torch_entry.py"}, {"name": "jax-gpu"}, {"backend": "tpu"},
                                  {"requires": {}}], ids=["entry", "name", "backend", "requires"])
def test_a_local_lock_entry_must_say_what_kernel_yaml_says(tmp_path, toy_kernel, toy_registry, edit):
    """A lock file's variant JSON for a `source: local` kernel is compared to kernel.yaml: it can pick neither
    another entry file nor a variant kernel.yaml does not have."""
    import json

    from kernel_hub.errors import IntegrityError
    from kernel_hub.load.lock import get_locked_kernel, lock

    lockfile = tmp_path / "kernel-hub.lock"
    lock(["test-org/toy-scale"], backend="cpu", path=lockfile)
    data = json.loads(lockfile.read_text())
    assert data["kernels"][0]["source"] == "local" and data["kernels"][0]["variant"]["name"] == "jax-cpu"
    data["kernels"][0]["variant"].update(edit)
    lockfile.write_text(json.dumps(data))
    field = next(iter(edit))
    with pytest.raises(IntegrityError, match="kernel.yaml") as err:
        get_locked_kernel("test-org/toy-scale", lockfile=lockfile)
    assert "\n" not in str(err.value) and (field in str(err.value) or "is not in" in str(err.value))


def test_an_alias_is_trusted_by_the_repo_it_fetches(tmp_path, toy_kernel, monkeypatch):
    from kernel_hub.errors import TrustError
    from kernel_hub.load.lock import get_locked_kernel, lock, read_lock
    from kernel_hub.publish.release import publish
    from tests.client_env import point_at

    registry = tmp_path / "registry.yaml"
    registry.write_text("kernels:\n  - repo_id: kernel-hub/aliased\n    hub: evil/aliased\n    version: '>=1'\n")
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(registry))
    monkeypatch.setenv("KERNEL_HUB_BACKEND", "cpu")
    lockfile = tmp_path / "k.lock"
    with running_server(tmp_path / "store", token=TOKEN) as srv:
        publish(toy_kernel, repo_id="evil/aliased", endpoint=srv.url, token=TOKEN, skip_validation=True,
                skip_tpu_compile=True, log=lambda _: None)
        point_at(monkeypatch, srv.url, tmp_path / "cache")
        with pytest.raises(TrustError, match="evil/aliased"):   # kernel-hub is trusted; evil, the fetched repo, not
            kh.get_kernel("kernel-hub/aliased")
        with pytest.raises(TrustError, match="evil/aliased"):
            lock(["kernel-hub/aliased"], path=lockfile)
        assert not lockfile.exists()
        mod = kh.get_kernel("kernel-hub/aliased", trust_remote_code=["evil/aliased"])
        assert float(mod.scale(np.ones(1), 2.0)[0]) == 2.0
        lock(["kernel-hub/aliased"], path=lockfile, trust_remote_code=["evil"])
        assert read_lock(lockfile).find("kernel-hub/aliased").hub_repo == "evil/aliased"
        with pytest.raises(TrustError, match="evil/aliased"):   # a locked load checks the fetched repo too
            get_locked_kernel("kernel-hub/aliased", lockfile=lockfile)
        locked = get_locked_kernel("kernel-hub/aliased", lockfile=lockfile, trust_remote_code=True)
        assert locked.__kernel_hub__.source == srv.url
