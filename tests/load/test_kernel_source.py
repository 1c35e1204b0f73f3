"""get_kernel says which source served it (`__kernel_hub_source__`, an INFO log line), and `source="hub"` /
KERNEL_HUB_SOURCE=hub asks for the Hub at HF_ENDPOINT over the registry's source path (the checkout's copy)."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.errors import KernelHubError, KernelNotFoundError
from tests.client_env import point_at
from tests.hub_server import running_server
from tests.toy_folder import set_version

TOKEN = "test-token"
REPO = "kernel-hub/toy-scale"  # a trusted organisation, as the checkout's kernels are


@pytest.fixture
def hub_and_checkout(tmp_path, toy_kernel, monkeypatch):
    """A registry naming only a source path for REPO (as the embedded one does), and a server holding REPO 2.0.0."""
    from kernel_hub.publish.release import publish

    meta = toy_kernel / "kernel.yaml"
    meta.write_text(meta.read_text().replace("repo_id: test-org/toy-scale", f"repo_id: {REPO}"))
    registry = tmp_path / "registry.yaml"
    registry.write_text(f"kernels:\n  - repo_id: {REPO}\n    source: {toy_kernel}\n    version: '>=1.0,<3'\n")
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(registry))
    monkeypatch.delenv("KERNEL_HUB_SOURCE", raising=False)
    # kernel-hub is trusted by default only at huggingface.co: a loopback mirror of it is trusted explicitly
    monkeypatch.setenv("KERNEL_HUB_TRUSTED_ORGS", "kernel-hub")
    published = tmp_path / "published"
    shutil.copytree(toy_kernel, published)
    set_version(published, "2.0.0")
    with running_server(tmp_path / "store", token=TOKEN) as srv:
        publish(published, repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True, skip_tpu_compile=True,
                log=lambda _: None)
        point_at(monkeypatch, srv.url, tmp_path / "cache")
        yield srv, toy_kernel


def test_the_default_serves_the_source_path_and_says_so(hub_and_checkout, caplog):
    _srv, checkout = hub_and_checkout
    with caplog.at_level(logging.INFO, logger="kernel_hub"):
        mod = kh.get_kernel(REPO, version=">=1", backend="cpu")
    assert mod.__kernel_hub_source__ == f"local {checkout}"
    assert mod.__kernel_hub__.version != "2.0.0"
    assert any(REPO in r.getMessage() and f"local {checkout}" in r.getMessage() for r in caplog.records)


def test_source_hub_serves_the_hub_over_the_checkout(hub_and_checkout, caplog):
    srv, _ = hub_and_checkout
    with caplog.at_level(logging.INFO, logger="kernel_hub"):
        mod = kh.get_kernel(REPO, version=2, backend="cpu", source="hub")
    assert mod.__kernel_hub_source__ == f"hub {srv.url}" and mod.__kernel_hub__.version == "2.0.0"
    assert float(mod.scale(np.ones(1), 3.0)[0]) == 3.0
    assert any(f"hub {srv.url}" in r.getMessage() for r in caplog.records)


def test_the_environment_variable_asks_for_the_hub_too(hub_and_checkout, monkeypatch):
    srv, _ = hub_and_checkout
    monkeypatch.setenv("KERNEL_HUB_SOURCE", "hub")
    mod = kh.get_kernel(REPO, version=2, backend="cpu")
    assert mod.__kernel_hub_source__ == f"hub {srv.url}"


def test_a_bad_source_is_one_error_naming_it(hub_and_checkout, monkeypatch):
    with pytest.raises(KernelHubError, match="source= must be one of auto, hub, local"):
        kh.get_kernel(REPO, backend="cpu", source="github")
    monkeypatch.setenv("KERNEL_HUB_SOURCE", "nope")
    with pytest.raises(KernelHubError, match="KERNEL_HUB_SOURCE must be one of"):
        kh.get_kernel(REPO, backend="cpu")
    monkeypatch.delenv("KERNEL_HUB_SOURCE")
    with pytest.raises(KernelNotFoundError, match="names no source path"):
        kh.get_kernel("kernel-hub/not-in-the-registry", version=1, backend="cpu", source="local")
