"""Shared fixtures: a toy kernel copied to a temp folder (so tests can edit it) and a registry for it, a local Hub
server (`kernel-hub serve`) per module or per test, and the ragged dot loaded once per module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

# The Hub endpoint and caches for tests are set in the root conftest.py (before huggingface_hub loads).
import pytest

from tests.toy_folder import copy_toy

if TYPE_CHECKING:
    from types import ModuleType

    from tests.hub_server import RunningServer

ROOT = Path(__file__).resolve().parents[1]
RAGGED_DOT = ROOT / "kernels" / "pallas" / "ragged_dot"


def _has_tpu() -> bool:
    import glob

    return bool(glob.glob("/dev/accel*"))


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config, items):
    skip_tpu = pytest.mark.skip(reason="needs a TPU")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    tpu, gpu = _has_tpu(), _has_gpu()
    for item in items:
        # the marker, not item.keywords: those hold every parent's name too (test_tpu_compile.py is no TPU test)
        if item.get_closest_marker("tpu") and not tpu:
            item.add_marker(skip_tpu)
        if item.get_closest_marker("gpu") and not gpu:
            item.add_marker(skip_gpu)


@pytest.fixture
def toy_kernel(tmp_path: Path) -> Path:
    """A fresh, writable copy of the toy kernel folder."""
    return copy_toy(tmp_path / "toy_kernel")


@pytest.fixture
def toy_registry(tmp_path: Path, toy_kernel: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry.yaml listing the toy kernel, made the default through KERNEL_HUB_REGISTRY."""
    path = tmp_path / "registry.yaml"
    path.write_text(
        "kernels:\n"
        "  - repo_id: test-org/toy-scale\n"
        f"    source: {toy_kernel}\n"
        '    version: ">=1.0,<2"\n'
        "    backends: [cpu]\n"
    )
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(path))
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "cache"))
    return path


@pytest.fixture
def experts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """kh.kernelize with attention and RMSNorm left on their defaults, for tests that pin the MoE path."""
    import kernel_hub as kh

    real = kh.kernelize

    def kernelize(model, **kw):
        return real(model, **{**kw, "mapping": {"attention": None, "rms_norm": None, **(kw.get("mapping") or {})}})

    monkeypatch.setattr(kh, "kernelize", kernelize)


@pytest.fixture
def no_rms_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """kh.kernelize with RMSNorm left on its default, for tests that pin the attention path's whole report."""
    import kernel_hub as kh

    real = kh.kernelize

    def kernelize(model, **kw):
        return real(model, **{**kw, "mapping": {"rms_norm": None, **(kw.get("mapping") or {})}})

    monkeypatch.setattr(kh, "kernelize", kernelize)


@pytest.fixture(scope="module")
def interop_hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """`kernel-hub serve` with the test module's INTEROP_KERNELS ({repo_id: kernel folder}) published, and a runner
    for client scripts against it (tests/hub_interop.py); skipped where the server or HF kernels is missing."""
    for name in ("huggingface_hub", "starlette", "torch", "kernels"):
        pytest.importorskip(name)
    from tests.hub_interop import published_hub

    with published_hub(tmp_path_factory.mktemp("interop"), request.module.INTEROP_KERNELS) as hub:
        yield hub


@pytest.fixture(scope="session")
def tpu_environment():
    """The TPU environment (.venv-tpu: libtpu, torch_tpu) from `make test`; skips, saying why, where it is absent
    (outside `make test` only: CI always has it)."""
    from kernel_hub.tpu.env import TpuEnvironmentError, tpu_env

    try:
        return tpu_env()
    except TpuEnvironmentError as exc:
        pytest.skip(str(exc))


@contextmanager
def _served(request: pytest.FixtureRequest, root: Path) -> Iterator[RunningServer]:
    """A server on a fresh store (root/store), as the test module asks: its TOKEN ("test-token" without one), its
    SERVER_ARGS (extra `serve` flags) and its seed_server(server, root) (what the store holds before the first test)."""
    pytest.importorskip("starlette", reason="`kernel-hub serve` needs the server extra (starlette)")
    from tests.hub_server import running_server

    module = request.module
    token = getattr(module, "TOKEN", "test-token")
    with running_server(root / "store", token=token, extra_args=tuple(getattr(module, "SERVER_ARGS", ()))) as srv:
        seed = getattr(module, "seed_server", None)
        if seed is not None:
            seed(srv, root)
        yield srv


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`kernel-hub serve` shared by the tests of one module (started once: a server takes a second or two)."""
    with _served(request, tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as srv:
        yield srv


@pytest.fixture
def fresh_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    """`kernel-hub serve` for one test only, for tests that stop it or leave its store changed."""
    with _served(request, tmp_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def rd(request: pytest.FixtureRequest) -> ModuleType:
    """The ragged dot, loaded once per test module: by default the torch build for CPU from the embedded registry
    (what kernelize and a torch user get). A module sets RD_LOAD to load it otherwise: get_kernel's keyword
    arguments, or {"local": True, ...} for get_local_kernel on kernels/pallas/ragged_dot itself with the rest."""
    import kernel_hub as kh

    load = dict(getattr(request.module, "RD_LOAD", {"framework": "torch", "backend": "cpu"}))
    if load.pop("local", False):
        return kh.get_local_kernel(RAGGED_DOT, **load)
    return kh.get_kernel("kernel-hub/ragged-dot-tpu", **load)
