"""Model layers on hub kernels: kernelize(model) swaps a model's layers, restore(model) undoes it. (Named `layers`,
not `kernelize`, so that `kernel_hub.kernelize` stays the function.)

One module per job, shared by every kind: find.py (where a module's weights live, Diffusers objects), plan.py (the
decisions every kind makes, with their reasons), load.py (the kernel a kind gets), layer_check.py (tolerances, errors),
swap.py (install / restore bookkeeping), report.py (the KernelizeReport), weights_guard.py, sharded.py (DTensor
slices). The layer kinds sit on top, one folder each in kinds/ (its own finding, decisions, validation, flow,
transformers / Diffusers adapters and declaration); diffusers.py runs them on Diffusers models; api.py is the flow,
handing the kinds down. The names below load on first use, so `kernel_hub.layers.kinds` can be read without torch;
a kind's own public names are its folder's (e.g. `kernel_hub.layers.kinds.experts.find_experts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:  # what type checkers read (`x as x`: a re-export); at run time the names load lazily
    from .api import is_kernelized as is_kernelized
    from .api import kernelize as kernelize
    from .api import kernelize_report as kernelize_report
    from .api import restore as restore
    from .report import Kept as Kept
    from .report import KernelizeReport as KernelizeReport
    from .report import Replaced as Replaced

_LAZY = {
    "Kept": "report",
    "KernelizeReport": "report",
    "Replaced": "report",
    "is_kernelized": "api",
    "kernelize": "api",
    "kernelize_report": "api",
    "restore": "api",
}

__all__ = sorted(_LAZY)


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is an error there, not Any
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
