"""What a measurement ran on: commit, package versions, CPU model and cores, date, seed.

Every bench JSON and report.json carry this, so two numbers are never compared without knowing whether they
came from the same code on the same machine. Reads package metadata and /proc only: no jax or torch import.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

from ..decide.system import installed_version
from ..package.checkout import checkout_root
from .schema import Environment

#: Distributions whose versions decide the numbers.
PACKAGES = ("kernel-hub", "jax", "jaxlib", "torch", "transformers", "diffusers", "tokamax", "huggingface_hub",
            "kernels", "numpy")
#: The checkout kernel_hub runs from (kernel_hub.package.checkout), or None when it runs installed.
CHECKOUT: Path | None = checkout_root()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's marketing name ("AMD EPYC 7B13"), from /proc/cpuinfo where there is one."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit(checkout: Path | None = CHECKOUT) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked files differ from it) of the checkout; (None, None) outside a git clone."""
    if checkout is None or not (checkout / ".git").exists():
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
        return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None, None


def libtpu_version() -> str | None:
    """libtpu's version in the TPU environment (.venv-tpu), or None where there is none."""
    try:
        from ..tpu.env import tpu_env

        return tpu_env().libtpu_version
    except Exception:  # no TPU environment: the report says so elsewhere
        return None


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def environment(seed: int | None = None, *, with_libtpu: bool = True) -> Environment:
    """This process's environment now."""
    commit, dirty = git_commit()
    versions = {name: installed_version(name) for name in PACKAGES}
    versions["libtpu"] = libtpu_version() if with_libtpu else None
    return Environment(
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        commit=commit, dirty=dirty, python=platform.python_version(), platform=platform.platform(),
        machine=platform.machine(), cpu_model=cpu_model(), cpu_cores=os.cpu_count(), usable_cores=usable_cores(),
        versions=versions, seed=seed,
    )
