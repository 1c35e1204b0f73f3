"""Lock files (kernel-hub.lock, kernels.lock) and pyproject.toml are hostile input: a FIFO never hangs a load,
/dev/zero (or a link to it) is never read until memory runs out, a file is read up to a hard byte cap whatever stat
says, and anything odd (nesting 10^5 deep, `tool = 5`, a 5000-digit version, a folder, an entry HF kernels would
refuse) is one KernelHubError naming the file. Each case runs in a child process with a memory limit and a timeout,
so a regression fails instead of hanging the suite or eating the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub.errors import KernelHubError, MetadataError
from kernel_hub.load.hf_lock import read_hf_lock, tool_kernels, write_hf_lock
from kernel_hub.load.lock import LockFile, read_lock
from tests.client_env import child_env

SRC = Path(__file__).resolve().parents[2] / "src"
COMMIT = "a" * 40

#: A child reading one file the way a load does; it prints the error's class and first line, or "ok".
_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
from pathlib import Path
from kernel_hub.load.hf_lock import read_hf_lock, tool_kernels
from kernel_hub.load.lock import read_lock
import kernel_hub as kh
how, path = sys.argv[1], Path(sys.argv[2])
calls = {"read_lock": lambda: read_lock(path), "read_hf_lock": lambda: read_hf_lock(path),
         "pyproject": lambda: tool_kernels(path),
         "get_kernel": lambda: kh.get_kernel("acme/x", lockfile=path)}
try:
    calls[how]()
    print("ok")
except kh.KernelHubError as exc:
    print(type(exc).__name__ + ": " + str(exc).splitlines()[0])
"""


def _read_in_child(how: str, path: Path) -> str:
    env = child_env(PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", _CHILD, how, str(path)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "special"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    return path


@pytest.mark.parametrize("how", ["read_lock", "read_hf_lock", "pyproject", "get_kernel"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "folder"])
def test_a_special_file_is_refused_without_reading_it(tmp_path: Path, how: str, kind: str) -> None:
    said = _read_in_child(how, _special(tmp_path, kind))
    assert said.startswith("MetadataError: ") and "special" in said, said
    expected = {"fifo": "is a FIFO", "dev-zero-link": "is a device", "folder": "is a folder"}[kind]
    assert expected in said


def test_dev_zero_itself_is_refused(tmp_path: Path) -> None:
    assert "is a device" in _read_in_child("read_lock", Path("/dev/zero"))


def test_the_cap_counts_bytes_read_not_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that grows past the cap (stat said small) is still refused: at most cap + 1 bytes are read."""
    from kernel_hub.load import hf_lock

    monkeypatch.setattr(hf_lock, "MAX_BYTES", 64)
    path = tmp_path / "kernels.lock"
    path.write_text("[" + " " * 200 + "]")
    with pytest.raises(MetadataError, match="larger than 64 bytes"):
        read_hf_lock(path)


def _entry(repo: str = "acme/x", **dependency: object) -> dict:
    return {"dependency": {"repo-id": repo, **(dependency or {"version": 1})}, "lock": {"commit": COMMIT}}


@pytest.mark.parametrize(("text", "needle"), [
    ("[" * 100_000 + "]" * 100_000, "nested"),
    (json.dumps([_entry(), _entry()]), "locked twice"),
    (json.dumps([_entry(revision="main"), _entry(revision="main")]), "locked twice"),
    ('[{"dependency": {"repo-id": "acme/x", "repo-id": "acme/y", "version": 1}, "lock": {"commit": "'
     + COMMIT + '"}}]', "twice in one object"),
    (json.dumps([_entry(version=-1)]), "not version -1"),
    ('[{"dependency": {"repo-id": "acme/x", "version": ' + "9" * 5000 + '}, "lock": {"commit": "' + COMMIT + '"}}]',
     "not valid JSON"),
    (json.dumps([_entry(version=10**7)]), "more than 7 digits"),
])
def test_kernels_lock_hf_kernels_would_refuse_is_one_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "kernels.lock"
    path.write_text(text)
    with pytest.raises(MetadataError, match=needle) as refused:
        read_hf_lock(path)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400


def test_what_hf_kernels_accepts_still_reads(tmp_path: Path) -> None:
    """The same repo at two versions is two dependencies for HF kernels: still read."""
    path = tmp_path / "kernels.lock"
    path.write_text(json.dumps([_entry(version=1), _entry(version=2), _entry("acme/y", revision="main")]))
    assert [(e.repo_id, e.version, e.revision) for e in read_hf_lock(path)] == [
        ("acme/x", 1, None), ("acme/x", 2, None), ("acme/y", None, "main")]


@pytest.mark.parametrize(("body", "needle"), [
    ("tool = 5\n", "no \\[tool.kernels.dependencies\\]"),
    ("[tool]\nkernels = 5\n", "no \\[tool.kernels.dependencies\\]"),
    ("[tool.kernels]\ndependencies = [1]\n", "no \\[tool.kernels.dependencies\\]"),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid TOML"),
    ('[tool.kernels.dependencies]\n"acme/x" = ' + "9" * 5000 + "\n", "not valid TOML"),
    ('[tool.kernels.dependencies]\n"acme/x" = 123456789\n', "more than 7 digits"),
    ('[tool.kernels.dependencies]\n"acme/x" = -1\n', "a negative integer|-1"),
])
def test_pyproject_oddities_are_one_error(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    with pytest.raises(MetadataError, match=needle) as refused:
        tool_kernels(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text", [
    '{"kernel-hub-lock": 1, "kernels": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"kernel-hub-lock": 1, "kernel-hub-lock": 1, "kernels": []}',
    '{"kernel-hub-lock": 1, "kernels": [], "n": ' + "9" * 5000 + "}",
])
def test_kernel_hub_lock_oddities_are_one_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kernel-hub.lock"
    path.write_text(text)
    with pytest.raises(MetadataError, match="not valid JSON for a lock file") as refused:
        read_lock(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("writer", ["ours", "hf"])
def test_lock_writes_never_go_through_a_link(tmp_path: Path, writer: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    target = tmp_path / "project" / "x.lock"
    target.parent.mkdir()
    target.symlink_to(outside)
    with pytest.raises(KernelHubError, match="is a link"):
        if writer == "ours":
            LockFile().write(target)
        else:
            write_hf_lock([], target)
    assert outside.read_text() == "precious\n" and target.is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.lock"]  # no temporary file left


def test_lock_write_replaces_a_regular_file_in_one_rename(tmp_path: Path) -> None:
    target = tmp_path / "kernels.lock"
    target.write_text("old")
    other_name = tmp_path / "hard-link"
    os.link(target, other_name)
    write_hf_lock([], target)
    assert json.loads(target.read_text()) == [] and other_name.read_text() == "old"  # the other name is untouched
