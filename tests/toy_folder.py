"""The toy kernel (tests/fixtures/toy_kernel) and the one way a test copies it: into a folder of the test's own, so
it can edit the copy without touching the fixture."""

from __future__ import annotations

import shutil
from pathlib import Path

TOY = Path(__file__).parent / "fixtures" / "toy_kernel"


def set_version(kernel_dir: Path, version: str) -> None:
    """Rewrite the `version:` line of `kernel_dir`'s kernel.yaml."""
    meta = kernel_dir / "kernel.yaml"
    text = meta.read_text()
    old = next(line for line in text.splitlines() if line.startswith("version:"))
    meta.write_text(text.replace(old, f"version: {version}"))


def copy_toy(dest: Path, version: str | None = None, ops_extra: str | None = None) -> Path:
    """A copy of the toy kernel at `dest` (bytecode left out) and `dest` back.

    Args:
        dest: the folder to create; it must not exist.
        version: written into the copy's kernel.yaml; None keeps the fixture's.
        ops_extra: source appended to the copy's toy_scale/ops.py (a content change, e.g. a second release).
    """
    shutil.copytree(TOY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if version is not None:
        set_version(dest, version)
    if ops_extra:
        ops = dest / "toy_scale" / "ops.py"
        ops.write_text(ops.read_text() + ops_extra)
    return dest
