"""Whether the running kernel_hub is a kernel-hub checkout's own source, and where that checkout is.

A checkout brings things an installed package never runs: its .venv-tpu, its bench/ scripts, its kernels/
folder, its src/ on a worker's PYTHONPATH. Folders near an installed package (`pip install --target DIR`:
DIR/.. is anybody's) must never be taken for one, so every module asks this one rule instead of counting
parents of its own file. ROOT is a checkout only when all of these hold:
  - the package being run is ROOT/src/kernel_hub (the same folder, resolved);
  - ROOT/pyproject.toml parses and names the project "kernel-hub";
  - ROOT holds .git or kernels/pallas/ (a clone or a source tree, not a stray pyproject).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelHubError
from ..files import read_capped_text

PROJECT = "kernel-hub"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the kernel_hub package being run

__all__ = ["CheckoutDecision", "checkout_decision", "checkout_root"]


#: A checkout's pyproject.toml is a few KiB; a larger file (or a FIFO, a device) is no checkout's.
PYPROJECT_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class CheckoutDecision:
    root: Path | None  # the checkout, or None: use installed locations only
    reason: str


def checkout_decision(package_dir: Path = PACKAGE_DIR) -> CheckoutDecision:
    """The checkout holding `package_dir` (the running kernel_hub by default), and why it is or is not one."""
    package = Path(package_dir).resolve()
    root = package.parent.parent
    if package.parent.name != "src" or (root / "src" / "kernel_hub").resolve() != package:
        return CheckoutDecision(None, f"{package} is not a checkout's src/kernel_hub")
    try:
        data = tomllib.loads(read_capped_text(root / "pyproject.toml", PYPROJECT_MAX_BYTES, "pyproject.toml"))
        project = data.get("project")
        name = project.get("name") if isinstance(project, dict) else None
    except (OSError, ValueError, RecursionError, KernelHubError):
        return CheckoutDecision(None, f"{root} has no readable pyproject.toml")
    if name != PROJECT:
        return CheckoutDecision(None, f"{root}/pyproject.toml names {name!r}, not {PROJECT!r}")
    if not ((root / ".git").exists() or (root / "kernels" / "pallas").is_dir()):
        return CheckoutDecision(None, f"{root} has neither .git nor kernels/pallas/")
    return CheckoutDecision(root, f"{root} is the kernel-hub checkout kernel_hub runs from")


@functools.lru_cache(maxsize=8)
def checkout_root(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The checkout kernel_hub runs from, or None when it runs installed (see checkout_decision)."""
    return checkout_decision(package_dir).root
