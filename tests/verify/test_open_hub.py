"""An open hub, in-process: a kernel folder needs nothing beside it (vendored from kernel-hub's own _common, with
the same digests), kernelize's mapping names any repo, and a server lists an organisation's kernel repos."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.errors import KernelHubError, MetadataError, TrustError
from kernel_hub.package.metadata import load_metadata
from kernel_hub.package.vendoring import assembled_files, common_dir, file_digests, shipped_common
from kernel_hub.publish.release import build_layout

ROOT = Path(__file__).resolve().parents[2]
PALLAS = ROOT / "kernels" / "pallas"


def test_a_copied_kernel_folder_vendors_from_the_shipped_common_with_the_same_digests(tmp_path):
    copy = tmp_path / "elsewhere" / "ragged_dot"
    shutil.copytree(PALLAS / "ragged_dot", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    assert common_dir(copy) == shipped_common() == PALLAS / "_common"  # the checkout's copy (editable install)
    meta = load_metadata(copy)
    assert file_digests(assembled_files(copy, meta)) == file_digests(assembled_files(PALLAS / "ragged_dot", meta))
    ours = build_layout(PALLAS / "ragged_dot", tmp_path / "a").blob_ids("build/")
    theirs = build_layout(copy, tmp_path / "b").blob_ids("build/")
    assert ours == theirs and any("/_vendor/dispatch.py" in p for p in ours)


def test_a_common_folder_beside_the_kernel_wins_and_a_missing_file_names_it(tmp_path):
    copy = tmp_path / "ragged_dot"
    shutil.copytree(PALLAS / "ragged_dot", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    (tmp_path / "_common").mkdir()  # the author's own shared folder, without the files kernel.yaml vendors
    (tmp_path / "_common" / "__init__.py").write_text("")
    assert common_dir(copy) == tmp_path / "_common"
    with pytest.raises(MetadataError, match=r"arrays.py is not a file in .*_common"):
        assembled_files(copy)


def test_with_nothing_shipped_the_error_names_the_folder_beside(tmp_path):
    package = tmp_path / "site" / "kernel_hub"  # an install with no embedded kernels and no checkout around it
    package.mkdir(parents=True)
    assert shipped_common(package) is None
    assert common_dir(tmp_path / "k", package) == (tmp_path / "_common").resolve()


def test_the_wheel_layout_wins_over_a_checkout(tmp_path):
    package = tmp_path / "site" / "kernel_hub"
    embedded = package / "_embedded" / "kernels" / "pallas" / "_common"
    embedded.mkdir(parents=True)
    (embedded / "__init__.py").write_text("")
    assert shipped_common(package) == embedded


def test_mapping_values_name_any_repo():
    from kernel_hub.layers.kinds import BUILTIN_KINDS
    from kernel_hub.layers.plan import NEWEST_RELEASE, RepoSpec, kernel_specs, repo_spec
    from kernel_hub.load.trust import TrustPolicy

    def _kernel_spec(*args):  # the mapping checked against the built-in kinds, as kernelize hands them down
        return kernel_specs(*args, kinds=BUILTIN_KINDS)

    assert repo_spec("acme/ragged-dot-tpu", "moe_experts") == RepoSpec("acme/ragged-dot-tpu", NEWEST_RELEASE)
    assert repo_spec("kernel-hub/ragged-dot-tpu", "moe_experts").version is None  # the registry's default spec
    acme, everything = TrustPolicy(named=("acme",)), TrustPolicy(everything=True)
    spec = repo_spec({"repo_id": "acme/x", "revision": "v2"}, "moe_experts", acme)
    assert spec == RepoSpec("acme/x", None, "v2", acme)
    own = repo_spec({"repo_id": "acme/x", "version": 1, "trust_remote_code": ["acme/x"]}, "moe_experts", everything)
    assert own.trust == TrustPolicy(named=("acme/x",))  # a value's own setting wins over kernelize's
    specs = _kernel_spec({"moe_experts": {"repo_id": "acme/x", "version": 1}, "attention": {"cpu": "acme/y"}}, "cpu",
                         everything)
    assert specs["moe_experts"] == RepoSpec("acme/x", 1, None, everything)
    assert specs["attention"] == RepoSpec("acme/y", NEWEST_RELEASE, None, everything)
    with pytest.raises(KernelHubError, match="repo_id"):
        _kernel_spec({"moe_experts": {"repo_id": "acme/x", "tag": "v1"}}, "cpu")
    with pytest.raises(KernelHubError, match="ORG/NAME"):
        _kernel_spec({"moe_experts": "not a repo"}, "cpu")
    with pytest.raises(TrustError, match="trust_remote_code entry"):  # refused with the mapping, before any load
        _kernel_spec({"moe_experts": {"repo_id": "acme/x", "version": 1, "trust_remote_code": ["../x"]}}, "cpu")


def test_kernelize_keeps_the_layers_when_a_mapped_repo_cannot_load():
    """(Trust with a reachable repo: tests/package/test_wheel.py::test_open_hub_flow_from_the_wheel.)"""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import kernel_hub as kh
    from kernel_hub.report.models import tiny_model

    model = tiny_model("qwen3_moe")
    ids = torch.randint(3, 120, (1, 5), generator=torch.Generator().manual_seed(0))
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": "acme/ragged-dot-tpu", "attention": None, "rms_norm": None}))
    assert not report.replaced and report.kept
    assert all("acme/ragged-dot-tpu did not load" in k.reason for k in report.kept), report
    with torch.no_grad():
        model(ids)  # still runs, unchanged


def test_list_hub_lists_an_organisations_kernel_repos(tmp_path, capsys):
    pytest.importorskip("uvicorn")
    from huggingface_hub import HfApi

    from tests.hub_server import running_server

    with running_server(tmp_path / "store") as server:
        for repo in ("acme/toy", "acme/toy-two", "other/toy"):
            done = subprocess.run([sys.executable, "-m", "kernel_hub.cli", "publish", str(ROOT / "tests" / "fixtures"
                                   / "toy_kernel"), "--repo", repo, "--endpoint", server.url, "--token", "test-token",
                                   "--skip-validation", "--skip-tpu-compile"], capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
        assert cli.main(["list", "--hub", "acme", "--endpoint", server.url]) == 0
        rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
        assert rows == ["acme/toy", "acme/toy-two"]
        assert sorted(m.id for m in HfApi(endpoint=server.url).list_models(author="other")) == ["other/toy"]
        assert cli.main(["list", "--hub", "nobody", "--endpoint", server.url]) == 0
        assert "no kernel repos" in capsys.readouterr().out
        assert cli.main(["list", "--hub", "a/b", "--endpoint", server.url]) == 1
        assert "organisation" in capsys.readouterr().err


MINIMAL_YAML = """name: twice
repo_id: acme/twice
version: 1.0.0
python_name: twice
variants:
  - name: jax-cpu
    framework: jax
    backend: cpu
    requires: {jax: ">=0.10"}
