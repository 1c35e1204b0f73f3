"""A hostile kernel folder: publish checks every name kernel.yaml gives before it joins it into a path, writes and
deletes only inside its own build folder, and refuses links that lead out of the kernel folder, all before any
network call (whatever metadata.py lets through)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.errors import KernelHubError
from kernel_hub.publish.release import build_layout, publish
from tests.toy_folder import copy_toy

SENTINEL = "sentinel: must survive"
CLOSED = "http://127.0.0.1:9"   # nothing listens: a refusal must come before any request


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Publish's temporary build folder lands in tmp_path/work, so tmp_path/victim is three levels above the
    folder variants are joined to (the '../../../tmp/victim' of the finding, kept inside this test)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text(SENTINEL)
    (victim / "__init__.py").write_text("")
    return work


def kernel(tmp_path: Path) -> Path:
    dest = tmp_path / "kernel"
    copy_toy(dest)
    return dest


def edit_yaml(folder: Path, old: str, new: str) -> None:
    meta = folder / "kernel.yaml"
    text = meta.read_text()
    assert old in text
    meta.write_text(text.replace(old, new, 1))


def _variant(folder: Path, victim: Path) -> None:
    edit_yaml(folder, "  - name: jax-cpu", "  - name: '../../../victim'")


def _variant_abs(folder: Path, victim: Path) -> None:
    edit_yaml(folder, "  - name: jax-cpu", f"  - name: '{victim}'")


def _python_name(folder: Path, victim: Path) -> None:
    edit_yaml(folder, "python_name: toy_scale", "python_name: ../victim")


def _entry(folder: Path, victim: Path) -> None:
    edit_yaml(folder, "    entry: torch_entry.py", "    entry: ../../victim/__init__.py")


def _dir_link(folder: Path, victim: Path) -> None:
    (folder / "toy_scale" / "etc").symlink_to("/etc")


def _file_link(folder: Path, victim: Path) -> None:
    (folder / "toy_scale" / "secret.py").symlink_to(victim / "keep.txt")


def _card_link(folder: Path, victim: Path) -> None:
    (folder / "README.md").symlink_to(victim / "keep.txt")


def _yaml_link(folder: Path, victim: Path) -> None:
    real = victim / "kernel.yaml"
    shutil.move(folder / "kernel.yaml", real)
    (folder / "kernel.yaml").symlink_to(real)


def _package_link(folder: Path, victim: Path) -> None:
    shutil.rmtree(folder / "toy_scale")
    (folder / "toy_scale").symlink_to(victim)


def _native(folder: Path, victim: Path) -> None:
    (folder / "toy_scale" / "fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")


def _pth(folder: Path, victim: Path) -> None:
    (folder / "toy_scale" / "hook.pth").write_text("import os\n")


def _duplicate(folder: Path, victim: Path) -> None:
    edit_yaml(folder, "  - name: jax-tpu", "  - name: jax-cpu")


CASES = {
    "variant name climbing": (_variant, "is not a variant name"),
    "variant name absolute": (_variant_abs, "is not a variant name"),
    "python_name climbing": (_python_name, "is not a Python identifier"),
    "entry climbing": (_entry, "must be a .py file"),
    "link to /etc in the package": (_dir_link, "outside"),
    "file link out of the folder": (_file_link, "outside"),
    "card links out of the folder": (_card_link, "outside the kernel folder"),
    "kernel.yaml links out of the folder": (_yaml_link, "outside the kernel folder"),
    "package links out of the folder": (_package_link, "leads outside"),
    "native module in the package": (_native, "native code"),
    "pth file in the package": (_pth, "path hook"),
    "variant listed twice": (_duplicate, "listed twice"),
}


def snapshot(tmp_path: Path, work: Path) -> dict[str, bytes]:
    """Every file outside publish's own temporary build folders, and every folder."""
    out = {}
    for p in sorted(tmp_path.rglob("*")):
        if p.is_symlink() or work in p.parents:
            continue
        out[str(p)] = p.read_bytes() if p.is_file() else b"<dir>"
    return out


@pytest.mark.parametrize("how", ["build_layout", "publish", "cli"])
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_kernel_folder_is_refused_before_any_request(case: str, how: str, tmp_path: Path, work: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    make, needle = CASES[case]
    folder = kernel(tmp_path)
    victim = tmp_path / "victim"
    make(folder, victim)
    before = snapshot(tmp_path, work)
    if how == "cli":
        rc = cli.main(["publish", str(folder), "--repo", "acme/x", "--endpoint", CLOSED, "--skip-validation"])
        err = capsys.readouterr().err
        assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        message = err.strip()
    else:
        with pytest.raises(KernelHubError) as exc:
            if how == "build_layout":
                build_layout(folder, work / "out")
            else:
                publish(folder, repo_id="acme/x", endpoint=CLOSED, skip_validation=True, log=lambda _: None)
        message = str(exc.value)
    assert needle in message and "\n" not in message, message
    assert "127.0.0.1:9" not in message  # refused before the network was asked
    assert snapshot(tmp_path, work) == before   # the victim and the kernel folder are untouched
    assert (victim / "keep.txt").read_text() == SENTINEL
    assert not list(tmp_path.rglob("victim.tar")) and not list(tmp_path.rglob("*.tar"))


def test_links_inside_the_folder_are_followed(tmp_path: Path) -> None:
    folder = kernel(tmp_path)
    (folder / "toy_scale" / "alias.py").symlink_to(folder / "toy_scale" / "ops.py")
    layout = build_layout(folder, tmp_path / "out")
    copied = tmp_path / "out" / "build" / "torch-cpu" / "toy_scale" / "alias.py"
    assert "build/torch-cpu/toy_scale/alias.py" in layout.files
    assert not copied.is_symlink() and copied.read_text() == (folder / "toy_scale" / "ops.py").read_text()


def test_python_caches_never_ship(tmp_path: Path) -> None:
    folder = kernel(tmp_path)
    cache = folder / "toy_scale" / "__pycache__"
    cache.mkdir()
    (cache / "ops.cpython-311.pyc").write_bytes(b"\0" * 16)
    (folder / "toy_scale" / "stray.pyc").write_bytes(b"\0" * 16)
    layout = build_layout(folder, tmp_path / "out")
    assert not [p for p in layout.files if "pycache" in p or p.endswith(".pyc")]
