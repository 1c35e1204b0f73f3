"""The Hub's second dialect: repos in the layout kernel-builder publishes (`build/<variant>/` trees, noarch and arch
names, package / root / zip layouts, metadata.json digest, `v<N>` branches and no tags), loaded through the same
plan -> resolve -> variant -> fetch -> verify -> import path as our bundles, against `kernel-hub serve`."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")
torch = pytest.importorskip("torch")

from huggingface_hub import HfApi  # noqa: E402

from kernel_hub.api import load_plan, plan_load  # noqa: E402
from kernel_hub.errors import IntegrityError, KernelHubError, VersionSpecError  # noqa: E402
from kernel_hub.sources.hub.source import HubSource  # noqa: E402
from tests.hub_server import cli_command, hub_env, hub_requests, running_server  # noqa: E402
from tests.kernel_builder_repo import (  # noqa: E402
    arch_repo,
    here_arch,
    kernel_digest,
    publish,
    relu_files,
    write_variant,
)
from tests.toy_folder import TOY  # noqa: E402

TOKEN = "test-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    """One store with a repo per layout (all `v1` branches, no tags) and the broken ones."""
    root = tmp_path_factory.mktemp("kb")
    with running_server(root / "store", token=TOKEN) as srv:
        api = HfApi(endpoint=srv.url, token=TOKEN)
        write_variant(root / "pkg", "torch-cpu", "kb-relu", relu_files("package"))
        write_variant(root / "pkg", "torch-universal", "kb-relu", relu_files("root"), layout="root")
        publish(api, "acme/kb-relu", root / "pkg")
        write_variant(root / "root", "torch-universal", "kb-relu", relu_files("root"), layout="root")
        publish(api, "acme/kb-root", root / "root")
        write_variant(root / "zip", "torch-cpu", "kb-relu", relu_files("zip"), layout="zip")
        publish(api, "acme/kb-zip", root / "zip")
        publish(api, "acme/kb-arch", arch_repo(root / "arch"))
        write_variant(root / "nodigest", "torch-cpu", "kb-relu", relu_files("nodigest"), digest=False)
        publish(api, "acme/kb-nodigest", root / "nodigest")
        # tampered: a file changed after its digest was recorded; its code would leave a mark if it ever ran
        tampered = write_variant(root / "tampered", "torch-cpu", "kb-relu", relu_files("tampered"))
        (tampered / "kb_relu" / "_ops.py").write_text("import sys\nsys.modules['kb_tampered_ran'] = sys\n")
        publish(api, "acme/kb-tampered", root / "tampered")
        extra = write_variant(root / "extra", "torch-cpu", "kb-relu", relu_files("extra"))
        (extra / "kb_relu" / "sneaky.py").write_text("print('not in the digest')\n")
        publish(api, "acme/kb-extra", root / "extra")
        write_variant(root / "needs", "torch-cpu", "kb-relu", relu_files("needs"),
                      python_depends=("numpy", "kh-test-not-installed-pkg"))
        publish(api, "acme/kb-needs", root / "needs")
        dep = "from kernels import get_kernel_dep\n\nrelu = get_kernel_dep('acme/kb-relu').relu\n__all__ = ['relu']\n"
        write_variant(root / "deps", "torch-cpu", "kb-user", {"__init__.py": dep}, python_depends=("numpy",),
                      kernel_depends=({"repo-id": "acme/kb-relu", "version": 1},))
        publish(api, "acme/kb-deps", root / "deps")
        write_variant(root / "baddep", "torch-cpu", "kb-user", {"__init__.py": "__all__ = []\n"},
                      kernel_depends=({"repo-id": "acme/kb-absent", "version": 1},))
        publish(api, "acme/kb-baddep", root / "baddep")
        write_variant(root / "v2", "torch-cpu", "kb-relu", relu_files("v1"))
        publish(api, "acme/kb-majors", root / "v2")
        shutil.rmtree(root / "v2")
        write_variant(root / "v2", "torch-cpu", "kb-relu", relu_files("v2"), version=2)
        publish(api, "acme/kb-majors", root / "v2", branches=("v2",))
        srv.layouts = root  # the folders, for the digest cross-check
        yield srv


def _source(hub, cache: Path, offline: bool = False) -> HubSource:
    return HubSource(endpoint=hub.url, cache_dir=cache, offline=offline)


def _load(hub, cache: Path, repo: str, *, offline: bool = False, backend: str = "cpu", **kw):
    plan = plan_load(repo, framework="torch", backend=backend, source=_source(hub, cache, offline),
                     **({"version": 1} | kw))
    return plan, load_plan(plan, trust_remote_code=True)


def test_the_helpers_digest_is_kernels_own(hub) -> None:
    """tests/kernel_builder_repo.py hashes variants itself; HF kernels 0.19.1's hasher must agree, every layout."""
    from kernels._rust import Digest, DigestAlgorithm

    folders = [p.parent for p in Path(hub.layouts).glob("*/build/*/metadata.json")]
    assert len(folders) >= 12
    for folder in folders:
        assert kernel_digest(folder) == Digest.hash_variant(DigestAlgorithm.SHA256, folder).files, folder


