"""STORE/.kernel-hub-serve.lock is the store's own file: `serve --token` never follows a link there, never truncates
a file through a second (hard) name, never waits on a FIFO, and refuses each in one line; a read-only `serve` never
hangs on a FIFO lock; a store that cannot be written is named as such, not blamed on the address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("dulwich")

from kernel_hub import cli
from kernel_hub.errors import KernelHubError
from kernel_hub.server import gitstore
from kernel_hub.server.gitstore import STORE_LOCK, GitStore
from tests.client_env import child_env
from tests.hub_server import cli_command

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside.txt"
    path.write_text("precious\n")
    return path


def _serve_token(store: Path, capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    """`serve --token` in a child with a timeout (a regression would serve, or hang, instead of refusing)."""
    args = ["serve", "--store", str(store), "--host", "127.0.0.1", "--port", "0", "--token", "t"]
    proc = subprocess.run([*cli_command(), *args], env=child_env(PYTHONPATH=str(SRC)), capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, [ln for ln in proc.stderr.splitlines() if ln.strip()]


def test_a_symlinked_lock_is_refused_and_its_target_untouched(store: Path, outside: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    (store / STORE_LOCK).symlink_to(outside)
    code, err = _serve_token(store, capsys)
    assert code == 1 and len(err) == 1 and "is a link" in err[0]
    assert outside.read_text() == "precious\n"


def test_a_dangling_symlinked_lock_creates_nothing_outside(store: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "created-outside"
    (store / STORE_LOCK).symlink_to(target)
    code, err = _serve_token(store, capsys)
    assert code == 1 and "is a link" in err[0] and not target.exists()


def test_a_hard_linked_lock_is_never_truncated(store: Path, outside: Path, capsys: pytest.CaptureFixture) -> None:
    os.link(outside, store / STORE_LOCK)
    code, err = _serve_token(store, capsys)
    assert code == 1 and len(err) == 1 and "hard link" in err[0]
    assert outside.read_text() == "precious\n"


def test_a_fifo_lock_is_refused_by_a_writer(store: Path, capsys: pytest.CaptureFixture) -> None:
    os.mkfifo(store / STORE_LOCK)
    with pytest.raises(KernelHubError, match="is a FIFO"):
        GitStore(store).lock_for_writes()


def test_a_read_only_look_never_hangs_on_a_fifo(store: Path) -> None:
    """In a child with a timeout: a regression fails here instead of hanging the suite."""
    os.mkfifo(store / STORE_LOCK)
    script = ("import sys\nfrom kernel_hub.server.gitstore import GitStore\n"
              "print(GitStore(sys.argv[1]).lock_owner())\n")
    proc = subprocess.run([sys.executable, "-c", script, str(store)], env=child_env(PYTHONPATH=str(SRC)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr


def test_a_plain_lock_still_works_and_holds_the_pid(store: Path) -> None:
    writer = GitStore(store)
    assert writer.lock_for_writes() is None
    assert (store / STORE_LOCK).read_text() == f"{os.getpid()}\n"


def test_a_store_that_cannot_be_written_is_named_not_the_address(store: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only store (EACCES or EROFS on the lock file; simulated: the tests may run as root)."""
    def refuse(path: Path, *, write: bool) -> int:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(gitstore, "open_private", refuse)
    code = cli.main(["serve", "--store", str(store), "--port", "0", "--token", "t"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 1
    assert "not writable" in err[0] and str(store.resolve()) in err[0] and "cannot serve on" not in err[0]
