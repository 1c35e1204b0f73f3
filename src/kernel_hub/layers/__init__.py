"""Model layers on hub kernels: kernelize(model) swaps a model's layers, restore(model) undoes it. (Named `layers`,
not `kernelize`, so that `kernel_hub.kernelize` stays the function.)

One module per job, shared by every kind: find.py (where a module's weights live, Diffusers objects), plan.py (the
decisions every kind makes, with their reasons), load.py (the kernel a kind gets), layer_check.py (tolerances, errors),
swap.py (install / restore bookkeeping), report.py (the KernelizeReport), weights_guard.py, sharded.py (DTensor
slices). The layer kinds sit on top, one folder each in kinds/ (its own finding, decisions, validation, flow,
transformers / Diffusers adapters and declaration); diffusers.py runs them on Diffusers models; api.py is the flow,
handing the kinds down. The names below load on first use, so `kernel_hub.layers.kinds` can be read without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:  # what type checkers read (`x as x`: a re-export); at run time the names load lazily
    from .api import is_kernelized as is_kernelized
    from .api import kernelize as kernelize
    from .api import kernelize_report as kernelize_report
    from .api import restore as restore
    from .kinds.experts.find import ExpertsLayout as ExpertsLayout
    from .kinds.experts.find import ExpertsSite as ExpertsSite
    from .kinds.experts.find import find_experts as find_experts
    from .kinds.experts.find import read_experts as read_experts
    from .kinds.experts.validate import validate_layer as validate_layer
    from .report import Kept as Kept
    from .report import KernelizeReport as KernelizeReport
    from .report import Replaced as Replaced

_LAZY = {
    "ExpertsLayout": "kinds.experts.find",
    "ExpertsSite": "kinds.experts.find",
    "Kept": "report",
    "KernelizeReport": "report",
    "Replaced": "report",
    "find_experts": "kinds.experts.find",
    "is_kernelized": "api",
    "kernelize": "api",
    "kernelize_report": "api",
    "read_experts": "kinds.experts.find",
    "restore": "api",
    "validate_layer": "kinds.experts.validate",
}

__all__ = sorted(_LAZY)


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is an error there, not Any
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