@pytest.mark.parametrize(("repo", "variant", "marker"), [
    ("acme/kb-relu", "torch-cpu", "package"),          # build/V/<name>/, preferred over torch-universal here
    ("acme/kb-root", "torch-universal", "root"),       # the package at build/V/ itself
    ("acme/kb-zip", "torch-cpu", "zip"),               # build-layout zip: build/V/<id>.zip
    ("acme/kb-arch", here_arch(), here_arch()),        # the new-style arch name for this torch and CPU
    ("acme/kb-nodigest", "torch-cpu", "nodigest"),
])
def test_each_layout_loads_then_loads_offline_from_the_cache(hub, tmp_path: Path, repo, variant, marker) -> None:
    hub.reset()
    plan, module = _load(hub, tmp_path, repo)
    assert plan.choice.variant.name == variant and marker == module.VARIANT
    x = torch.linspace(-2, 2, 9)
    assert module.relu(x).numpy().tolist() == np.maximum(np.linspace(-2, 2, 9, dtype=np.float32), 0).tolist()
    listings = [r for r in hub_requests(hub) if "/tree/" in r[1]]
    assert listings == [("GET", f"/api/kernels/{repo}/tree/{plan.resolution.commit}/build", 200)]  # ONE per commit
    assert module.__kernel_hub__.variant == variant and module.__kernel_hub__.commit == plan.resolution.commit
    hub.reset()
    again = plan_load(repo, version=1, framework="torch", backend="cpu", source=_source(hub, tmp_path, True))
    build = again.download()
    assert hub_requests(hub) == [] and build.variant.name == variant and build.commit == plan.resolution.commit
    assert sorted(build.digests) == sorted(p.relative_to(build.package_dir).as_posix()
                                           for p in Path(build.package_dir).rglob("*") if p.is_file())


def test_arch_names_in_hf_kernels_order_and_every_variant_in_the_trace(hub, tmp_path: Path) -> None:
    plan, _ = _load(hub, tmp_path, "acme/kb-arch")
    trace = {d.variant: d for d in plan.choice.trace}
    assert len(trace) == 6
    accepted = {n for n, d in trace.items() if d.accepted}
    assert accepted == {here_arch(), here_arch(legacy=True), "torch-cpu"}
    other_cpu = here_arch(machine="aarch64" if platform.machine() != "aarch64" else "x86_64")
    assert trace[here_arch(-1)].reason.startswith("built for torch ")
    assert trace[other_cpu].reason.startswith("CPU ") and "torch-tpu" in trace and not trace["torch-tpu"].accepted
    text = plan.describe()
    assert all(name in text for name in trace) and "verify    sha256 (metadata.json digest)" in text
    # a simulated TPU: the arch (cpu) builds are rejected and the noarch torch-tpu build is chosen
    tpu, module = _load(hub, tmp_path, "acme/kb-arch", backend="tpu")
    assert tpu.choice.variant.name == "torch-tpu" and module.VARIANT == "torch-tpu"


