"""The Hub source: resolution, request counts, the cache, offline mode, concurrency and failures,
against `kernel-hub serve` in a real process, through huggingface_hub only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from kernel_hub.api import load_plan, plan_load
from kernel_hub.errors import KernelHubError, KernelNotFoundError
from kernel_hub.package.buildfmt import bundle_path
from kernel_hub.publish.release import publish
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import cli_command, hub_env, hub_requests
from tests.toy_folder import copy_toy

TOKEN = "test-token"
REPO = "acme/toy-scale"
THREE = "\n_scale2 = scale\n\n\ndef scale(x, factor=3.0):\n    return _scale2(x, factor)\n"


def seed_server(srv, root: Path) -> None:
    """The `server` fixture's store (tests/conftest.py): acme/toy-scale 1.2.0 (scales by 2) and 1.3.0 (by 3),
    branch v1 at 1.3.0."""
    for version, extra in (("1.2.0", None), ("1.3.0", THREE)):
        publish(copy_toy(root / version, version, extra), repo_id=REPO, endpoint=srv.url, token=TOKEN,
                skip_validation=True, skip_tpu_compile=True, log=lambda _: None)


def source(server, cache: Path, offline: bool = False) -> HubSource:
    return HubSource(endpoint=server.url, cache_dir=cache, offline=offline)


def load(src: HubSource, **kw):
    plan = plan_load(REPO, source=src, framework="jax", backend="cpu", **kw)
    return plan, load_plan(plan, trust_remote_code=True)


def test_fresh_load_by_major_makes_three_requests_then_one(server, tmp_path: Path) -> None:
    server.reset()
    plan, module = load(source(server, tmp_path), version=1)
    assert plan.resolution.ref == "v1" and plan.resolution.version == "1.3.0"
    assert module.scale(np.ones(2)).tolist() == [3.0, 3.0]
    commit = plan.resolution.commit
    assert hub_requests(server) == [
        ("GET", f"/api/kernels/{REPO}/refs", 200),
        ("HEAD", f"/kernels/{REPO}/resolve/{commit}/{bundle_path('jax-cpu')}", 200),
        ("GET", f"/kernels/{REPO}/resolve/{commit}/{bundle_path('jax-cpu')}", 200),
    ]
    # Only the chosen variant came down: one bundle in the Hub cache's snapshot.
    snapshot = tmp_path / "kernels--acme--toy-scale" / "snapshots" / commit
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == [
        "build/jax-cpu.tar"]

    server.reset()
    plan2, again = load(source(server, tmp_path), version=1)   # a new process would do the same
    assert plan2.resolution.commit == commit and again.scale(np.ones(1)).tolist() == [3.0]
    assert hub_requests(server) == [("GET", f"/api/kernels/{REPO}/refs", 200)]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(">=1.2,<1.3", "1.2.0"), (">=1.2,<2", "1.3.0"), ("~=1.2.0", "1.2.0"), ("1.2.0", "1.2.0")],
)
def test_ranges_pick_the_highest_matching_tag(server, tmp_path: Path, spec: str, expected: str) -> None:
    plan, module = load(source(server, tmp_path), version=spec)
    assert plan.resolution.version == expected
    assert module.scale(np.ones(1)).tolist() == [3.0 if expected == "1.3.0" else 2.0]  # that release's code


def test_two_versions_live_in_one_process(server, tmp_path: Path) -> None:
    src = source(server, tmp_path)
    _, old = load(src, version="==1.2.0")
    _, new = load(src, version="==1.3.0")
    assert old is not new and old.__name__ != new.__name__
    assert old.scale(np.ones(1)).tolist() == [2.0] and new.scale(np.ones(1)).tolist() == [3.0]


def test_revision_by_tag_and_commit(server, tmp_path: Path) -> None:
    src = source(server, tmp_path)
    plan, _ = load(src, revision="v1.2.0")
    commit = plan.resolution.commit
    plan2, _ = load(src, revision=commit)
    assert plan2.resolution.commit == commit and plan2.resolution.version == "1.2.0"


def test_offline_with_a_warm_cache_resolves_and_loads(server, tmp_path: Path) -> None:
    load(source(server, tmp_path), version=">=1.0,<2")
    server.reset()
    plan, module = load(source(server, tmp_path, offline=True), version=">=1.0,<2")
    assert plan.resolution.version == "1.3.0" and module.scale(np.ones(1)).tolist() == [3.0]
    assert "offline" in plan.source.describe()
    assert hub_requests(server) == []


def test_offline_with_a_cold_cache_is_one_line(server, tmp_path: Path) -> None:
    with pytest.raises(KernelHubError) as exc:
        load(source(server, tmp_path, offline=True), version=1)
    message = str(exc.value)
    assert "HF_HUB_OFFLINE=1" in message and "\n" not in message


def test_unknown_repo_names_the_endpoint(server, tmp_path: Path) -> None:
    with pytest.raises(KernelNotFoundError) as exc:
        plan_load("acme/nothing-here", version=1, source=source(server, tmp_path))
    assert server.url in str(exc.value) and "\n" not in str(exc.value)


def test_server_error_is_one_line_naming_the_endpoint(server, tmp_path: Path) -> None:
    server.fault(f"/api/kernels/{REPO}/refs", status=500)
    try:
        with pytest.raises(KernelHubError) as exc:
            load(source(server, tmp_path), version=1)
    finally:
        server.clear_faults()
    assert server.url in str(exc.value) and "500" in str(exc.value) and "\n" not in str(exc.value)
    assert "test hook: injected 500" in str(exc.value)  # what the server said (X-Error-Message), on the line


def test_cut_off_download_leaves_nothing_that_loads(server, tmp_path: Path) -> None:
    src = source(server, tmp_path)
    server.fault(bundle_path("jax-cpu"), truncate=True, times=20)  # every retry is cut off too
    try:
        with pytest.raises(KernelHubError) as exc:  # the plan fetches the preferred build to choose it
            load_plan(plan_load(REPO, version="==1.2.0", source=src, framework="jax", backend="cpu"),
                      trust_remote_code=True)
    finally:
        server.clear_faults()
    assert server.url in str(exc.value) and "\n" not in str(exc.value)
    repo_dir = tmp_path / "kernels--acme--toy-scale"
    plan = plan_load(REPO, version="==1.2.0", source=source(server, tmp_path / "other"), framework="jax",
                     backend="cpu")
    assert not src.cache.build_dir(REPO, plan.resolution.commit, "jax-cpu").exists()
    assert not [p for p in (repo_dir / "blobs").glob("*") if not p.name.endswith(".incomplete")]
    assert not list((repo_dir / "snapshots").rglob("*.tar"))
    module = load_plan(plan_load(REPO, version="==1.2.0", source=src, framework="jax", backend="cpu"),
                       trust_remote_code=True)
    # the server recovers: the next load completes and loads
    assert module.scale(np.ones(1)).tolist() == [2.0]


def test_timeout_is_one_line_naming_the_endpoint(server, tmp_path: Path) -> None:
    server.fault(f"/api/kernels/{REPO}/refs", delay=5)
    try:
        proc = subprocess.run([*cli_command(), "resolve", REPO, "--version", "1"], capture_output=True, text=True,
                              env=hub_env(server, tmp_path, KERNEL_HUB_HTTP_TIMEOUT="1"), timeout=120)
    finally:
        server.clear_faults()
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and server.url in lines[0] and "timed out" in lines[0], proc.stderr


CONCURRENT = """
import sys
from kernel_hub.api import load_plan, plan_load
from kernel_hub.sources.hub.source import HubSource
from kernel_hub.decide.system import SystemFacts
src = HubSource(endpoint=sys.argv[1], cache_dir=sys.argv[2])
facts = SystemFacts(backend="cpu", jax_version="0.10.2")  # decided without importing jax: the toy is NumPy
module = load_plan(plan_load(sys.argv[3], version=1, source=src, framework="jax", system=facts),
                   trust_remote_code=["acme"])
