"""Arrays of any framework as float64 NumPy, for the references and the validation cases.

Imports NumPy only: torch tensors and jax arrays are recognised by duck typing, so the torch-cpu builds (no jax)
and the JAX builds (no torch) both load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_f64(x: Any) -> np.ndarray:
    """float64 NumPy copy of a NumPy, jax or torch array (bfloat16 included; integers keep their values)."""
    if hasattr(x, "detach"):  # torch: bfloat16 has no NumPy dtype, go through float32 (exact)
        x = x.detach().cpu()
        x = x.float() if x.is_floating_point() else x
        return x.numpy().astype(np.float64)
    arr = np.asarray(x)
    if arr.dtype.name == "bfloat16" or arr.dtype.kind not in "fiub":
        arr = np.asarray(x, dtype=np.float32)
    return arr.astype(np.float64)