def test_our_order_is_hf_kernels_order(hub) -> None:
    """Accepted variants, best first, as kernels 0.19.1's own resolver orders them for this system."""
    from kernels._internals.backends import CPU
    from kernels._internals.variants import _resolve_variant_for_system, parse_variant
    from packaging.version import Version

    from kernel_hub.decide.system import SystemFacts
    from kernel_hub.decide.variants import choose_variant
    from kernel_hub.sources.hub.builder import builder_variant

    names = [here_arch(), here_arch(legacy=True), here_arch(-1), "torch-cpu", "torch-universal", "torch-tpu",
             here_arch().replace("cpython-3.11", "cpython-3.10"), here_arch().replace("-cxx11", ""),
             here_arch().replace("cpython-3.11", "cpython-3.12")]
    major, minor = torch.__version__.split(".")[:2]
    ours = SystemFacts(backend="cpu", torch_version=torch.__version__, python_version="3.11.9",
                       machine=platform.machine(), os_name="linux", torch_cxx11_abi=True)
    hf, _ = _resolve_variant_for_system([parse_variant(n) for n in names], selected_backend=CPU(),
                                        cpu=platform.machine(), os="linux", torch_version=Version(f"{major}.{minor}"),
                                        torch_cxx11_abi=True, tvm_ffi_version=None, python_version=Version("3.11"))
    hf_order = [v.variant_str for v in hf]
    remaining = [builder_variant(n) for n in names]
    our_order = []
    while (choice := choose_variant(remaining, ours, "torch")).variant is not None:
        our_order.append(choice.variant.name)
        remaining = [v for v in remaining if v.name != choice.variant.name]
    assert our_order == hf_order


def test_a_tampered_file_is_refused_before_anything_imports(hub, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match=r"file kb_relu/_ops\.py does not match metadata\.json's digest"):
        _load(hub, tmp_path, "acme/kb-tampered")
    assert "kb_tampered_ran" not in sys.modules
    builds = tmp_path / "kernels--acme--kb-tampered" / "kernel-hub" / "builds"
    assert not [p for p in builds.rglob("*.py")] if builds.exists() else True


def test_a_file_not_in_the_digest_is_refused_naming_it(hub, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match=r"file kb_relu/sneaky\.py is not in metadata\.json's digest"):
        _load(hub, tmp_path, "acme/kb-extra")


def test_without_a_digest_the_git_blob_ids_check_and_it_says_so(hub, tmp_path: Path) -> None:
    plan, module = _load(hub, tmp_path, "acme/kb-nodigest")
    assert "verify    no digest" in plan.describe()
    assert module.__kernel_hub__.verified.startswith("no digest")
    from kernel_hub.layers.load import kernel_info  # the kernelize report's row for this kernel says it too

    assert kernel_info(module, "cpu", "torch")["variant"] == "torch-cpu (no digest)"
    _, signed = _load(hub, tmp_path, "acme/kb-relu")
    assert kernel_info(signed, "cpu", "torch")["variant"] == signed.__kernel_hub__.variant  # a digest: no mark
    # a corrupted copy in the Hub cache (the build unpacked from it gone): offline, refused naming the file
    shutil.rmtree(tmp_path / "kernels--acme--kb-nodigest" / "kernel-hub" / "builds")
    blob = next(p for p in (tmp_path / "kernels--acme--kb-nodigest" / "snapshots").rglob("_ops.py")).resolve()
    blob.write_text(blob.read_text() + "\nraise SystemExit('ran')\n")
    with pytest.raises(IntegrityError, match=r"file build/torch-cpu/kb_relu/_ops\.py does not match the Hub listing"):
        plan_load("acme/kb-nodigest", version=1, framework="torch", backend="cpu",
                  source=_source(hub, tmp_path, True)).download()


def test_versions_are_branches_and_a_spec_names_them(hub, tmp_path: Path) -> None:
    plan, module = _load(hub, tmp_path, "acme/kb-majors", version=2)
    assert plan.resolution.ref == "v2" and module.VARIANT == "v2"
    with pytest.raises(VersionSpecError, match=r"'>=1' is a PEP 440 spec over release tags, and this repo has none "
                                               r"\(branches: main, v1, v2\)"):
        plan_load("acme/kb-majors", version=">=1", framework="torch", backend="cpu", source=_source(hub, tmp_path))
    newest = plan_load("acme/kb-majors", version=">=0", framework="torch", backend="cpu",
                       source=_source(hub, tmp_path))
    assert newest.resolution.ref == "v2" and "newest major branch v2" in newest.resolution.reason
    by_ref = plan_load("acme/kb-majors", revision="v1", framework="torch", backend="cpu",
                       source=_source(hub, tmp_path))
    assert by_ref.resolution.ref == "v1" and by_ref.resolution.commit != plan.resolution.commit


