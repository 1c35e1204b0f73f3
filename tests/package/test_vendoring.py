"""Shared kernel code lives once (kernels/pallas/_common) and ships as plain files inside each package that lists
it in kernel.yaml `vendor`: assembled the same way by the local source, publish and the kernel tests, covered by
digests and commit ids, with no links and no checked-in copies in the tree."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

import kernel_hub as kh
from kernel_hub.errors import MetadataError
from kernel_hub.package.metadata import load_metadata
from kernel_hub.package.vendoring import assemble, assembled_files, cache_root
from kernel_hub.publish.release import build_layout
from kernel_hub.sources.base import LocalSource

ROOT = Path(__file__).resolve().parents[2]
PALLAS = ROOT / "kernels" / "pallas"
COMMON = PALLAS / "_common"


def test_the_tree_holds_no_links_and_no_vendored_copies():
    links, copies = [], []
    for root, dirs, files in os.walk(ROOT / "kernels"):
        for name in dirs + files:
            path = Path(root) / name
            links += [path] if path.is_symlink() else []
            copies += [path] if name == "_vendor" else []
    assert links == [] and copies == []


def test_every_shared_module_is_vendored_by_some_kernel():
    used = {f for d in PALLAS.glob("*/kernel.yaml") for f in load_metadata(d.parent).vendor}
    shared = {p.name for p in COMMON.glob("*.py")} - {"__init__.py"}
    assert shared == used, f"unused shared modules: {sorted(shared - used)}"


@pytest.fixture
def pallas_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "pallas"
    shutil.copytree(PALLAS, dest, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    return dest


def test_assembly_copies_vendored_files_in_as_plain_files(tmp_path):
    package = assemble(PALLAS / "tokamax_ragged_dot", tmp_path)
    meta = load_metadata(PALLAS / "tokamax_ragged_dot")
    for name in ("__init__.py", *meta.vendor):
        shipped = package / "_vendor" / name
        assert shipped.is_file() and not shipped.is_symlink()
        assert shipped.read_bytes() == (COMMON / name).read_bytes()
    assert sorted(p.name for p in (package / "_vendor").iterdir()) == sorted(["__init__.py", *meta.vendor])
    shipped = package / "kernel.yaml"  # the package carries its kernel.yaml: a release reads its version there
    assert not shipped.is_symlink()
    assert shipped.read_bytes() == (PALLAS / "tokamax_ragged_dot" / "kernel.yaml").read_bytes()


def test_digests_and_commit_cover_vendored_files(pallas_copy):
    kernel = pallas_copy / "tokamax_ragged_dot"
    before = LocalSource(kernel)
    assert {"_vendor/cpu_gmm.py", "_vendor/dispatch.py", "api.py"} <= set(before.digests)
    dispatch = pallas_copy / "_common" / "dispatch.py"
    dispatch.write_text(dispatch.read_text() + "\n# an edit\n")
    after = LocalSource(kernel)
    assert after.digests["_vendor/dispatch.py"] != before.digests["_vendor/dispatch.py"]
    assert after.commit != before.commit
    meta_file = kernel / "kernel.yaml"
    meta_file.write_text(meta_file.read_text().replace("license: Apache-2.0", "license: MIT"))
    assert LocalSource(kernel).commit != after.commit  # kernel.yaml is part of the content too


def test_local_kernel_imports_the_assembled_package_from_the_cache(pallas_copy):
    module = kh.get_local_kernel(pallas_copy / "tokamax_ragged_dot", backend="cpu")
    path = Path(module.__kernel_hub__.path)
    assert cache_root() in path.parents and (path / "_vendor" / "cpu_gmm.py").is_file()
    assert Path(module.api.cpu_gmm.__file__) == path / "_vendor" / "cpu_gmm.py"


def test_a_tampered_cache_entry_is_rebuilt(pallas_copy):
    source = LocalSource(pallas_copy / "tokamax_attention")
    package = source.package_dir
    (package / "_vendor" / "dispatch.py").write_text("raise SystemExit('tampered')\n")
    again = LocalSource(pallas_copy / "tokamax_attention").package_dir
    assert again == package
    assert (again / "_vendor" / "dispatch.py").read_bytes() == (COMMON / "dispatch.py").read_bytes()


def test_published_layout_ships_vendored_files(tmp_path):
    layout = build_layout(PALLAS / "ragged_dot", tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "build" / "jax-cpu.tar") as tar:
        member = tar.getmember("ragged_dot/_vendor/interpret.py")
        assert member.isfile() and tar.extractfile(member).read() == (COMMON / "interpret.py").read_bytes()
    torch_meta = json.loads((tmp_path / "out" / "build" / "torch-cpu" / "metadata.json").read_text())
    assert "ragged_dot/_vendor/torch_jax.py" in torch_meta["kernel-hub"]["sha256"]
    assert "build/torch-cpu/ragged_dot/_vendor/torch_dispatch.py" in layout.files


def _set_vendor(kernel: Path, files: list[str]) -> None:
    meta = kernel / "kernel.yaml"
    text = meta.read_text()
    start, end = text.index("vendor:\n"), text.index("variants:\n")
    meta.write_text(text[:start] + "vendor: [" + ", ".join(files) + "]\n" + text[end:])


def test_a_vendored_file_needs_its_sibling_imports_vendored_too(pallas_copy):
    kernel = pallas_copy / "tokamax_ragged_dot"
    files = [f for f in load_metadata(kernel).vendor if f != "groups.py"]
    _set_vendor(kernel, files)
    with pytest.raises(MetadataError, match=r"kernel.yaml: field 'vendor': cpu_gmm.py imports .groups; add groups.py"):
        LocalSource(kernel)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda k: (k / "tokamax_attention" / "_vendor").mkdir(), "_vendor is checked in"),
        (lambda k: (k / "tokamax_attention" / "kernel.yaml").write_text("version: 0.0.1\n"),
         "tokamax_attention/kernel.yaml is checked in"),
        (lambda k: (k / "tokamax_attention" / "shared.py").symlink_to(k.parent / "_common" / "dispatch.py"),
         "shared.py is a link to"),
        (lambda k: (k / "tokamax_attention" / "etc").symlink_to("/etc"), "etc is a link to /etc, outside"),
        (lambda k: (k.parent / "_common" / "shapes.py").unlink(), "field 'vendor': shapes.py is not a file"),
        (lambda k: _set_vendor(k, ["../registry.py"]), "field 'vendor'"),
        (lambda k: (k.parent / "_common" / "shapes.py").write_text("import kernel_hub\n"), "never imports kernel_hub"),
        (lambda k: (k.parent / "_common" / "shapes.py").write_text("from ..x import y\n"), "only import its siblings"),
    ],
    ids=["checked-in-vendor", "checked-in-kernel-yaml", "link-to-common", "link-out", "missing-shared-file",
         "path-escape", "imports-kernel-hub", "dotdot-import"],
)
def test_bad_vendoring_is_refused_with_one_line(pallas_copy, damage, message):
    kernel = pallas_copy / "tokamax_attention"
    damage(kernel)
    with pytest.raises(MetadataError, match=message) as err:
        assembled_files(kernel)
    assert "\n" not in str(err.value)


def test_a_link_inside_the_kernel_folder_ships_its_content(pallas_copy, tmp_path):
    """A user's kernel folder may link within itself (our tree holds no links at all): the content ships."""
    package = pallas_copy / "tokamax_attention" / "tokamax_attention"
    (package / "alias.py").symlink_to(package / "masks.py")
    assert assembled_files(pallas_copy / "tokamax_attention")["alias.py"].resolve() == (package / "masks.py")
    shipped = assemble(pallas_copy / "tokamax_attention", tmp_path / "out") / "alias.py"
    assert not shipped.is_symlink() and shipped.read_bytes() == (package / "masks.py").read_bytes()
