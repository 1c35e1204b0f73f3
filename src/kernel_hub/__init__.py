"""kernel-hub: load, verify, validate and swap in accelerator kernels from the Hugging Face Hub.

`import kernel_hub` stays light: jax, torch and transformers load only when a kernel or model needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "get_kernel": "api",
    "get_local_kernel": "api",
    "has_kernel": "api",
    "plan_load": "api",
    "validate": "api",
    "ValidationReport": "validation",
    "kernelize": "layers",
    "restore": "layers",
    "KernelizeReport": "layers",
    "lock": "lock",
    "get_locked_kernel": "lock",
    "load_registry": "registry",
    "KernelHubError": "errors",
    "SystemFacts": "system",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernel_hub' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
