"""The bench scripts (and other lone data files, such as a kernel's tuned table) as modules for their tests: bench/
holds scripts, not a package, so each loads from its file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: The flash-attention kernel's tuned paged-attention table (plain data, read without importing the kernel).
PAGED_TUNED_TABLE = ROOT / "kernels/pallas/flash_attention/flash_attention/paged_tuned_table.py"


def load_file(name: str, path: Path) -> ModuleType:
    """The Python file at `path`, executed once per call as a module named `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(script: str) -> ModuleType:
    """bench/<script>.py, executed once per call under the module name bench_<script>."""
    return load_file(f"bench_{script}", BENCH / f"{script}.py")
