"""A kernel's content changes only with its version: kernels/pallas/releases.yaml records each version's content
digest (vendored shared code included), and a change without a bump fails here, naming the kernel and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel_hub.errors import KernelHubError
from kernel_hub.package.releases import RECORD_COMMAND, check, current, record
from tests.toy_folder import set_version

PALLAS = Path(__file__).resolve().parents[2] / "kernels" / "pallas"


def test_every_kernel_version_is_recorded_with_its_content():
    problems = check(PALLAS)
    assert problems == [], "\n".join(problems)


@pytest.fixture
def pallas_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "pallas"
    shutil.copytree(PALLAS, dest, ignore=shutil.ignore_patterns("__pycache__", "tests", "*.md"))
    assert check(dest) == []
    return dest


def _touch(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an edit\n")


def test_an_edit_to_a_shared_file_flags_every_kernel_that_vendors_it(pallas_copy):
    _touch(pallas_copy / "_common" / "torch_jax.py")  # vendored by the three kernels with torch entries
    problems = check(pallas_copy)
    assert [p.split()[1] for p in problems] == ["flash_attention", "ragged_dot", "rms_norm"]
    for line in problems:
        kernel = line.split()[1]
        assert f"changed since version {current(pallas_copy / kernel)[0]} was recorded" in line
        assert f"bump its version in {pallas_copy}" in line and f"re-record with `{RECORD_COMMAND}`" in line

    _touch(pallas_copy / "_common" / "dispatch.py")  # vendored by all five
    assert len(check(pallas_copy)) == 5


def test_an_edit_to_a_kernel_flags_only_that_kernel(pallas_copy):
    _touch(pallas_copy / "tokamax_attention" / "tokamax_attention" / "masks.py")
    assert [p.split()[1] for p in check(pallas_copy)] == ["tokamax_attention"]
    (pallas_copy / "ragged_dot" / "ragged_dot" / "new_module.py").write_text("x = 1\n")  # an added file counts too
    assert [p.split()[1] for p in check(pallas_copy)] == ["ragged_dot", "tokamax_attention"]


def test_recording_refuses_a_changed_version_and_accepts_a_bump(pallas_copy):
    _touch(pallas_copy / "_common" / "torch_jax.py")
    before = {k: current(pallas_copy / k)[0] for k in ("flash_attention", "ragged_dot", "rms_norm")}
    with pytest.raises(KernelHubError, match=r"version [\d.]+ is recorded with other content: bump its version"):
        record(pallas_copy)
    for kernel in before:
        set_version(pallas_copy / kernel, "9.9.1")
    assert sorted(line.rsplit(" ", 1)[0] for line in record(pallas_copy)) == [
        "flash_attention 9.9.1", "ragged_dot 9.9.1", "rms_norm 9.9.1"]
    assert check(pallas_copy) == []
    text = (pallas_copy / "releases.yaml").read_text()
    assert all(f"{v}:" in text for v in before.values()) and "9.9.1:" in text  # old digests stay on record
    assert current(pallas_copy / "ragged_dot")[0] == "9.9.1"
