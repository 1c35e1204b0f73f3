"""kernel-hub: load, verify, validate and swap in accelerator kernels from the Hugging Face Hub.

`import kernel_hub` stays light: jax, torch and transformers load only when a kernel or model needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names

if TYPE_CHECKING:  # what type checkers read (`x as x`: a re-export); at run time the names load lazily
    from .api import get_kernel as get_kernel
    from .api import get_local_kernel as get_local_kernel
    from .api import has_kernel as has_kernel
    from .api import plan_load as plan_load
    from .api import validate as validate
    from .decide.system import SystemFacts as SystemFacts
    from .errors import KernelHubError as KernelHubError
    from .layers import KernelizeReport as KernelizeReport
    from .layers import kernelize as kernelize
    from .layers import kernelize_report as kernelize_report
    from .layers import restore as restore
    from .load.lock import get_locked_kernel as get_locked_kernel
    from .load.lock import lock as lock
    from .load.registry import load_registry as load_registry
    from .verify.results import ValidationReport as ValidationReport

__version__ = "0.1.0"

_LAZY = {
    "get_kernel": "api",
    "get_local_kernel": "api",
    "has_kernel": "api",
    "plan_load": "api",
    "validate": "api",
    "ValidationReport": "verify.results",
    "kernelize": "layers",
    "kernelize_report": "layers",
    "restore": "layers",
    "KernelizeReport": "layers",
    "lock": "load.lock",
    "get_locked_kernel": "load.lock",
    "load_registry": "load.registry",
    "KernelHubError": "errors",
    "SystemFacts": "decide.system",
}

__all__ = sorted(_LAZY)


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is an error there, not Any
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
