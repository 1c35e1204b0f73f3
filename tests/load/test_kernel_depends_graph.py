"""kernel-depends as a graph: a diamond loads its shared dependencies once, a chain deeper than the limit is one short
error naming its ends (never a RecursionError, never one line per level), and a lock file pins every dependency by
commit: a locked load answers `get_kernel_dep` from the lock and never follows a branch that moved since."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")
pytest.importorskip("torch")
pytest.importorskip("kernels")

from huggingface_hub import HfApi

import kernel_hub.load.pipeline as kh_pipeline
from kernel_hub.api import load_plan, plan_load
from kernel_hub.errors import KernelHubError
from kernel_hub.load.depends import MAX_DEPENDS_DEPTH
from kernel_hub.load.lock import get_locked_kernel, lock, read_lock
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import running_server
from tests.kernel_builder_repo import publish, write_variant

TOKEN = "depends-token"
LEVELS = 4  # diamond levels: 2 repos each, every one depending on both of the level below
CHAIN = MAX_DEPENDS_DEPTH + 3


def _dep(repo: str) -> dict:
    return {"repo-id": repo, "version": 1}


def _kernel(root: Path, api: HfApi, repo: str, deps: tuple[str, ...], body: str = "", branches=("v1",)) -> str:
    name = repo.split("/")[1]
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    write_variant(folder, "torch-cpu", name, {"__init__.py": f"{body}\nNAME = {repo!r}\n__all__ = ['NAME']\n"},
                  kernel_depends=tuple(_dep(d) for d in deps))
    return publish(api, repo, folder, branches=branches)


def _diamond(level: int) -> list[str]:
    return [f"acme/kd-d{level}a", f"acme/kd-d{level}b"] if level <= LEVELS else ["acme/kd-leaf"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("depends")
    with running_server(root / "store", token=TOKEN) as srv:
        api = HfApi(endpoint=srv.url, token=TOKEN)
        _kernel(root, api, "acme/kd-leaf", ())
        for level in range(LEVELS, 0, -1):
            for repo in _diamond(level):
                _kernel(root, api, repo, tuple(_diamond(level + 1)))
        _kernel(root, api, "acme/kd-top", tuple(_diamond(1)))
        for i in range(CHAIN, -1, -1):  # kd-c0 -> kd-c1 -> ... -> kd-c{CHAIN}
            _kernel(root, api, f"acme/kd-c{i}", (f"acme/kd-c{i + 1}",) if i < CHAIN else ())
        for i in range(10, -1, -1):  # kd-m0 -> ... -> kd-m10 -> a repo that does not exist
            _kernel(root, api, f"acme/kd-m{i}", (f"acme/kd-m{i + 1}" if i < 10 else "acme/kd-absent",))
        srv.root, srv.api = root, api
        yield srv


def _load(hub, cache: Path, repo: str):
    plan = plan_load(repo, version=1, framework="torch", backend="cpu",
                     source=HubSource(endpoint=hub.url, cache_dir=cache))
    return load_plan(plan, trust_remote_code=True)


def test_a_diamond_loads_each_dependency_once(hub, tmp_path: Path, monkeypatch) -> None:
    imported: list[str] = []
    real = kh_pipeline.import_build

    def counting(build, *args, **kwargs):
        imported.append(build.repo_id)
        return real(build, *args, **kwargs)

    monkeypatch.setattr(kh_pipeline, "import_build", counting)
    top = _load(hub, tmp_path, "acme/kd-top")
    every = ["acme/kd-top", "acme/kd-leaf"] + [r for level in range(1, LEVELS + 1) for r in _diamond(level)]
    assert sorted(imported) == sorted(every)  # each once: 2^LEVELS paths reach the leaf
    a, b = (top.__kernel_deps__[r] for r in _diamond(1))
    assert a.__kernel_deps__["acme/kd-d2a"] is b.__kernel_deps__["acme/kd-d2a"]


def test_a_chain_deeper_than_the_limit_is_one_short_error(hub, tmp_path: Path) -> None:
    with pytest.raises(KernelHubError) as info:
        _load(hub, tmp_path, "acme/kd-c0")
    text = str(info.value)
    assert f"deeper than {MAX_DEPENDS_DEPTH} levels" in text and "acme/kd-c0 -> " in text, text
    assert f"acme/kd-c{MAX_DEPENDS_DEPTH + 1}" in text and len(text) < 400 and "\n" not in text, text
    assert not isinstance(info.value.__cause__, RecursionError)


def test_a_failure_deep_down_is_named_once(hub, tmp_path: Path) -> None:
    with pytest.raises(KernelHubError) as info:
        _load(hub, tmp_path, "acme/kd-m0")
    text = str(info.value)
    assert text.count("did not load") == 1 and "kernel-depends acme/kd-absent (version 1)" in text, text
    assert text.startswith("acme/kd-m0 -> acme/kd-m1 -> ") and len(text) < 600, text


def test_a_lock_pins_dependencies_and_a_locked_load_ignores_a_moved_branch(hub, tmp_path: Path) -> None:
    root, api = hub.root, hub.api
    dep_commit = _kernel(root, api, "acme/kd-pinned", (), body="MARK = 'original'")
    user = "from kernels import get_kernel_dep\n\nMARK = get_kernel_dep('acme/kd-pinned').MARK"
    _kernel(root, api, "acme/kd-user", ("acme/kd-pinned",), body=user)
    path = tmp_path / "kernel-hub.lock"
    source = HubSource(endpoint=hub.url, cache_dir=tmp_path / "cache")
    lock(["acme/kd-user"], version=1, framework="torch", backend="cpu", path=path, source=source,
         trust_remote_code=True)
    locked = read_lock(path)
    entry = locked.find("acme/kd-user")
    assert entry.depends == {"acme/kd-pinned": dep_commit}
    pinned = locked.dependency("acme/kd-pinned", dep_commit, "torch", "acme/kd-user")
    assert pinned.files and pinned.variant["name"] == "torch-cpu"
    # the dependency's v1 branch moves to new content after the lock was written
    api.delete_branch("acme/kd-pinned", branch="v1", repo_type="kernel")
    assert _kernel(root, api, "acme/kd-pinned", (), body="MARK = 'moved'") != dep_commit
    module = get_locked_kernel("acme/kd-user", lockfile=path, framework="torch", source=source,
                               trust_remote_code=True)
    assert module.MARK == "original" and module.__kernel_deps__["acme/kd-pinned"].MARK == "original"
    assert _load(hub, tmp_path / "fresh", "acme/kd-user").MARK == "moved"  # unlocked: the branch as it is now
    # a lock entry that pins a dependency it does not hold: one error saying to re-lock
    broken = tmp_path / "broken.lock"
    broken.write_text(path.read_text().replace(f'"acme/kd-pinned": "{dep_commit}"', f'"acme/kd-pinned": "{"f" * 40}"'))
    with pytest.raises(KernelHubError, match=r"pins kernel-depends acme/kd-pinned at f{12} but holds no entry"):
        get_locked_kernel("acme/kd-user", lockfile=broken, framework="torch", source=source, trust_remote_code=True)
