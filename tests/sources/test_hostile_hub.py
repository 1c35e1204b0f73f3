"""A hostile Hub: repos committed straight through huggingface_hub's create_commit (bypassing our publish) to a
real `kernel-hub serve`, and refs a hostile server could return. Each is refused in one line by get_kernel,
`kernel-hub download` and `kernel-hub lock`, with sentinel files and folders outside the cache untouched,
nothing half-written in the cache and nothing of the kernel imported."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from huggingface_hub import CommitOperationAdd, HfApi

import kernel_hub as kh
from kernel_hub import cli
from kernel_hub.decide.versions import Ref, resolve
from kernel_hub.errors import KernelHubError, TrustError, VersionSpecError
from kernel_hub.publish.release import build_layout
from tests.client_env import point_at
from tests.hub_server import hub_env, hub_requests
from tests.toy_folder import TOY

TOKEN = "hostile-token"
SENTINEL = "sentinel: must survive"
EVIL_OPS = ("from pathlib import Path\nPath({path!r}).write_text('ran')\nFLAVOUR = 'evil'\n\n"
            "def scale(x, factor=2.0):\n    return x * 42\n")


# -- building hostile repos --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The members of a correct jax-cpu bundle of the toy kernel, as our publish builds it."""
    out = tmp_path_factory.mktemp("layout")
    build_layout(TOY, out)
    with tarfile.open(out / "build" / "jax-cpu.tar") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside every cache that absolute names in hostile repos point at."""
    path = tmp_path_factory.mktemp("outside") / "victim"
    path.mkdir()
    (path / "keep.txt").write_text(SENTINEL)
    return path


def meta_of(files: dict[str, bytes]) -> dict:
    return json.loads(files["metadata.json"])


def with_meta(files: dict[str, bytes], meta: dict) -> dict[str, bytes]:
    return {**files, "metadata.json": json.dumps(meta).encode()}


def resign(files: dict[str, bytes]) -> dict[str, bytes]:
    """Record a correct sha256 for every file, so only the check under test can catch the bundle."""
    meta = meta_of(files)
    meta["kernel-hub"]["sha256"] = {n: sha256(d).hexdigest() for n, d in files.items() if n != "metadata.json"}
    return with_meta(files, meta)


def tar_bytes(files: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buf.getvalue()


def push(server, repo: str, repo_files: dict[str, bytes], *, tag: str | None = "v1.0.0",
         branch: str | None = "v1") -> str:
    """One raw commit on main, then the release tag and major branch at it: no publish, no checks."""
    api = HfApi(endpoint=server.url, token=TOKEN)
    api.create_repo(repo, repo_type="kernel", exist_ok=True)
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=d) for p, d in repo_files.items()]
    commit = api.create_commit(repo, ops, commit_message="hostile", repo_type="kernel").oid
    if branch:
        api.create_branch(repo, branch=branch, revision=commit, repo_type="kernel", exist_ok=True)
    if tag:
        api.create_tag(repo, tag=tag, revision=commit, repo_type="kernel")
    return commit


def link(name: str, target: str, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def file_member(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 4
    return info


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[dict[str, bytes], Path], dict[str, bytes]]   # (good bundle members, victim) -> repo files
    needle: str


def bundle(files: dict[str, bytes], *extra: tarfile.TarInfo) -> dict[str, bytes]:
    return {"build/jax-cpu.tar": tar_bytes(files, extra)}


def _edited(files: dict[str, bytes], *keys: str, value: object) -> dict[str, bytes]:
    """The bundle with one field of metadata.json's kernel-hub section set to `value` (digests left as they are)."""
    meta = meta_of(files)
    section = meta["kernel-hub"]
    for key in keys[:-1]:
        section = section[key]
    section[keys[-1]] = value
    return bundle(with_meta(files, meta))


def _added(files: dict[str, bytes], name: str, data: bytes = b"print('hi')\n") -> dict[str, bytes]:
    return bundle(resign({**files, name: data}))


def _tampered(files: dict[str, bytes]) -> dict[str, bytes]:
    ops = files["toy_scale/ops.py"] + b"\nimport os  # injected after signing\n"
    return bundle({**files, "toy_scale/ops.py": ops})


def _bad_bundle_name(files: dict[str, bytes]) -> dict[str, bytes]:
    data = tar_bytes(files)
    return {"build/JAX-CPU.tar": data, "build/jax-cpu.x.tar": data, "build/9jax.tar": data, "build/x--y.tar": data}


