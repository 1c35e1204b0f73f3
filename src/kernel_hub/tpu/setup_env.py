"""`kernel-hub setup-tpu`: build the TPU environment (a Python with jax and libtpu) for an installed kernel-hub.

libtpu stays out of the user's environment (a process that loads it prints TPU-init errors), so the compile gate
runs in its own virtual environment: `plan_setup` decides what to install there (pure: the jax the user's
kernels run with, its `[tpu]` extra for libtpu, and what kernel-hub's TPU worker imports), `setup_tpu` runs the
plan and then links this very kernel_hub package into the new environment (a `.pth` naming a folder that holds
only a link to it), so the worker runs the same kernel-hub code as the command that called it.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..decide.system import installed_version
from ..errors import KernelHubError
from .env import TpuEnvironmentError, setup_dir, tpu_env

#: The jax this kernel-hub is tested with, taken when the user's environment has none.
TESTED_JAX = "0.10.2"
#: What kernel-hub's TPU worker imports besides jax (kernel_hub itself is linked in, not installed).
WORKER_DEPENDS = ("pyyaml", "packaging", "numpy", "pydantic")
#: Seconds the one pip install may take (libtpu is ~700 MB) before it is stopped: `setup-tpu --pip-timeout`.
PIP_TIMEOUT = 1800.0
LINK_DIR = "kernel_hub_link"
PTH_FILE = "kernel_hub_link.pth"


@dataclass(frozen=True)
class SetupPlan:
    target: Path
    jax_version: str
    jax_reason: str
    install: tuple[str, ...]  # pip requirements, in one `pip install`

    @property
    def python(self) -> Path:
        return self.target / "bin" / "python"

    def commands(self, pip_args: Sequence[str] = ()) -> list[list[str]]:
        """The commands after the venv exists: one pip install of everything."""
        return [[str(self.python), "-m", "pip", "install", "--disable-pip-version-check", *pip_args, *self.install]]


def plan_setup(target: Path | None = None, installed_jax: str | None = None) -> SetupPlan:
    """What `setup-tpu` builds (pure): `installed_jax` is the jax of the user's environment (None: not installed);
    the TPU environment takes the same version, so the gate compiles what the kernels run with."""
    target = Path(target) if target is not None else setup_dir()
    if installed_jax:
        version, reason = installed_jax, f"jax {installed_jax}, as installed beside kernel-hub"
    else:
        version, reason = TESTED_JAX, f"jax {TESTED_JAX}, the version kernel-hub is tested with (no jax installed here)"
    return SetupPlan(target, version, reason, (f"jax[tpu]=={version}", *WORKER_DEPENDS))


def link_kernel_hub(plan: SetupPlan, package: Path | None = None) -> Path:
    """Make this kernel_hub importable in the TPU environment without installing anything else of the user's
    environment: <target>/kernel_hub_link/kernel_hub -> the package, and a .pth in its site-packages naming that
    folder. Returns the .pth written."""
    package = (package or Path(__file__).resolve().parents[1]).resolve()
    link_dir = plan.target / LINK_DIR
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "kernel_hub"
    if link.is_symlink() or link.exists():
        if link.resolve() == package:
            pass
        elif link.is_symlink():
            link.unlink()
        else:
            raise KernelHubError(f"{link} exists and is not a link made by setup-tpu; remove it and run again")
    if not link.exists():
        link.symlink_to(package, target_is_directory=True)
    site = sorted(plan.target.glob("lib/python*/site-packages"))
    if not site:
        raise TpuEnvironmentError(f"{plan.target} has no lib/python*/site-packages: not a virtual environment")
    pth = site[0] / PTH_FILE
    pth.write_text(f"{link_dir}\n")
    return pth


def setup_tpu(target: Path | None = None, *, pip_args: Sequence[str] = (), log: Callable[[str], None] = print,
              run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
              pip_timeout: float = PIP_TIMEOUT) -> Path:
    """Build (or update) the TPU environment; returns its Python. Each step says what it does before it starts;
    a failed pip install is one TpuEnvironmentError with pip's last line, and one that runs past `pip_timeout`
    seconds is stopped (killed) with one TpuEnvironmentError saying so."""
    if not 0 < pip_timeout < 1e7:
        raise TpuEnvironmentError(f"the pip timeout must be a positive number of seconds, got {pip_timeout}")
    plan = plan_setup(target, installed_version("jax"))
    if plan.target.exists() and not plan.target.is_dir():
        raise TpuEnvironmentError(f"--dir {plan.target} is a file; name a folder")
    log(f"TPU environment: {plan.target} ({plan.jax_reason})")
    if not plan.python.is_file():
        log(f"creating the virtual environment ({sys.executable} -m venv)")
        try:
            venv.EnvBuilder(with_pip=True, clear=False).create(plan.target)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise TpuEnvironmentError(f"cannot create a virtual environment in {plan.target}: {exc}") from None
    for command in plan.commands(pip_args):
        log(f"installing {' '.join(plan.install)} (libtpu is ~700 MB; pip's own output follows)")
        try:
            done = run(command, stdout=None, stderr=subprocess.PIPE, text=True, timeout=pip_timeout)
        except subprocess.TimeoutExpired:
            raise TpuEnvironmentError(f"pip install in {plan.target} did not finish within {pip_timeout:.0f} s and "
                                      "was stopped; check the network or the package index (--pip-arg), or allow "
                                      "longer with --pip-timeout") from None
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr or "").splitlines() if ln.strip()]
            raise TpuEnvironmentError(f"pip install in {plan.target} failed (exit {done.returncode}): "
                                      f"{lines[-1] if lines else 'no output'}")
    pth = link_kernel_hub(plan)
    log(f"linked kernel_hub into it ({pth})")
    env = tpu_env(environ={}, checkout=None, built=plan.target)
    log(f"ready: {env.python} (jax {env.jax_version}, libtpu {env.libtpu_version}); publish and validate --tpu use it")
    return env.python