def test_kernelize_loads_a_repo_named_without_a_version_through_its_loader(hub, tmp_path, monkeypatch) -> None:
    """layers/load.py (kernelize's loader) on a mapping value with no version: the newest major branch."""
    from kernel_hub.layers.load import load
    from kernel_hub.layers.plan import repo_spec
    from kernel_hub.load.trust import TrustPolicy

    monkeypatch.setattr(HubSource, "for_repo", classmethod(lambda cls, repo_id, registry_entry=None: cls(
        endpoint=hub.url, cache_dir=tmp_path)))
    module, repo = load(repo_spec("acme/kb-majors", "moe_experts", TrustPolicy(everything=True)), "cpu")
    assert repo == "acme/kb-majors" and module.VARIANT == "v2" and module.__kernel_hub__.variant == "torch-cpu"


def test_python_depends_missing_is_one_error_naming_it(hub, tmp_path: Path) -> None:
    with pytest.raises(KernelHubError, match="needs the Python package kh-test-not-installed-pkg") as info:
        _load(hub, tmp_path, "acme/kb-needs")
    assert "numpy" not in str(info.value) and len(str(info.value).splitlines()) == 1


def test_kernel_depends_load_through_the_same_path(hub, tmp_path: Path) -> None:
    _, module = _load(hub, tmp_path, "acme/kb-deps")
    dep = module.__kernel_deps__["acme/kb-relu"]
    assert dep.__kernel_hub__.repo_id == "acme/kb-relu" and dep.VARIANT == "package"
    assert module.relu is dep.relu  # the kernel asked HF kernels' get_kernel_dep while it imported
    with pytest.raises(KernelHubError, match=r"kernel-depends acme/kb-absent \(version 1\) did not load: .*no such"):
        _load(hub, tmp_path, "acme/kb-baddep")
    untrusted = plan_load("acme/kb-deps", version=1, framework="torch", backend="cpu",
                          source=_source(hub, tmp_path))
    with pytest.raises(KernelHubError, match="acme/kb-relu .*not trusted"):
        load_plan(untrusted, trust_remote_code=["acme/kb-deps"])  # the dependency passes the trust check too


def test_lock_records_commit_variant_and_sha256_and_loads_offline(hub, tmp_path: Path) -> None:
    from kernel_hub.load.lock import LockFile, fetch_entry, lock_one
    from kernel_hub.load.trust import TrustPolicy

    entry = lock_one("acme/kb-zip", version=1, framework="torch", backend="cpu", source=_source(hub, tmp_path),
                     trust=TrustPolicy(everything=True))
    assert entry.variant["name"] == "torch-cpu" and entry.variant["dialect"] == "kernel-builder"
    assert set(entry.files) == {"__init__.py", "_ops.py"} and len(entry.commit) == 40
    path = tmp_path / "kernels.lock"
    LockFile([entry]).write(path)
    from kernel_hub.load.lock import read_lock

    back = read_lock(path).find("acme/kb-zip")
    build = fetch_entry(back, _source(hub, tmp_path, offline=True))
    assert build.variant.dialect == "kernel-builder" and dict(build.digests) == entry.files
    ops = Path(build.package_dir) / "_ops.py"
    ops.write_text(ops.read_text() + "\n# changed\n")  # the unpacked copy damaged: rebuilt from the checked zip
    again = fetch_entry(back, _source(hub, tmp_path, offline=True))
    assert dict(again.digests) == entry.files and "# changed" not in ops.read_text()
    from dataclasses import replace

    wrong = replace(back, files={**back.files, "_ops.py": "0" * 64})
    with pytest.raises(IntegrityError, match="file _ops.py differs from the lock"):
        fetch_entry(wrong, _source(hub, tmp_path, offline=True))


def _cli(hub, cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, timeout=120,
                          env=hub_env(hub, cache, PYTHONPATH=str(ROOT / "src")))