"""
MINIMAL_INIT = '''import jax.numpy as jnp


def twice(x, y):
    return (2 * x.astype(jnp.float32) + y.astype(jnp.float32){bug}).astype(x.dtype)


REFERENCE = ("twice", lambda x, y: 2 * x + y)
CASE_SHAPES = [{{"x": (8, 16), "y": (8, 16)}}, {{"x": (0, 3), "y": (0, 3)}}]
'''


def _minimal(root: Path, bug: str = "") -> Path:
    folder = root / "twice"
    (folder / "twice").mkdir(parents=True)
    (folder / "kernel.yaml").write_text(MINIMAL_YAML)
    (folder / "twice" / "__init__.py").write_text(MINIMAL_INIT.format(bug=bug))
    return folder


def test_a_kernel_with_one_implementation_and_no_cases_module_gets_the_defaults(tmp_path, monkeypatch):
    import kernel_hub as kh
    from kernel_hub.verify.contract import KernelEntry

    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "cache"))
    module = kh.get_local_kernel(_minimal(tmp_path / "ok"), backend="cpu")
    assert isinstance(module, KernelEntry) and module.IMPLEMENTATIONS == ("default",)
    assert module.resolve_implementation("cpu")[0] == "default"
    with pytest.raises(ValueError, match="unknown implementation 'pallas'; known: default"):
        module.resolve_implementation("cpu", "pallas")
    report = kh.validate(module, backend="cpu")
    assert report.passed and len(report.cases) == 4, str(report)  # two shape sets x f32, bf16
    wrong = kh.get_local_kernel(_minimal(tmp_path / "bug", bug=" + 0.5"), backend="cpu")
    failed = kh.validate(wrong, backend="cpu")
    # the empty pair passes whatever the kernel computes
    assert not failed.passed and [c.passed for c in failed.cases] == [False, False, True, True], str(failed)
