"""HF `kernels`' conventions: LOCAL_KERNELS loads a repo from a kernel folder, KERNELS_CACHE moves the Hub cache,
kernels-minver newer than the format kernel-hub reads is refused before import, `cache ls` / `cache prune` stay
inside their roots, and kernels.lock / `[tool.kernels]` are read and written in HF's format (checked against HF
kernels' own reader and writer), down to loading a kernel pinned by kernels.lock from a loopback server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub import cli
from kernel_hub.decide.hf_conventions import kernels_cache, local_override, minver_decision, parse_local_kernels
from kernel_hub.decide.variants import Variant
from kernel_hub.errors import KernelHubError, KernelImportError, MetadataError
from kernel_hub.load.cache_admin import cache_entries, prune, prune_plan, repo_from_folder
from kernel_hub.load.hf_lock import HfLockEntry, is_hf_lock, read_hf_lock, tool_kernels, write_hf_lock
from kernel_hub.load.loader import import_build
from kernel_hub.scaffold import init
from kernel_hub.sources.base import Build
from tests.toy_folder import copy_toy

TOKEN = "hf-conv-token"
COMMIT = "c0ffee" + "0" * 34


# -- LOCAL_KERNELS ------------------------------------------------------------------------------------------------
def test_local_kernels_parses_hf_format_and_refuses_bad_entries(tmp_path: Path) -> None:
    assert parse_local_kernels("acme/a=/x/a:acme/b=/y/b") == {"acme/a": Path("/x/a"), "acme/b": Path("/y/b")}
    for bad, needle in (("acme/a", "not repo_id=path"), ("acme/a=", "not repo_id=path"), ("../x=/p", "repo id")):
        with pytest.raises(KernelHubError, match=needle):
            parse_local_kernels(bad)
    (tmp_path / "tree" / "build").mkdir(parents=True)
    with pytest.raises(KernelHubError, match="holds no kernel.yaml"):
        local_override("acme/a", {"LOCAL_KERNELS": f"acme/a={tmp_path / 'tree'}"})
    assert local_override("acme/other", {"LOCAL_KERNELS": f"acme/a={tmp_path / 'tree'}"}) is None


def test_local_kernels_loads_the_mapped_folder_without_a_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = init("mapped_axpy", tmp_path, "binary", repo_id="acme/mapped-axpy")
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "kh-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be asked of any Hub
    monkeypatch.setenv("LOCAL_KERNELS", f"acme/mapped-axpy={folder}")
    module = kh.get_kernel("acme/mapped-axpy", version=1)  # local code: no trust_remote_code needed, as in HF
    x, y = np.random.default_rng(7).standard_normal((2, 37, 200)).astype(np.float32)
    got = np.asarray(module.axpy(x, y, alpha=0.25), np.float64)
    assert np.isfinite(got).all() and np.abs(got - (0.25 * x.astype(np.float64) + y)).max() < 1e-6
    assert Path(module.__kernel_hub__.source).resolve() == folder.resolve()


# -- KERNELS_CACHE ------------------------------------------------------------------------------------------------
def test_kernels_cache_is_the_hub_cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    from kernel_hub.sources.hub.source import HubSource

    assert kernels_cache({}) is None
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path / "kc"))
    hub = HubSource(endpoint="http://127.0.0.1:9")
    assert hub.cache_dir == tmp_path / "kc"
    assert hub.cache.repo_dir("acme/relu") == tmp_path / "kc" / "kernels--acme--relu"  # HF kernels' folder name
    monkeypatch.delenv("KERNELS_CACHE")
    assert HubSource(endpoint="http://127.0.0.1:9").cache_dir != tmp_path / "kc"


# -- kernels-minver -----------------------------------------------------------------------------------------------
def test_minver_decision_and_refusal_before_import(tmp_path: Path) -> None:
    assert minver_decision(None)[0] and minver_decision("0.19.1")[0] and minver_decision("0.19.9")[0]
    assert minver_decision("0.12")[0]
    ok, why = minver_decision("0.20.0")
    assert not ok and "upgrade kernel-hub" in why and "0.20.0" in why
    assert not minver_decision("new")[0]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('must never run')\n")
    build = Build("acme/future", "1.0.0", COMMIT, Variant("torch-cpu", "torch", "cpu"), pkg, "test",
                  digests={"__init__.py": "0" * 64}, kernels_minver="0.21")
    with pytest.raises(KernelImportError, match="needs the build format of kernels >= 0.21.*upgrade kernel-hub"):
        import_build(build)


# -- cache ls / prune ---------------------------------------------------------------------------------------------
@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    hub, khc, outside = tmp_path / "hub", tmp_path / "kh", tmp_path / "outside"
    for folder, size in ((hub / "kernels--acme--relu" / "blobs", 1000), (hub / "kernels--acme--gelu" / "blobs", 10),
                         (hub / "models--acme--bert" / "blobs", 5), (khc / "assembled" / "x", 7),
                         (khc / "tpu-env" / "bin", 3), (outside, 11)):
        folder.mkdir(parents=True)
        (folder / "f").write_bytes(b"x" * size)
    (hub / "kernels--evil--link").symlink_to(outside)
    monkeypatch.setenv("KERNELS_CACHE", str(hub))
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(khc))
    return {"hub": hub, "kh": khc, "outside": outside}


def test_cache_ls_lists_kernel_repos_and_kernel_hub_parts_only(caches, capsys) -> None:
    assert repo_from_folder("kernels--acme--relu") == "acme/relu" and repo_from_folder("models--a--b") is None
    assert repo_from_folder("kernels--a--b--c") is None
    assert cli.main(["cache", "ls", "--json"]) == 0
    listed = {(e["kind"], e["name"]): e["bytes"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert listed == {("repo", "acme/gelu"): 10, ("repo", "acme/relu"): 1000, ("kernel-hub", "assembled"): 7}


def test_cache_prune_removes_what_is_named_inside_the_roots(caches, capsys) -> None:
    assert cli.main(["cache", "prune", "acme/relu", "--dry-run"]) == 0
    assert "would remove" in capsys.readouterr().out and (caches["hub"] / "kernels--acme--relu").is_dir()
    assert cli.main(["cache", "prune", "acme/relu"]) == 0
    assert not (caches["hub"] / "kernels--acme--relu").exists() and (caches["hub"] / "kernels--acme--gelu").is_dir()
    assert cli.main(["cache", "prune", "acme/nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "acme/nope is not in the cache (cached kernel repos: acme/gelu)" in err[0]
    assert cli.main(["cache", "prune"]) == 1  # a bare prune never empties a cache
    assert cli.main(["cache", "prune", "--all"]) == 0
    assert sorted(p.name for p in caches["hub"].iterdir()) == ["kernels--evil--link", "models--acme--bert"]
    assert sorted(p.name for p in caches["kh"].iterdir()) == ["tpu-env"]
    assert (caches["outside"] / "f").is_file()  # a link's target is never touched


def test_prune_refuses_an_entry_outside_its_root(caches) -> None:
    [entry] = [e for e in cache_entries(caches["hub"], caches["kh"]) if e.name == "acme/gelu"]
    moved = entry.__class__(entry.kind, entry.name, caches["outside"], caches["hub"], 0)
    with pytest.raises(KernelHubError, match="not a folder directly inside"):
        prune([moved])
    with pytest.raises(KernelHubError, match="not both"):
        prune_plan([entry], ["acme/gelu"], True)
    assert (caches["outside"] / "f").is_file()


# -- kernels.lock and [tool.kernels] ------------------------------------------------------------------------------
def test_kernels_lock_round_trips_with_hf_kernels_own_reader_and_writer(tmp_path: Path) -> None:
    rust = pytest.importorskip("kernels._rust")
    theirs = rust.KernelLocks({
        rust.KernelDependency("acme/relu", rust.KernelVersion.Version(1)): rust.KernelLock("a" * 40),
        rust.KernelDependency("acme/gelu", rust.KernelVersion.Revision("main")): rust.KernelLock("b" * 40),
    }).to_json()
    path = tmp_path / "kernels.lock"
    path.write_text(theirs)
    assert is_hf_lock(path)
    entries = sorted(read_hf_lock(path), key=lambda e: e.repo_id)
    assert entries == [HfLockEntry("acme/gelu", None, "main", "b" * 40), HfLockEntry("acme/relu", 1, None, "a" * 40)]
    ours = tmp_path / "ours.lock"
    write_hf_lock(entries, ours)
    back = rust.KernelLocks.from_json(ours.read_text())
    assert {(d.repo_id, str(back[d].commit)) for d in back} == {("acme/gelu", "b" * 40), ("acme/relu", "a" * 40)}
    for bad in ('{"kernel-hub-lock": 1}', '[{"dependency": {"repo-id": "../x", "version": 1}, "lock": {"commit": "'
                + "a" * 40 + '"}}]', '[{"dependency": {"repo-id": "a/b"}, "lock": {"commit": "' + "a" * 40 + '"}}]'):
        path.write_text(bad)
        with pytest.raises(MetadataError):
            read_hf_lock(path)


def test_tool_kernels_reads_hfs_table_and_refuses_what_it_cannot(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[tool.kernels.dependencies]\n"acme/relu" = 1\n"acme/gelu" = 2\n')
    assert tool_kernels(pyproject) == {"acme/relu": 1, "acme/gelu": 2}
    for body, needle in (("[tool.other]\n", "no \\[tool.kernels.dependencies\\]"),
                         ('[tool.kernels.dependencies]\n"acme/relu" = "1"\n', "an integer"),
                         ('[tool.kernels.dependencies]\n"bad" = 1\n', "ORG/NAME"), ("[broken", "not valid TOML")):
        pyproject.write_text(body)
        with pytest.raises(MetadataError, match=needle):
            tool_kernels(pyproject)


_PROJECT = """
import json
from kernels._rust import KernelLocks
import kernel_hub as kh
from kernel_hub.load.hf_lock import lock_project
entries = lock_project(PROJECT, trust_remote_code=["acme"])
hf = KernelLocks.from_json(open(PROJECT + "/kernels.lock").read())
ours = json.load(open(PROJECT + "/kernel-hub.lock"))
k = kh.get_kernel("acme/toy-scale", lockfile=PROJECT + "/kernels.lock", trust_remote_code=["acme"])
print(json.dumps({"hf": {d.repo_id: str(hf[d].commit) for d in hf}, "entries": [e.commit for e in entries],
                  "ours": [(e["repo_id"], e["commit"]) for e in ours["kernels"]],
                  "loaded": k.__kernel_hub__.commit, "out": [float(v) for v in k.scale([1.0, -2.0], 3.0)]}))