CASES = [
    Case("metadata variant name absolute", lambda f, v: _edited(f, "variant", "name", value=str(v)),
         "is not a variant name"),
    Case("metadata variant name climbing", lambda f, v: _edited(f, "variant", "name", value="../../../../../victim"),
         "is not a variant name"),
    Case("metadata names another variant", lambda f, v: _edited(f, "variant", "name", value="jax-tpu"),
         "not the 'jax-cpu'"),
    Case("bundle names not variant names", lambda f, v: _bad_bundle_name(f), "fits this system"),
    Case("tar member climbing", lambda f, v: bundle(f, file_member("../../../../../victim/planted.py")),
         "bundle entry"),
    Case("tar member absolute", lambda f, v: bundle(f, file_member(str(v / "planted.py"))), "bundle entry"),
    Case("tar symlink member", lambda f, v: bundle(f, link("toy_scale/link.py", str(v / "keep.txt"))),
         "link or special file"),
    Case("tar hardlink member", lambda f, v: bundle(f, link("toy_scale/hard.py", str(v / "keep.txt"), hard=True)),
         "link or special file"),
    Case("pyc in bundle", lambda f, v: _added(f, "toy_scale/ops.pyc", b"\0" * 16), "bytecode"),
    Case("__pycache__ in bundle", lambda f, v: _added(f, "toy_scale/__pycache__/ops.cpython-311.pyc", b"\0" * 16),
         "bytecode"),
    Case("native module in bundle", lambda f, v: _added(f, "toy_scale/ops.cpython-311-x86_64-linux-gnu.so"),
         "native code"),
    Case("pth file in bundle", lambda f, v: _added(f, "toy_scale/evil.pth", b"import os\n"), "path hook"),
    Case("file outside the package", lambda f, v: _added(f, "evil.py"), "outside the package"),
    Case("tampered file", lambda f, v: _tampered(f), "tampered or corrupt"),
    Case("python_name climbing", lambda f, v: _edited(f, "python_name", value="../x"), "is not a Python identifier"),
    Case("entry climbing", lambda f, v: _edited(f, "variant", "entry", value="../evil.py"), "must be a .py file"),
    Case("digest key climbing", lambda f, v: _edited(f, "sha256", "../../victim/keep.txt", value="0" * 64),
         "relative path"),
    Case("metadata not JSON", lambda f, v: bundle({**f, "metadata.json": b"{not json"}), "not a kernel-hub build"),
]


@pytest.fixture(scope="module")
def repos(server, good_files, victim) -> dict[str, tuple[str, str]]:
    """case name -> (repo id, commit), each pushed once for the module."""
    out = {}
    for i, case in enumerate(CASES):
        repo = f"evil/case-{i}"
        out[case.name] = (repo, push(server, repo, case.make(good_files, victim)))
    return out


# -- one client environment per test ----------------------------------------------------------------------


@pytest.fixture
def env(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: Path) -> SimpleNamespace:
    """huggingface_hub pointed at the server, a fresh cache, a registry without these repos, a local victim
    where the climbing names land, and the CPU backend without importing jax."""
    cache = tmp_path / "cache"
    point_at(monkeypatch, server.url, cache)
    monkeypatch.setenv("KERNEL_HUB_BACKEND", "cpu")
    registry = tmp_path / "registry.yaml"
    registry.write_text("kernels: []\n")
    monkeypatch.setenv("KERNEL_HUB_REGISTRY", str(registry))
    near = tmp_path / "victim"   # where "../../../../../victim" from the cache's builds/<commit>/ lands
    near.mkdir()
    (near / "keep.txt").write_text(SENTINEL)
    return SimpleNamespace(cache=cache, tmp=tmp_path, victims=(victim, near), lockfile=tmp_path / "k.lock")


def outside_cache(env: SimpleNamespace) -> dict[str, bytes]:
    """Every file under the test's folder and the shared victim, except the cache."""
    files = {}
    for root in (env.tmp, env.victims[0].parent):
        for p in sorted(root.rglob("*")):
            if p.is_file() and env.cache not in p.parents:
                files[str(p)] = p.read_bytes()
    return files


