"""NumPy float64 reference of a Mixture-of-Experts expert block: a plain loop over tokens and their top-k slots,
sharing no code with the kernels (no sorting, no grouping, no ragged dot).

NumPy only at import: the torch-cpu builds (no jax) load the package's validation module too.
"""

from __future__ import annotations

import math

import numpy as np

from .arrays import to_f64


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _gelu_exact(v: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))


#: The gate activations by the names moe_experts takes, in float64.
NUMPY_ACTIVATIONS = {
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "gelu": _gelu_tanh,
    "gelu_tanh": _gelu_tanh,
    "gelu_exact": _gelu_exact,
    "relu": lambda v: np.maximum(v, 0.0),
}


def reference_moe_experts(x: object, topk_ids: object, topk_weights: object, w_gate_up: object, w_down: object,
                          activation: str = "silu") -> np.ndarray:
    """out[t] = sum_j w[t,j] * (act(x[t] @ Wg) * (x[t] @ Wu)) @ Wd of expert ids[t,j]; w_gate_up [E,H,2I] (or
    [E,H,2,I]) gate-first; ids outside [0, E) contribute nothing."""
    xs, w = to_f64(x), to_f64(topk_weights)
    ids = to_f64(topk_ids).astype(np.int64)
    wd = to_f64(w_down)
    e, inter = wd.shape[0], wd.shape[1]
    wgu = to_f64(w_gate_up).reshape(e, xs.shape[1], 2 * inter)
    act = NUMPY_ACTIVATIONS[activation]
    out = np.zeros_like(xs)
    for t in range(xs.shape[0]):
        for j in range(ids.shape[1]):
            ex = int(ids[t, j])
            if not 0 <= ex < e:
                continue
            h = xs[t] @ wgu[ex]
            out[t] += w[t, j] * ((act(h[:inter]) * h[inter:]) @ wd[ex])
    return out
