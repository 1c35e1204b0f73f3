"""Where the scale kind finds its layers: class named like a Scale, a 1-D weight, no bias (never run)."""

from __future__ import annotations

from typing import Any


def find_scales(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every scale layer in `model`."""
    import torch

    return [(path, m) for path, m in model.named_modules()
            if "scale" in type(m).__name__.lower() and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.dim() == 1 and getattr(m, "bias", None) is None]
