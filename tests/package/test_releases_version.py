"""kernel.yaml is the one place a kernel's version is written: every package's release.py reports kernel.yaml's
version (read from the copy assembly puts in the package, by the vendored _common/kernel_version.py), and no
release.py, nor the template `kernel-hub init` renders it from, holds a version of its own."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import kernel_hub as kh
from kernel_hub.package.metadata import load_metadata
from kernel_hub.package.vendoring import assemble

ROOT = Path(__file__).resolve().parents[2]
PALLAS = ROOT / "kernels" / "pallas"
RELEASE_TEMPLATE = ROOT / "src" / "kernel_hub" / "scaffold" / "templates" / "_shared" / "__pkg__" / "release.py.tmpl"
#: Every kernel folder whose package has a release.py.
RELEASED = sorted(p.parents[1].name for p in PALLAS.glob("*/*/release.py"))
_VERSION_LITERAL = re.compile(r"\d+\.\d+\.\d+")


def _reader():
    spec = importlib.util.spec_from_file_location("kh_test_kernel_version", PALLAS / "_common" / "kernel_version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no relative imports: the file alone is the module
    return module


def test_the_kernels_with_torch_op_names_have_a_release_module():
    assert RELEASED == ["flash_attention", "ragged_dot", "rms_norm"]


@pytest.mark.parametrize("kernel", RELEASED)
def test_every_release_reports_its_kernel_yaml_version(kernel):
    module = kh.get_local_kernel(PALLAS / kernel, framework="jax", backend="cpu")
    release = importlib.import_module(f"{module.__name__}.release")
    assert load_metadata(PALLAS / kernel).version == release.VERSION
    assert (module.__kernel_hub__.path / "kernel.yaml").read_bytes() == (PALLAS / kernel / "kernel.yaml").read_bytes()


@pytest.mark.parametrize("path", [*sorted(PALLAS.glob("*/*/release.py")), RELEASE_TEMPLATE],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_release_module_writes_a_version(path):
    assert not _VERSION_LITERAL.findall(path.read_text()), path


def test_the_reader_reads_what_kernel_hub_loads_from_every_kernel_yaml(tmp_path):
    reader = _reader()
    kernels = sorted(p.parent for p in PALLAS.glob("*/kernel.yaml"))
    assert len(kernels) == 5
    for kernel in kernels:
        package = assemble(kernel, tmp_path)
        assert reader.kernel_version(package) == load_metadata(kernel).version, kernel.name


@pytest.mark.parametrize(("text", "version"), [
    ("name: x\nversion: 1.2.3\n", "1.2.3"),
    ("version: '1.2.3'   # quoted, with a comment\r\n", "1.2.3"),
    ('version: "10.0.21"\n', "10.0.21"),
])
def test_the_reader_takes_the_forms_yaml_allows(tmp_path, text, version):
    (tmp_path / "kernel.yaml").write_text(text, newline="")
    assert _reader().kernel_version(tmp_path) == version


@pytest.mark.parametrize("text", ["name: x\n", "version: 1.2\n", "version: 1.2.3\nversion: 1.2.4\n",
                                  "variants:\n  - version: 1.2.3\n"])
def test_the_reader_refuses_anything_but_one_top_level_version(tmp_path, text):
    (tmp_path / "kernel.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"expected one top-level line `version: X.Y.Z`"):
        _reader().kernel_version(tmp_path)
