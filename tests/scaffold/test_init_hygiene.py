"""`kernel-hub init` refuses names that shadow the standard library, makes its folder as the user's umask says,
and the next init removes the staging folders a killed init left (only those)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from kernel_hub.scaffold import InitError, init


@pytest.mark.parametrize("name", ["json", "typing", "os", "sys", "asyncio", "Queue"])
def test_standard_library_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InitError, match="standard-library"):
        init(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_the_folder_follows_the_umask(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        folder = init("masked_kernel", tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask


def test_a_killed_inits_staging_is_removed_by_the_next(tmp_path: Path) -> None:
    old = time.time() - 3600
    killed = tmp_path / f".kk-init-{'0' * 32}"
    (killed / "kk").mkdir(parents=True)
    legacy = tmp_path / ".kk-init-a1b2c3d4"  # an older init's mkdtemp name
    legacy.mkdir()
    running = tmp_path / f".other-init-{'1' * 32}"  # another init, still writing
    running.mkdir()
    not_ours = tmp_path / ".kk-init-keep-me"
    not_ours.mkdir()
    elsewhere = tmp_path.parent / f"outside-{tmp_path.name}"
    elsewhere.mkdir()
    link = tmp_path / f".ln-init-{'2' * 32}"
    link.symlink_to(elsewhere)
    for path in (killed, legacy, not_ours):
        os.utime(path, (old, old))
    os.utime(link, (old, old), follow_symlinks=False)
    init("kk", tmp_path)
    assert not killed.exists() and not legacy.exists()
    assert running.is_dir() and not_ours.is_dir() and link.is_symlink() and elsewhere.is_dir()
    assert (tmp_path / "kk" / "kernel.yaml").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kk-init-") and p != not_ours]
