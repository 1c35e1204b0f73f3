"""The bench scripts as modules for their tests: bench/ holds scripts, not a package, so each loads from its file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(script: str) -> ModuleType:
    """bench/<script>.py, executed once per call under the module name bench_<script>."""
    spec = importlib.util.spec_from_file_location(f"bench_{script}", BENCH / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
