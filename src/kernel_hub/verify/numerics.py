"""The one error metric and the one tolerance table behind every numeric verdict kernel-hub gives.

The validation harness, kernelize's per-layer check and the benchmarks all call these (kernel tests may too; kernel
packages never do: their cases produce actual and expected only). The metric is scale-free: the largest absolute
difference over the largest reference magnitude. NaN or Inf, in the output or the reference, never passes: the
error is then infinite, as it is for a shape mismatch.

Imports NumPy only: torch tensors and jax arrays are read by duck typing, so `import kernel_hub` stays light.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

#: Largest relative error accepted per dtype. float32 results match a float64 reference to a few ulps of f32
#: accumulation. bfloat16 keeps 8 significant bits (rounding 2^-9 relative): measured on this machine, the bf16
#: validation cases and kernelize's whole-layer checks (every tiny family, inference and training) stay below
#: 7.4e-3; float16 keeps 11 bits, so it gets half the bf16 allowance.
TOLERANCE: dict[str, float] = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3}
#: Reference magnitudes below this count as this, so an all-zero reference does not divide by zero.
SCALE_FLOOR = 1e-6


def dtype_name(dtype: object) -> str:
    """"float32", "bfloat16", ... for a NumPy/JAX dtype, a torch dtype or a name."""
    name = getattr(dtype, "name", None) or str(dtype)
    return name.removeprefix("torch.")


def tolerance(dtype: object) -> float:
    """The accepted relative error for results of `dtype`; ValueError for a dtype the table does not know."""
    name = dtype_name(dtype)
    if name not in TOLERANCE:
        raise ValueError(f"no tolerance for dtype {name!r}; known: {', '.join(TOLERANCE)}")
    return TOLERANCE[name]


def to_float64(x: ArrayLike) -> np.ndarray:
    """Any array (NumPy, JAX, torch; bfloat16 included) as a float64 NumPy array."""
    if hasattr(x, "detach"):  # torch
        return x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)


def relative_error(actual: ArrayLike, expected: ArrayLike) -> float:
    """max|actual - expected| / max(SCALE_FLOOR, max|expected|); inf when the shapes differ or either side holds
    NaN or Inf; 0.0 for two empty arrays."""
    a, e = to_float64(actual), to_float64(expected)
    if a.shape != e.shape or not (np.isfinite(a).all() and np.isfinite(e).all()):
        return math.inf
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - e)) / max(float(np.max(np.abs(e))), SCALE_FLOOR))
