"""The rms_norm kind's find job: which modules are RMSNorms the kernel can serve, read from their class name (or HF
kernels' "RMSNorm" mark) and attributes, never their numbers; cheap, and no framework imported at module level."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def norm_structure(module: torch.nn.Module) -> tuple[bool, str]:
    """(is an RMSNorm the rms_norm kind can serve, why not): class name or HF kernels' mark, then the attributes
    (a 1-D `weight`, no `bias`, a numeric `variance_epsilon` or `eps`, a forward taking one tensor)."""
    import torch

    cls = type(module)
    named = "rmsnorm" in cls.__name__.lower() or getattr(cls, "kernel_layer_name", None) == "RMSNorm"
    if not named:
        return False, ""
    if "gated" in cls.__name__.lower():
        return False, f"{cls.__name__}: a gated RMSNorm (forward takes a gate) is another call contract"
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.nn.Parameter | torch.Tensor) or weight.dim() != 1:
        return False, f"{cls.__name__} has no 1-D weight (e.g. with_scale=False): the kernel scales by a weight"
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        return False, f"{cls.__name__} adds a bias after scaling (Diffusers' RMSNorm(bias=True)): the kernel adds none"
    if norm_epsilon(module) is None:
        return False, f"{cls.__name__} has neither a numeric variance_epsilon nor eps"
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) != 1:
        return False, f"{cls.__name__}.forward does not take one tensor"
    return True, ""


def norm_epsilon(module: torch.nn.Module) -> float | None:
    """The norm's epsilon (`variance_epsilon` or `eps`), None without a numeric one."""
    for n in ("variance_epsilon", "eps"):
        value = getattr(module, n, None)
        if isinstance(value, int | float):
            return float(value)
    return None


def find_norms(model: torch.nn.Module) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """([(path, module)] to try, [(path, reason)] named like an RMSNorm but not servable)."""
    found, skipped = [], []
    for path, module in model.named_modules():
        ok, why = norm_structure(module)
        if ok:
            found.append((path, module))
        elif why:
            skipped.append((path, why))
    return found, skipped