def refused(how: str, repo: str, env: SimpleNamespace, capsys: pytest.CaptureFixture, *extra: str) -> str:
    """Run one entry point and return its single error line (asserting it is one line, not a traceback)."""
    if how == "get_kernel":
        with pytest.raises(KernelHubError) as exc:
            kh.get_kernel(repo, version=1, trust_remote_code=True)
        message = str(exc.value)
        assert "\n" not in message
        return message
    argv = {"download": ["download", repo, "--version", "1", *extra],
            "lock": ["lock", repo, "--version", "1", "-o", str(env.lockfile), *extra, "--trust-remote-code"]}[how]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("how", ["get_kernel", "download", "lock"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_repo_is_refused_in_one_line_and_touches_nothing(case: Case, how: str, repos, env, capsys) -> None:
    repo, commit = repos[case.name]
    before = outside_cache(env)
    message = refused(how, repo, env, capsys)
    assert case.needle in message, message
    assert outside_cache(env) == before  # sentinels intact, nothing planted, no lock file written
    for victim in env.victims:
        assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
        assert (victim / "keep.txt").read_text() == SENTINEL
    builds = list(env.cache.glob("kernels--*/kernel-hub/builds/*/*"))
    assert builds == []  # no build, no .partial or .trash left behind
    assert not [m for m in sys.modules if commit[:16] in m]  # nothing of it was imported


# -- bytecode planted in the cache --------------------------------------------------------------------------


def _plant_pyc(package: Path, sentinel: Path) -> Path:
    """Write __pycache__/ops.cpython-311.pyc from hostile source, stamped with ops.py's mtime and size, so that
    Python's own import would run it in place of the verified ops.py."""
    import importlib.util
    from importlib._bootstrap_external import _code_to_timestamp_pyc  # the stdlib's own .pyc writer

    ops = package / "ops.py"
    st = ops.stat()
    code = compile(EVIL_OPS.format(path=str(sentinel)), str(ops), "exec")
    pyc = Path(importlib.util.cache_from_source(str(ops)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(code, st.st_mtime, st.st_size)))
    return pyc


LOAD = """
import sys, numpy as np, kernel_hub as kh
kw = dict(lockfile=sys.argv[2]) if len(sys.argv) > 2 else dict(version=1)
m = kh.get_kernel(sys.argv[1], trust_remote_code=True, backend="cpu", **kw)
print(m.scale(np.ones(1), 2.0).tolist())
"""


@pytest.mark.parametrize("locked", [False, True], ids=["by-version", "with-lock-file"])
def test_pyc_planted_in_the_cache_never_runs(server, good_files, tmp_path: Path, locked: bool) -> None:
    repo = f"evil/planted-{int(locked)}"
    push(server, repo, bundle(good_files))
    cache, sentinel = tmp_path / "cache", tmp_path / "PWNED"
    env = hub_env(server, cache, KERNEL_HUB_BACKEND="cpu")
    args = [sys.executable, "-c", LOAD, repo] + ([str(tmp_path / "k.lock")] if locked else [])
    if locked:
        proc = subprocess.run([sys.executable, "-m", "kernel_hub.cli", "lock", repo, "--version", "1", "--backend",
                               "cpu", "-o", str(tmp_path / "k.lock"), "--trust", "evil"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stdout.strip() == "[2.0]", first.stderr
    package = next(cache.glob("kernels--evil--planted-*/kernel-hub/builds/*/jax-cpu/toy_scale"))
    pyc = _plant_pyc(package, sentinel)
    # Control: Python's own import of that folder does run the planted bytecode.
    control = subprocess.run([sys.executable, "-B", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import toy_scale.ops as o; print(o.scale(1))", str(package.parent)],
                             capture_output=True, text=True, timeout=60)
    assert control.stdout.strip() == "42" and sentinel.read_text() == "ran", control.stderr
    sentinel.unlink()
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == "[2.0]", again.stderr  # the verified source ran
    assert not sentinel.exists()
    assert not pyc.exists()  # the damaged cache copy was replaced from the cached bundle


# -- refs a hostile server returns ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_commits(server, good_files) -> tuple[str, str, str]:
    """evil/refs: `good` (v1, v1.0.0) and a later `evil` commit on main whose ops.py multiplies by 42."""
    repo = "evil/refs"
    good = push(server, repo, bundle(good_files))
    files = {**good_files, "toy_scale/ops.py": b"def scale(x, factor=2.0):\n    return x * 42\n"}
    evil = push(server, repo, bundle(resign(files)), tag=None, branch=None)
    return repo, good, evil


@pytest.fixture
def hostile_refs(two_commits, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server also returns a tag named exactly like the good commit but pointing at the evil one, refs named
    like options, and refs whose target is not a commit id."""
    from huggingface_hub.hf_api import GitRefInfo, GitRefs

    _repo, good, evil = two_commits
    real = HfApi.list_repo_refs

    def refs(self, repo_id, **kwargs):
        got = real(self, repo_id, **kwargs)
        tags = [GitRefInfo(name=n, ref=f"refs/tags/{n}", target_commit=c) for n, c in (
            (good, evil), ("--upload-pack=touch /tmp/x", evil), ("-v2.0.0", evil), ("v9.0.0", "../../victim"),
            ("v8.0.0", evil.upper()), ("v7.0.0", evil[:12]))]
        branches = [GitRefInfo(name="--force", ref="refs/heads/--force", target_commit=evil),
                    GitRefInfo(name="v3", ref="refs/heads/v3", target_commit="/etc/passwd")]
        return GitRefs(branches=got.branches + branches, converts=[], tags=got.tags + tags)

    monkeypatch.setattr(HfApi, "list_repo_refs", refs)


def test_a_commit_id_is_never_shadowed_by_a_tag_of_that_name(two_commits, hostile_refs, env) -> None:
    repo, good, _evil = two_commits
    module = kh.get_kernel(repo, revision=good, trust_remote_code=True)
    assert module.__kernel_hub__.commit == good
    assert module.scale(np.ones(1), 2.0).tolist() == [2.0]


def test_unsafe_refs_never_steer_a_version_spec(two_commits, hostile_refs, env) -> None:
    repo, good, _ = two_commits
    plan = kh.plan_load(repo, version=">=1", trust_remote_code=True)   # v9/v8/v7 point at no valid commit
    assert (plan.resolution.commit, plan.resolution.version) == (good, "1.0.0")
    with pytest.raises(VersionSpecError, match="no branch v3"):
        kh.plan_load(repo, version=3)


@pytest.mark.parametrize("revision", ["--force", "--upload-pack=touch /tmp/x", "-v2.0.0"])
def test_option_like_revisions_are_refused(two_commits, hostile_refs, env, capsys, revision: str) -> None:
    repo, _, _ = two_commits
    with pytest.raises(VersionSpecError):
        kh.get_kernel(repo, revision=revision, trust_remote_code=True)
    for argv in (["download", repo, f"--revision={revision}"],
                 ["lock", repo, f"--revision={revision}", "-o", str(env.lockfile), "--trust-remote-code"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not env.lockfile.exists()


def test_download_and_lock_by_commit_take_that_commit(two_commits, hostile_refs, env, capsys) -> None:
    repo, good, _ = two_commits
    assert cli.main(["download", repo, "--revision", good]) == 0
    assert "files     4 (sha256 checked)" in capsys.readouterr().out
    assert cli.main(["lock", repo, "--revision", good, "-o", str(env.lockfile), "--trust", "evil"]) == 0
    assert json.loads(env.lockfile.read_text())["kernels"][0]["commit"] == good
    info = cli.main(["info", repo])
    out = capsys.readouterr().out
    assert info == 0 and "--force" not in out and "upload-pack" not in out and good[:12] in out


def test_resolve_ignores_unsafe_refs_pure() -> None:
    good, evil = "a" * 40, "b" * 40
    refs = [Ref("v1.0.0", "tag", good), Ref("v1", "branch", good), Ref(good, "tag", evil), Ref("-x", "tag", evil),
            Ref("v5.0.0", "tag", "../x"), Ref("v4.0.0", "tag", evil.upper())]
    assert resolve(refs, revision=good).commit == good
    assert resolve(refs, version=">=1").commit == good
    with pytest.raises(VersionSpecError):
        resolve(refs, revision="-x")


# -- trust -------------------------------------------------------------------------------------------------


def test_untrusted_repo_is_refused_before_any_download(server, good_files, env, capsys) -> None:
    repo = "evil/untrusted"
    push(server, repo, bundle(good_files))
    server.reset()
    with pytest.raises(TrustError) as exc:
        kh.get_kernel(repo, version=1)
    assert "--trust-remote-code" in str(exc.value) and "\n" not in str(exc.value)
    assert [r[1] for r in hub_requests(server)] == [f"/api/kernels/{repo}/refs"]   # the refs only, no bundle
    assert cli.main(["lock", repo, "--version", "1", "-o", str(env.lockfile)]) == 1
    assert "--trust-remote-code" in capsys.readouterr().err and not env.lockfile.exists()
    with pytest.raises(TrustError):
        kh.get_kernel(repo, version=1, trust_remote_code=["other/repo", "evil-twin"])  # a list trusts what it names
    assert kh.get_kernel(repo, version=1, trust_remote_code=["evil"]).scale(np.ones(1), 2.0).tolist() == [2.0]
    assert cli.main(["download", repo, "--version", "1"]) == 0  # download imports nothing: no trust needed


def test_an_oversized_published_kernel_yaml_is_never_downloaded(server, good_files, tmp_path: Path) -> None:
    """`info` reads a release's root kernel.yaml before any build is cached; one over 1 MiB is skipped on its
    size alone (one HEAD), not downloaded and then measured."""
    from kernel_hub.sources.hub.source import HubSource

    repo = "evil/huge-yaml"
    commit = push(server, repo, {**bundle(good_files), "kernel.yaml": b"# padding\n" * (120 << 10)})
    server.reset()
    source = HubSource(endpoint=server.url, cache_dir=tmp_path / "cache")
    assert source.published_metadata(repo, commit) is None
    requests = [(method, path) for method, path, _ in hub_requests(server)]
    assert requests and all(method == "HEAD" for method, _ in requests), requests
    assert not list((tmp_path / "cache").rglob("kernel.yaml"))