print(module.scale(__import__("numpy").ones(1)).tolist())
"""


def test_eight_processes_share_one_download(server, tmp_path: Path) -> None:
    server.reset()
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, server.url, str(cache), REPO],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = [p.communicate(timeout=240) + (p.returncode,) for p in procs]
    for out, err, code in results:
        assert code == 0, err[-1500:]
        assert out.strip() == "[3.0]"
    gets = [r for r in hub_requests(server) if r[0] == "GET" and r[1].endswith(bundle_path("jax-cpu"))]
    assert len(gets) == 1  # the Hub cache's lock: one copy downloaded
    repo_dir = cache / "kernels--acme--toy-scale"
    assert len(list((repo_dir / "blobs").iterdir())) == 1
    builds = list((repo_dir / "kernel-hub" / "builds").rglob("metadata.json"))
    assert len(builds) == 1
    leftovers = [p for p in repo_dir.rglob("*") if p.name.endswith((".partial", ".trash", ".incomplete", ".tmp"))]
    assert leftovers == []


HOLD_LOCK = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_leftovers_of_killed_processes_are_cleaned_on_the_next_fetch(server, tmp_path: Path) -> None:
    import os
    import time

    from kernel_hub.sources.hub.cache import STALE_SECONDS

    cache = tmp_path / "cache"
    plan, _ = load(source(server, cache), version="==1.2.0")
    commit = plan.resolution.commit
    src = source(server, cache)
    commit_dir = src.cache.build_dir(REPO, commit, "jax-cpu").parent
    old = time.time() - STALE_SECONDS - 60
    stale = [commit_dir / "jax-cpu.0123abcd.partial", commit_dir / "jax-cpu.4567ef01.trash"]
    fresh = commit_dir / "jax-cpu.89abcdef.partial"   # an unpack in progress right now
    for folder in [*stale, fresh]:
        (folder / "toy_scale").mkdir(parents=True)
        (folder / "toy_scale" / "ops.py").write_text("x = 1\n")
    for folder in stale:
        os.utime(folder, (old, old))
    torn = cache / "kernels--acme--toy-scale" / "kernel-hub" / ".refs.json.0123.tmp"   # a write cut short
    torn.write_text("{")
    os.utime(torn, (old, old))
    blobs = cache / "kernels--acme--toy-scale" / "blobs"
    dead = blobs / f"{'a' * 40}.1234abcd.incomplete"        # its download was killed: nobody holds its lock
    alive = blobs / f"{'b' * 40}.5678abcd.incomplete"       # a download in progress holds its lock
    dead.write_bytes(b"partial")
    alive.write_bytes(b"partial")
    other_repo = cache / "kernels--acme--other" / "blobs" / f"{'c' * 40}.incomplete"   # not this repo's
    other_repo.parent.mkdir(parents=True)
    other_repo.write_bytes(b"partial")
    lock = cache / ".locks" / "kernels--acme--toy-scale" / f"{'b' * 40}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        load_plan(plan_load(REPO, version="==1.2.0", source=src, framework="jax", backend="cpu"),
                  trust_remote_code=True)
    finally:
        holder.kill()
        holder.wait()
    assert [p.exists() for p in [*stale, torn]] == [False, False, False]
    assert fresh.exists() and alive.exists() and other_repo.exists()
    assert not dead.exists()
