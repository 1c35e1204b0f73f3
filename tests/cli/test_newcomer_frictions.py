"""Frictions a newcomer met: `info` on a Hub repo shows each variant's requirements before any build is cached; a
kernel.yaml with several problems names every one; `--version v1` hints that the major branch is the int 1;
`resolve --tpu-generation` without `--backend` implies tpu and says so."""

from __future__ import annotations

import json

import pytest

from kernel_hub import cli
from kernel_hub.decide.versions import resolve
from kernel_hub.errors import KernelHubError, MetadataError, VersionSpecError
from kernel_hub.package.metadata import parse_metadata
from kernel_hub.sources.base import Ref
from tests.client_env import point_at
from tests.hub_server import running_server

TOKEN = "test-token"


def test_info_on_a_hub_repo_shows_requirements_before_the_build_is_cached(tmp_path, toy_kernel, monkeypatch,
                                                                            capsys):
    from kernel_hub.publish.release import publish

    with running_server(tmp_path / "store", token=TOKEN) as srv:
        publish(toy_kernel, repo_id="test-org/toy-scale", endpoint=srv.url, token=TOKEN, skip_validation=True,
                skip_tpu_compile=True, log=lambda _: None)
        point_at(monkeypatch, srv.url, tmp_path / "fresh-cache")  # nothing of the repo cached
        assert cli.main(["info", "test-org/toy-scale", "--json"]) == 0
    variants = {v["name"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    # kernel.yaml's requires (tests/fixtures/toy_kernel), as the published metadata.json carries them
    assert variants["torch-cpu"]["requires"] == [["torch", ">=2.0"]]
    assert variants["jax-cpu"]["requires"] == [["jax", ">=0.10"]]
    assert variants["jax-tpu"]["tpu_generations"] == ["v5e", "v6e"]


def test_a_kernel_yaml_with_two_problems_names_both():
    data = {"name": "x", "repo_id": "org/x", "version": "1.0.0", "python_name": "x", "colour": "red",
            "variants": [{"name": "jax-cpu", "framework": "jax", "backend": "cpu", "shape": "round"}]}
    with pytest.raises(MetadataError) as err:
        parse_metadata(data, "kernel.yaml")
    text = str(err.value)
    assert "'colour'" in text and "'variants[0].shape'" in text and "more problem" not in text
    assert "\n" not in text


def test_many_problems_name_five_then_count():
    data = {"name": "x", "repo_id": "org/x", "version": "1.0.0", "python_name": "x",
            **{f"extra{i}": 1 for i in range(7)}, "variants": [{"name": "jax-cpu", "framework": "jax",
                                                                 "backend": "cpu"}]}
    with pytest.raises(MetadataError, match=r"\(and 2 more problems\)") as err:
        parse_metadata(data, "kernel.yaml")
    assert sum(f"'extra{i}'" in str(err.value) for i in range(7)) == 5


REFS = [Ref("v1.2.0", "tag", "a" * 40), Ref("v1", "branch", "a" * 40)]


def test_version_v1_hints_at_the_major_branch():
    with pytest.raises(VersionSpecError, match=r"major branch v1 pass the int 1 \(--version 1"):
        resolve(REFS, version="v1")
    assert resolve(REFS, version=1).ref == "v1"
    with pytest.raises(VersionSpecError) as err:
        resolve(REFS, version="2.0.0")
    assert "major branch" not in str(err.value)


def test_tpu_generation_implies_the_tpu_backend(capsys):
    assert cli.simulated_backend(None, "v5e") == ("tpu", "--tpu-generation v5e implies --backend tpu")
    assert cli.simulated_backend("tpu", "v5e") == ("tpu", "")
    assert cli.simulated_backend("cpu", None) == ("cpu", "")
    with pytest.raises(KernelHubError, match="--backend is cpu"):
        cli.simulated_backend("cpu", "v5e")
    assert cli.main(["resolve", "kernel-hub/ragged-dot-tpu", "--tpu-generation", "v5e", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["system"]["backend"] == "tpu" and data["system"]["tpu_generation"] == "v5e"
    assert data["chosen"] == "jax-tpu" and "implies --backend tpu" in captured.err
