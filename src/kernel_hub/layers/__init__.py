"""Model layers on hub kernels: kernelize(model) swaps a model's layers, restore(model) undoes it. (Named `layers`,
not `kernelize`, so that `kernel_hub.kernelize` stays the function.)

One module per job: find.py (candidate layers per kind), plan.py (the decisions, with their reasons), load.py (the
kernel a kind gets), validate.py (each layer's numbers against its own forward), swap.py (install / restore
bookkeeping), report.py (the KernelizeReport); packing.py (CPU packed expert weights) and sharded.py (DTensor
slices) beside them. The layer kinds (kinds/, one module each) sit on top and run the jobs; experts.py and
attention.py adapt them to transformers, diffusers.py and diffusers_route.py to Diffusers; api.py is the flow.
"""

from .api import is_kernelized, kernelize, restore, validate_layer
from .find import ExpertsLayout, ExpertsSite, find_experts, read_experts
from .report import Kept, KernelizeReport, Replaced

__all__ = [
    "ExpertsLayout",
    "ExpertsSite",
    "Kept",
    "KernelizeReport",
    "Replaced",
    "find_experts",
    "is_kernelized",
    "kernelize",
    "read_experts",
    "restore",
    "validate_layer",
]
