"""`kernel-hub cache prune --all` (and `--dry-run`) removes and lists only what kernel-hub made and recognises, even
when KERNEL_HUB_CACHE or KERNELS_CACHE point at a folder shared with other tools: a HOME-like folder (.ssh,
Documents), ~/.cache (pip, huggingface) or the Hub cache itself (models--*, datasets--*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.decide.system import CACHE_PARTS
from kernel_hub.errors import KernelHubError
from kernel_hub.load.cache_admin import CacheEntry, cache_entries, prune

#: What a shared folder holds that is not kernel-hub's (each a folder with one file).
FOREIGN = (".ssh", "Documents", "pip", "huggingface", "models--acme--bert", "datasets--acme--wiki",
           "spaces--acme--demo", "kernels--acme--notacache", "kernels--bad", "tpu-env", "assembled-old", "Validation")


def _tree(root: Path, names: tuple[str, ...]) -> None:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "keep").write_text(name)


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One folder as both roots, holding kernel-hub's entries among foreign ones."""
    home = tmp_path / "home"
    _tree(home, FOREIGN)
    (home / "kernels--acme--relu" / "blobs").mkdir(parents=True)
    (home / "kernels--acme--relu" / "blobs" / "b").write_text("blob")
    (home / "kernels--acme--relu" / "kernel-hub").mkdir()
    _tree(home, CACHE_PARTS)
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(home))
    monkeypatch.setenv("KERNELS_CACHE", str(home))
    return home


def test_dry_run_lists_only_kernel_hubs_entries(shared: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["cache", "prune", "--all", "--dry-run"]) == 0
    listed = {Path(line.split()[2]).name for line in capsys.readouterr().out.splitlines()
              if line.startswith("would remove")}
    assert listed == {"kernels--acme--relu", *CACHE_PARTS}
    assert all((shared / name / "keep").is_file() for name in FOREIGN)


def test_prune_all_leaves_every_foreign_folder(shared: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["cache", "prune", "--all"]) == 0
    assert sorted(p.name for p in shared.iterdir()) == sorted(FOREIGN)
    assert all((shared / name / "keep").read_text() == name for name in FOREIGN)


def test_cache_ls_shows_nothing_foreign(shared: Path) -> None:
    names = {e.path.name for e in cache_entries(shared, shared)}
    assert names == {"kernels--acme--relu", *CACHE_PARTS}


@pytest.mark.parametrize("name", [".ssh", "models--acme--bert", "kernels--acme--notacache"])
def test_prune_refuses_an_entry_it_did_not_list(shared: Path, name: str) -> None:
    """prune() re-checks what it is handed: an entry built by hand for a foreign folder is refused."""
    forged = CacheEntry("repo" if name.startswith("kernels--") else "kernel-hub", name, shared / name, shared, 0)
    with pytest.raises(KernelHubError, match="not a cache folder kernel-hub made"):
        prune([forged])
    assert (shared / name / "keep").is_file()