def test_cli_resolve_info_download_and_list_read_both_dialects(hub, tmp_path: Path) -> None:
    resolved = _cli(hub, tmp_path, "resolve", "acme/kb-arch", "--version", "1", "--framework", "torch",
                    "--backend", "cpu")
    assert resolved.returncode == 0, resolved.stderr
    lines = resolved.stdout.splitlines()
    names = {here_arch(), here_arch(legacy=True), here_arch(-1), "torch-cpu", "torch-tpu"}
    assert all(any(ln.split()[1:2] == [n] for ln in lines) for n in names), resolved.stdout
    assert f"chosen    {here_arch()}" in lines and "verify    sha256 (metadata.json digest)" in lines
    info = _cli(hub, tmp_path, "info", "acme/kb-nodigest")
    assert info.returncode == 0 and "[kernel-builder: no digest" in info.stdout, info.stdout + info.stderr
    down = _cli(hub, tmp_path, "download", "acme/kb-zip", "--version", "1", "--framework", "torch", "--backend",
                "cpu", "--json")
    assert down.returncode == 0, down.stderr
    got = json.loads(down.stdout)
    assert got["variant"] == "torch-cpu" and got["verification"] == "sha256 (metadata.json digest)"
    listed = _cli(hub, tmp_path, "list", "--hub", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {"acme/kb-arch", "acme/kb-zip", "acme/kb-root"} <= {r["repo_id"] for r in json.loads(listed.stdout)["repos"]}


def test_hf_kernels_loads_the_helpers_repos_and_picks_what_we_pick(hub, tmp_path: Path) -> None:
    """The helper writes the real layout: HF kernels 0.19.1 loads every layout from the same server, and on the
    arch repo chooses the variant kernel-hub chose."""
    script = ("import json, sys\nfrom kernels import get_kernel\n"
              "print(json.dumps({r: get_kernel(r, version=1, trust_remote_code=True).VARIANT for r in sys.argv[1:]}))")
    repos = ["acme/kb-relu", "acme/kb-root", "acme/kb-zip", "acme/kb-arch"]
    done = subprocess.run([sys.executable, "-c", script, *repos], capture_output=True, text=True, timeout=180,
                          env=hub_env(hub, tmp_path / "hf"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "acme/kb-relu": "package", "acme/kb-root": "root", "acme/kb-zip": "zip", "acme/kb-arch": here_arch()}


def test_hostile_trees_are_refused_naming_what(tmp_path: Path) -> None:
    """A zip escaping its folder, native code, a malformed digest or name: one error each, nothing written."""
    import io
    import zipfile

    from kernel_hub.errors import UnsafeNameError
    from kernel_hub.sources.hub.builder import missing_python_depends, parse_builder_metadata, unzip_package

    def zipped(name: str) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as archive:
            archive.writestr("__init__.py", "")
            archive.writestr(name, "x")
        return buf.getvalue()

    with pytest.raises(UnsafeNameError, match=r"\.\./evil\.py"):
        unzip_package(zipped("../evil.py"), "t")
    with pytest.raises(IntegrityError, match=r"_C\.abi3\.so is native code"):
        unzip_package(zipped("_C.abi3.so"), "t")
    assert set(unzip_package(zipped("sub/x.py"), "t")) == {"__init__.py", "sub/x.py"}
    base = {"name": "kb-relu", "id": "x", "version": 1, "license": "MIT", "backend": {"type": "cpu"}}
    with pytest.raises(IntegrityError, match="digest of file a.py is not a base64 sha256"):
        parse_builder_metadata(json.dumps(base | {"digest": {"algorithm": "sha256", "files": {"a.py": "zz"}}})
                               .encode(), "t")
    with pytest.raises(UnsafeNameError):
        parse_builder_metadata(json.dumps(base | {"digest": {"algorithm": "sha256", "files": {"../a": "A" * 44}}})
                               .encode(), "t")
    with pytest.raises(KernelHubError, match="is not a kernel name"):
        parse_builder_metadata(json.dumps(base | {"name": "../x"}).encode(), "t")
    with pytest.raises(KernelHubError, match="build-layout must be"):
        parse_builder_metadata(json.dumps(base | {"build-layout": "tar"}).encode(), "t")
    meta = parse_builder_metadata(json.dumps(base | {"kernel-depends": [{"repo-id": "a/b", "revision": "v2"}],
                                                     "kernels-minver": "0.19.1"}).encode(), "t")
    assert meta.kernel_depends == (("a/b", "revision", "v2"),) and meta.kernels_minver == "0.19.1"
    assert meta.digest is None and meta.layout == "files" and meta.python_name == "kb_relu"
    have = {"einops": "0.8.0"}.get
    assert missing_python_depends(("einops>=0.7",), have) is None
    assert missing_python_depends(("einops>=0.9",), have) == "needs einops>=0.9 (python-depends), have einops 0.8.0"
    assert "pip install helion" in missing_python_depends(("einops", "helion"), have)


def test_a_native_extension_in_an_arch_build_is_refused_before_import(hub, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.url, token=TOKEN)
    folder = write_variant(tmp_path / "native", here_arch(), "kb-relu", relu_files("native"))
    (folder / "kb_relu" / "_ops.abi3.so").write_bytes(b"\x7fELF not really")
    write_variant(tmp_path / "native", "torch-cpu", "kb-relu", relu_files("noarch"))
    # the digest must cover the .so too (kernel-builder's would): rewrite the metadata
    meta = json.loads((folder / "metadata.json").read_text())
    meta["digest"]["files"] = kernel_digest(folder)
    (folder / "metadata.json").write_text(json.dumps(meta))
    publish(api, "acme/kb-native", tmp_path / "native")
    with pytest.raises(IntegrityError, match=r"_ops\.abi3\.so is native code"):
        _load(hub, tmp_path / "cache", "acme/kb-native")


@pytest.mark.parametrize("name", [
    "torch-cpu", "torch-tpu", "torch-universal", "torch-cuda",
    "torch-2.13-cxx11-cpu-cpython-3.11-abi3-x86_64-linux", "torch-2.13-cpu-cpython-3.12-abi3-aarch64-linux",
    "torch-2.9-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux", "torch-2.10-cxx98-rocm-6.4-cpython-3.10-abi3-x86_64-"
    "linux", "torch213-cxx11-cpu-x86_64-linux", "torch28-cxx11-cu128-x86_64-linux", "torch27-rocm63-x86_64-linux",
    "torch29-rocm714-x86_64-linux", "torch27-xpu20251-x86_64-linux",
])
def test_names_read_as_hf_kernels_reads_them(name: str) -> None:
    from kernels._internals.variants import ArchVariant, parse_variant

    from kernel_hub.decide.builder_names import parse_builder_name

    ours, theirs = parse_builder_name(name), parse_variant(name)
    assert ours is not None and (ours.kind == "noarch") == (not isinstance(theirs, ArchVariant))
    if isinstance(theirs, ArchVariant):
        assert ours.torch == (theirs.framework.version.major, theirs.framework.version.minor)
        assert ours.cxx11 == theirs.framework.cxx11_abi and ours.abi == theirs.python.abi
        assert ours.python == (theirs.python.version.major, theirs.python.version.minor)
        assert (ours.cpu, ours.os) == (theirs.system.platform, theirs.system.os)
        assert ours.backend == theirs.backend.name
        version = getattr(theirs.backend, "version", None)
        assert ours.backend_version == ((version.major, version.minor) if version else None)
    else:
        assert ours.backend == theirs.backend.backend_name


@pytest.mark.parametrize("name", ["torch", "torch-2.13-cpu-x86_64-linux", "jax-cpu", "torch-2.13-cpu-cpython-3.11-abi9"
                                  "-x86_64-linux", "sdk-cpu", "tvm-ffi01-cpu-x86_64-linux"])
def test_names_outside_both_torch_schemes_are_not_read(name: str) -> None:
    from kernel_hub.decide.builder_names import parse_builder_name

    assert parse_builder_name(name) is None




def test_a_tree_beside_an_older_bundle_loads_what_hf_kernels_loads(hub, tmp_path: Path) -> None:
    """One commit holds a stale `build/torch-cpu.tar` (kernel-hub's toy 1.2.0) and a kernel-builder `build/torch-cpu/`
    tree (v2): HF kernels 0.19.1 reads the tree, and so does get_kernel(version=2). Our own publish's bundle and
    tree of one build still load from the bundle."""
    from kernel_hub.publish.release import build_layout

    api = HfApi(endpoint=hub.url, token=TOKEN)
    ours = tmp_path / "ours"
    build_layout(TOY, ours)
    mixed = tmp_path / "mixed"
    write_variant(mixed, "torch-cpu", "kb-relu", relu_files("tree-v2"), version=2)
    shutil.copy(ours / "build" / "torch-cpu.tar", mixed / "build" / "torch-cpu.tar")
    publish(api, "acme/kb-mixed", mixed, branches=("v2",))
    _, module = _load(hub, tmp_path / "cache", "acme/kb-mixed", version=2)
    assert module.VARIANT == "tree-v2" and module.__kernel_hub__.verified == "sha256 (metadata.json digest)"
    x = torch.linspace(-1, 1, 5)
    assert module.relu(x).numpy().tolist() == np.maximum(np.linspace(-1, 1, 5, dtype=np.float32), 0).tolist()
    replan = plan_load("acme/kb-mixed", version=2, framework="torch", backend="cpu",
                       source=_source(hub, tmp_path / "cache"))
    again = replan.download()  # from the cache: still the tree, and `resolve` says so
    assert again.verified == "sha256 (metadata.json digest)" and (Path(again.package_dir) / "_ops.py").is_file()
    assert "verify    sha256 (metadata.json digest) (cached)" in replan.describe()
    script = ("import json, sys\nfrom kernels import get_kernel\n"
              "print(json.dumps(get_kernel('acme/kb-mixed', version=2, trust_remote_code=True).VARIANT))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env=hub_env(hub, tmp_path / "hf"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == module.VARIANT
    publish(api, "acme/kb-ours", ours)  # bundle and tree of one build, as kernel-hub publishes them
    _, toy = _load(hub, tmp_path / "cache", "acme/kb-ours")
    assert toy.__kernel_hub__.verified == "sha256 (bundle metadata)" and toy.__kernel_hub__.version == "1.2.0"


def test_a_tree_build_over_the_cap_is_refused_from_the_listing(hub, tmp_path: Path, monkeypatch) -> None:
    """Four 96 KiB files under a 256 KiB cap per build: each file fits, the build does not; refused from the
    listing's sizes, before any of them is downloaded, with nothing left in the cache's builds."""
    import os

    api = HfApi(endpoint=hub.url, token=TOKEN)
    files = relu_files("big") | {f"blob{i}.py": "#" + os.urandom(48 << 10).hex() + "\n" for i in range(4)}
    write_variant(tmp_path / "big", "torch-cpu", "kb-relu", files)
    publish(api, "acme/kb-big", tmp_path / "big")
    monkeypatch.setenv("KERNEL_HUB_MAX_DOWNLOAD_BYTES", str(256 << 10))
    hub.reset()
    with pytest.raises(IntegrityError, match=r"over the 262144-byte cap on one build \(KERNEL_HUB_MAX_DOWNLOAD_BYTES"):
        _load(hub, tmp_path / "cache", "acme/kb-big")
    fetched = [p for m, p, _ in hub_requests(hub) if m == "GET" and "/resolve/" in p]
    assert fetched and all(p.endswith("/metadata.json") for p in fetched), fetched
    builds = tmp_path / "cache" / "kernels--acme--kb-big" / "kernel-hub" / "builds"
    assert not [p for p in builds.rglob("*") if p.is_file()] if builds.exists() else True


def test_an_oversized_metadata_json_is_never_downloaded(hub, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.url, token=TOKEN)
    folder = write_variant(tmp_path / "fat", "torch-cpu", "kb-relu", relu_files("fat"))
    meta = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps(meta | {"padding": " " * (2 << 20)}))
    publish(api, "acme/kb-fatmeta", tmp_path / "fat")
    hub.reset()
    with pytest.raises(IntegrityError, match="metadata.json is 2"):
        _load(hub, tmp_path / "cache", "acme/kb-fatmeta")
    assert not [p for m, p, _ in hub_requests(hub) if m == "GET" and p.endswith("/metadata.json")]
