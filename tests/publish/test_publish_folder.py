"""publish reads the kernel folder once: what the later stages take is that value, and a file changed after it
was read is refused when the layout is written (what was validated is what is uploaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub.errors import IntegrityError
from kernel_hub.package.integrity import sha256_file
from kernel_hub.publish.folder import read_kernel_folder
from kernel_hub.publish.release import write_layout


def test_the_folder_is_read_once_into_files_and_digests(toy_kernel: Path) -> None:
    folder = read_kernel_folder(toy_kernel)
    assert folder.path == toy_kernel.resolve() and folder.metadata.repo_id
    assert set(folder.files) == set(folder.digests) and folder.files
    for rel, src in folder.files.items():  # each digest is the file's own sha256, taken at read time
        assert folder.digests[rel] == sha256_file(src)


@pytest.mark.parametrize("which", ["package", "kernel.yaml"])
def test_a_file_changed_after_reading_is_refused(toy_kernel: Path, tmp_path: Path, which: str) -> None:
    folder = read_kernel_folder(toy_kernel)
    if which == "package":
        changed = next(src for src in folder.files.values() if src.suffix == ".py")
        changed.write_text(changed.read_text() + "\n# changed after validation\n")
    else:
        changed = toy_kernel / "kernel.yaml"
        changed.write_text(changed.read_text() + "\n# changed\n")
    with pytest.raises(IntegrityError, match="changed while publishing"):
        write_layout(folder, tmp_path / "out")


def test_an_unchanged_folder_writes_the_same_layout_as_build_layout(toy_kernel: Path, tmp_path: Path) -> None:
    from kernel_hub.publish.release import build_layout

    once = write_layout(read_kernel_folder(toy_kernel), tmp_path / "a")
    again = build_layout(toy_kernel, tmp_path / "b")
    assert once.files == again.files and once.blob_ids() == again.blob_ids()
