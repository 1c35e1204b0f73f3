"""Float64 NumPy backward of a Mixture-of-Experts expert block, written out by hand for the tests (no autodiff, no
code shared with the kernel): the gradients of L = sum(out * dout) in x, topk_weights, w_gate_up and w_down, by a
plain loop over tokens and slots. tests/kernel_builds/test_moe_mesh.py checks it against central finite differences of
`reference_moe_experts`, then uses it to check moe_experts' gradients on one device and on simulated meshes.
"""

from __future__ import annotations

import math

import numpy as np

_C = math.sqrt(2.0 / math.pi)


def _silu_and_slope(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = 1.0 / (1.0 + np.exp(-v))
    return v * s, s * (1.0 + v * (1.0 - s))


def _gelu_tanh_and_slope(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.tanh(_C * (v + 0.044715 * v**3))
    value = 0.5 * v * (1.0 + z)
    slope = 0.5 * (1.0 + z) + 0.5 * v * (1.0 - z**2) * _C * (1.0 + 3 * 0.044715 * v**2)
    return value, slope


ACTS = {"silu": _silu_and_slope, "gelu": _gelu_tanh_and_slope}


def f64(a: object) -> np.ndarray:
    """float64 copy of a NumPy or jax array (bfloat16 included)."""
    return np.asarray(a).astype(np.float64)


def moe_grads(x, ids, weights, w_gate_up, w_down, dout, activation: str = "silu"):
    """(d_x, d_weights, d_w_gate_up, d_w_down) of sum(out * dout); w_gate_up [E,H,2I] gate-first."""
    x, weights, wgu, wd, dout = (f64(a) for a in (x, weights, w_gate_up, w_down, dout))
    ids = np.asarray(ids).astype(np.int64)
    e, inter = wd.shape[0], wd.shape[1]
    wgu = wgu.reshape(e, x.shape[1], 2 * inter)
    act = ACTS[activation]
    dx, dw, dgu, dd = np.zeros_like(x), np.zeros_like(weights), np.zeros_like(wgu), np.zeros_like(wd)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            ex = int(ids[t, j])
            if not 0 <= ex < e:
                continue
            h = x[t] @ wgu[ex]
            g, u = h[:inter], h[inter:]
            ag, slope = act(g)
            a = ag * u
            y = a @ wd[ex]
            dw[t, j] = dout[t] @ y
            dy = weights[t, j] * dout[t]
            dd[ex] += np.outer(a, dy)
            da = wd[ex] @ dy
            dh = np.concatenate([da * u * slope, da * ag])
            dgu[ex] += np.outer(x[t], dh)
            dx[t] += wgu[ex] @ dh
    return dx, dw, dgu, dd
