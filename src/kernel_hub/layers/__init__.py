"""Model layers on hub kernels: kernelize(model) swaps a transformers model's layers, restore(model)
undoes it. (Named `layers`, not `kernelize`, so that `kernel_hub.kernelize` stays the function.)"""

from .api import is_kernelized, kernelize, restore, validate_layer
from .families import ExpertsLayout, ExpertsSite, find_experts, read_experts
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