"""


def test_lock_project_writes_both_locks_and_kernels_lock_loads(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("kernels")
    from kernel_hub.publish.release import publish
    from tests.hub_server import hub_env, running_server

    kernel = tmp_path / "toy"
    copy_toy(kernel)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.kernels.dependencies]\n"acme/toy-scale" = 1\n')
    with running_server(tmp_path / "store", token=TOKEN) as server:
        done = publish(kernel, repo_id="acme/toy-scale", endpoint=server.url, token=TOKEN, skip_validation=True,
                       skip_tpu_compile=True, log=lambda _: None)
        proc = subprocess.run([sys.executable, "-c", f"PROJECT = {str(project)!r}\n" + _PROJECT],
                              env=hub_env(server, tmp_path / "cache"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["hf"] == {"acme/toy-scale": done.commit} and got["entries"] == [done.commit]
    assert got["ours"] == [["acme/toy-scale", done.commit]] and got["loaded"] == done.commit
    assert got["out"] == [3.0, -6.0]


@pytest.mark.parametrize("linked", ["kernels.lock", "kernel-hub.lock"])
def test_lock_project_refuses_a_linked_lock_before_writing_anything(tmp_path: Path, monkeypatch, linked) -> None:
    from types import SimpleNamespace

    from kernel_hub.load import lock as lock_mod
    from kernel_hub.load.hf_lock import lock_project

    monkeypatch.setattr(lock_mod, "lock_one", lambda repo, **_: SimpleNamespace(repo_id=repo, commit="a" * 40))
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.kernels.dependencies]\n"acme/toy-scale" = 1\n')
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (project / linked).symlink_to(target)
    with pytest.raises(MetadataError, match="is a link"):
        lock_project(project)
    assert target.read_text() == "untouched"
    assert sorted(p.name for p in project.iterdir()) == sorted(["pyproject.toml", linked])
