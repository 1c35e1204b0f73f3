"""kernel.yaml and registry.yaml through strict schemas: unknown keys, unsafe names, bad versions, specifiers,
frameworks, backends and TPU generations are refused with one line naming the file and the field to fix."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from kernel_hub.decide.system import _TPU_KINDS
from kernel_hub.errors import MetadataError
from kernel_hub.load.registry import load_registry, parse_registry
from kernel_hub.package.metadata import TPU_GENERATIONS, load_metadata, parse_metadata, read_yaml
from kernel_hub.publish.release import build_layout
from tests.toy_folder import TOY

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIRS = sorted(p.parent for p in (ROOT / "kernels" / "pallas").glob("*/kernel.yaml"))


@pytest.mark.parametrize("kernel_dir", [*KERNEL_DIRS, TOY], ids=lambda p: p.name)
def test_every_checked_in_kernel_yaml_passes(kernel_dir):
    meta = load_metadata(kernel_dir)
    assert meta.variants and re.fullmatch(r"\d+\.\d+\.\d+", meta.version)


def test_tpu_generations_cover_what_detection_reports():
    assert {generation for _, generation in _TPU_KINDS} <= set(TPU_GENERATIONS)


def _ragged() -> dict:
    return read_yaml(ROOT / "kernels/pallas/ragged_dot/kernel.yaml")


def _set(path: str, value):
    def mutate(data: dict) -> None:
        *parents, last = path.split(".")
        target = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is _DROP:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return mutate


_DROP = object()

BAD = [
    ("unknown-key", _set("validation", "validation"), "unknown field 'validation'"),
    ("unknown-variant-key", _set("variants.0.python_dependencies", {}),
     "unknown field 'variants[0].python_dependencies'"),
    ("missing", _set("repo_id", _DROP), "missing required field 'repo_id'"),
    ("variant-path", _set("variants.4.name", "../../../tmp/victim"), "field 'variants[4].name'"),
    ("repo-id", _set("repo_id", "kernel-hub/../x"), "field 'repo_id'"),
    ("python-name", _set("python_name", "ragged-dot"), "field 'python_name'"),
    ("entry", _set("variants.3.entry", "../torch_api.py"), "field 'variants[3].entry'"),
    ("pre-release", _set("version", "1.2.0rc1"), "field 'version': '1.2.0rc1' is not a release version"),
    ("float-version", _set("version", 1.1), "field 'version'"),
    ("framework", _set("variants.0.framework", "tensorflow"), "field 'variants[0].framework'"),
    ("backend", _set("variants.0.backend", "metal"), "field 'variants[0].backend'"),
    ("generation", _set("variants.0.tpu_generations", ["v9"]), "field 'variants[0].tpu_generations[0]'"),
    ("specifier", _set("variants.0.requires", {"jax": ">=>0.10"}), "not a PEP 440 version specifier"),
    ("dist-name", _set("variants.0.requires", {"ja x": ">=0.10"}), "not a distribution name"),
    ("vendor-path", _set("vendor", ["../../src/kernel_hub/api.py"]), "field 'vendor'"),
    ("vendor-twice", _set("vendor", ["dispatch.py", "dispatch.py"]), "vendored file 'dispatch.py' is listed twice"),
    ("duplicate-variant", _set("variants.1.name", "jax-tpu"), "variant name 'jax-tpu' is listed twice"),
    ("no-variants", _set("variants", []), "field 'variants'"),
    ("layer-kind", _set("replaces", ["moe experts"]), "field 'replaces'"),
]


@pytest.mark.parametrize(("mutate", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_kernel_yaml_is_one_line_naming_file_and_field(mutate, message):
    data = copy.deepcopy(_ragged())
    mutate(data)
    with pytest.raises(MetadataError, match=re.escape(message)) as err:
        parse_metadata(data, "kernels/x/kernel.yaml")
    text = str(err.value)
    assert text.startswith("kernels/x/kernel.yaml: ") and "\n" not in text


def test_an_unsafe_variant_name_never_reaches_publish(tmp_path):
    """The variant name would be a folder that publish writes and deletes: refused before anything is written."""
    kernel = tmp_path / "k"
    (kernel / "toy_scale").mkdir(parents=True)
    for f in (TOY / "toy_scale").glob("*.py"):
        (kernel / "toy_scale" / f.name).write_text(f.read_text())
    victim = tmp_path / "victim"
    (victim / "keep.txt").parent.mkdir()
    (victim / "keep.txt").write_text("precious")
    (kernel / "kernel.yaml").write_text((TOY / "kernel.yaml").read_text().replace(
        "name: jax-cpu", "name: ../../../victim"))
    with pytest.raises(MetadataError, match="variants"):
        build_layout(kernel, tmp_path / "out" / "a" / "b")
    assert (victim / "keep.txt").read_text() == "precious" and not (tmp_path / "out").exists()


def test_a_missing_entry_file_names_the_variant(tmp_path):
    kernel = tmp_path / "k"
    kernel.mkdir()
    (kernel / "toy_scale").mkdir()
    for f in (TOY / "toy_scale").glob("*.py"):
        if f.name != "torch_entry.py":
            (kernel / "toy_scale" / f.name).write_text(f.read_text())
    (kernel / "kernel.yaml").write_text((TOY / "kernel.yaml").read_text())
    with pytest.raises(MetadataError, match=r"field 'variants.torch-cpu.entry': torch_entry.py is not in"):
        load_metadata(kernel)


def test_the_checked_in_registry_passes():
    registry = load_registry(ROOT / "registry.yaml")
    assert len(registry.entries) == 5 and all(e.source and e.source.is_dir() for e in registry.entries)
    assert registry.repo_for_layer("moe_experts", "cpu") == "kernel-hub/ragged-dot-tpu"
    assert registry.repo_for_layer("rms_norm", "tpu") == "kernel-hub/rms-norm-tpu"


REGISTRY_BAD = [
    ({"kernels": [{"repo_id": "a/b", "sorce": "x"}]}, "unknown field 'kernels[0].sorce'"),
    ({"kernel": []}, "unknown field 'kernel'"),
    ({"kernels": [{"source": "x"}]}, "missing required field 'kernels[0].repo_id'"),
    ({"kernels": [{"repo_id": "a/../b"}]}, "field 'kernels[0].repo_id'"),
    ({"kernels": [{"repo_id": "a/b", "hub": "/etc"}]}, "field 'kernels[0].hub'"),
    ({"kernels": [{"repo_id": "a/b", "version": ">=>1"}]}, "field 'kernels[0].version'"),
    ({"kernels": [{"repo_id": "a/b", "backends": ["metal"]}]}, "field 'kernels[0].backends[0]'"),
    ({"kernels": [{"repo_id": "a/b"}, {"repo_id": "a/b"}]}, "repo_id 'a/b' is listed twice"),
    ({"layers": {"moe_experts": {"cpu": "not a repo"}}}, "field 'layers'"),
    ({"layers": {"moe_experts": {"metal": "a/b"}}}, "field 'layers.moe_experts.metal (a key)'"),
]


@pytest.mark.parametrize(("data", "message"), REGISTRY_BAD, ids=[m for _, m in REGISTRY_BAD])
def test_bad_registry_is_one_line_naming_file_and_field(data, message):
    with pytest.raises(MetadataError, match=re.escape(message)) as err:
        parse_registry(data, Path("/etc/kernel-hub/registry.yaml"))
    assert str(err.value).startswith("/etc/kernel-hub/registry.yaml: ") and "\n" not in str(err.value)
