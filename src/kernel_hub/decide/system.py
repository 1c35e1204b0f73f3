"""Facts about this machine that decide which build variant fits.

Detection is separate from decisions: `variants.choose_variant` takes a `SystemFacts`, so tests can
simulate a TPU v5e or a CUDA box on a laptop. Detection never imports torch_tpu (it aborts the process
on a machine without a TPU) and imports jax/torch only when asked for the backend of that framework.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

BACKENDS = ("tpu", "cuda", "rocm", "cpu")
EXTRA_PACKAGES = ("tokamax", "triton", "transformers", "torch-tpu")  # versions a variant's `requires` may name


@dataclass(frozen=True)
class SystemFacts:
    backend: str                      # "tpu" | "cuda" | "rocm" | "cpu"
    tpu_generation: str | None = None  # "v4", "v5e", "v5p", "v6e", "v7x"
    device_kind: str | None = None     # as the runtime names it, e.g. "TPU v5 lite"
    jax_version: str | None = None
    torch_version: str | None = None
    python_version: str = platform.python_version()
    machine: str = platform.machine()
    os_name: str = platform.system().lower()           # "linux", "darwin": kernel-builder arch names carry it
    torch_cxx11_abi: bool | None = None                # torch's C++ ABI where torch was imported (None: unknown)
    packages: tuple[tuple[str, str], ...] = ()  # other distributions a build may require, e.g. tokamax

    def framework_version(self, dist: str) -> str | None:
        """The installed version of `dist` as this system reports it (None: not installed)."""
        known = {"jax": self.jax_version, "torch": self.torch_version}
        return known[dist] if dist in known else dict(self.packages).get(dist)

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, without importing it."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_TPU_KINDS = (
    (r"v7|7x", "v7x"),
    (r"v6", "v6e"),
    (r"v5 ?lite|v5e", "v5e"),
    (r"v5p|v5", "v5p"),
    (r"v4", "v4"),
    (r"v3", "v3"),
    (r"v2", "v2"),
)


def tpu_generation_from_kind(device_kind: str) -> str | None:
    """Map a runtime device kind ("TPU v5 lite", "TPU v6e") to a generation name."""
    kind = device_kind.lower()
    if "tpu" not in kind:
        return None
    for pattern, generation in _TPU_KINDS:
        if re.search(pattern, kind):
            return generation
    return None


def _tpu_present() -> bool:
    """A TPU host shows accelerator device files; checked without importing any framework."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _jax_backend() -> tuple[str, str | None]:
    import jax

    device = jax.devices()[0]
    platform_name = {"gpu": "cuda"}.get(device.platform, device.platform)
    return platform_name, getattr(device, "device_kind", None)


def _torch_backend() -> tuple[str, str | None]:
    if _tpu_present():
        return "tpu", None
    import torch

    if torch.cuda.is_available():
        kind = torch.cuda.get_device_name(0)
        return ("rocm" if getattr(torch.version, "hip", None) else "cuda"), kind
    return "cpu", None


def detect(framework: str = "jax") -> SystemFacts:
    """This machine's facts, asking `framework` for the accelerator it sees.

    KERNEL_HUB_BACKEND / KERNEL_HUB_TPU_GENERATION override detection (for dry runs and tests).
    """
    forced = os.environ.get("KERNEL_HUB_BACKEND")
    if forced:
        backend, kind = forced, None
    elif framework == "torch":
        backend, kind = _torch_backend()
    else:
        backend, kind = _jax_backend()
    generation = os.environ.get("KERNEL_HUB_TPU_GENERATION") or (
        tpu_generation_from_kind(kind) if kind else None
    )
    torch = sys.modules.get("torch")  # asked only of a torch already imported: detection imports no framework
    abi = getattr(torch, "compiled_with_cxx11_abi", None)
    return SystemFacts(
        torch_cxx11_abi=bool(abi()) if callable(abi) else None,
        backend=backend,
        tpu_generation=generation if backend == "tpu" else None,
        device_kind=kind,
        jax_version=installed_version("jax"),
        torch_version=installed_version("torch"),
        packages=tuple((d, v) for d in EXTRA_PACKAGES if (v := installed_version(d)) is not None),
    )


#: Where kernel-hub keeps what it rebuilds on demand (assembled packages, passed validations, TPU compile results).
CACHE_ENV = "KERNEL_HUB_CACHE"
#: The parts of that cache, one folder each: the only names `kernel-hub cache prune` removes there (the folder may
#: be shared with other tools: ~/.cache, the Hub cache).
ASSEMBLED_PART, VALIDATION_PART, TPU_COMPILE_PART = "assembled", "validation", "tpu_compile"
CACHE_PARTS = (ASSEMBLED_PART, VALIDATION_PART, TPU_COMPILE_PART)


def cache_root(part: str | None = None) -> Path:
    """$KERNEL_HUB_CACHE (default ~/.cache/kernel_hub), or its `part` subfolder: the one rule every cache uses,
    so deleting that folder always clears them all."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kernel_hub")
    return root / part if part else root
