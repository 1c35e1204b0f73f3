"""NumPy float64 reference: a plain loop over groups, sharing no code with the kernels."""

from __future__ import annotations

import numpy as np

from .arrays import to_f64


def reference_ragged_dot(lhs: object, rhs: object, group_sizes: object) -> np.ndarray:
    """out[r] = lhs[r] @ rhs[g] for the group g holding row r; rows past sum(group_sizes) are zero."""
    a, b = to_f64(lhs), to_f64(rhs)
    sizes = to_f64(group_sizes).astype(np.int64)
    m, n = a.shape[0], b.shape[2]
    out = np.zeros((m, n), dtype=np.float64)
    start = 0
    for g, size in enumerate(sizes):
        end = min(start + max(int(size), 0), m)
        if end > start:
            out[start:end] = a[start:end] @ b[g]
        start = end
    return out


def reference_ragged_dot_grads(
    lhs: object, rhs: object, group_sizes: object, dout: object
) -> tuple[np.ndarray, np.ndarray]:
    """(d_lhs, d_rhs) of sum(out * dout), by the same loop."""
    a, b, d = to_f64(lhs), to_f64(rhs), to_f64(dout)
    sizes = to_f64(group_sizes).astype(np.int64)
    m = a.shape[0]
    d_lhs, d_rhs = np.zeros_like(a), np.zeros_like(b)
    start = 0
    for g, size in enumerate(sizes):
        end = min(start + max(int(size), 0), m)
        if end > start:
            d_lhs[start:end] = d[start:end] @ b[g].T
            d_rhs[g] = a[start:end].T @ d[start:end]
        start = end
    return d_lhs, d_rhs
