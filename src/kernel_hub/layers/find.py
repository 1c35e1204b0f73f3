"""The find job's shared readers: where a module's weights live (what a layer's check runs on), and whether an object
is a Diffusers model, pipeline or denoiser (recognised by the modules its classes come from, so nothing here imports
diffusers). Each layer kind finds its own candidates (kinds/<kind>/find.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def device_type(module: torch.nn.Module) -> str:
    """Where a module's first parameter lives ("cpu" without parameters): what a layer's check runs on."""
    param = next(iter(module.parameters()), None)
    return param.device.type if param is not None else "cpu"


# --- Diffusers ------------------------------------------------------------------------------------------------------

#: Where Diffusers keeps denoisers; a pipeline component from one of these gets its layers kernelized.
DENOISER_MODULES = ("diffusers.models.transformers.", "diffusers.models.unets.")


def _class_modules(obj: object) -> list[str]:
    return [getattr(c, "__module__", "") or "" for c in type(obj).__mro__]


def is_diffusers_object(obj: object) -> bool:
    """Is `obj` a Diffusers model or pipeline (or a subclass of one)? Imports nothing."""
    return any(m == "diffusers" or m.startswith("diffusers.") for m in _class_modules(obj))


def is_pipeline(obj: object) -> bool:
    return isinstance(getattr(obj, "components", None), dict) and not hasattr(obj, "named_modules")


def is_denoiser(obj: object) -> bool:
    """A Diffusers transformer / UNet (what a pipeline's kernelize touches)."""
    return hasattr(obj, "named_modules") and any(m.startswith(DENOISER_MODULES) for m in _class_modules(obj))
