"""The ragged dot on unquantized weights, one implementation at a time: each one's forward, the Pallas kernels'
backward (a custom VJP: gmm for d_lhs, tgmm for d_rhs), and `run`, the jitted differentiable call of one CallPath.

api.ragged_dot picks the CallPath through the dispatch (dispatch.py); the quantized backward (quant.py) runs the
unquantized kernel against the dequantized weights through `run` too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from ._vendor import cpu_gmm
from ._vendor.tiling import round_up
from .dispatch import CallPath
from .pallas import gmm as pallas_gmm
from .pallas.config import RaggedDotConfig, backward_config, default_config, transposed_config
from .pallas.metadata import group_offsets, make_group_metadata


def pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """x zero-padded at the end of each axis to `shape` (whole tiles for the Pallas kernels)."""
    if x.shape == shape:
        return x
    return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape, strict=True)])


def _pallas_cfg(path: CallPath, m: int, k: int, n: int, g: int, dtype: Any) -> RaggedDotConfig:
    cfg = path.config if path.config is not None else default_config(m, k, n, g, dtype, chip=path.chip)
    if g % cfg.experts_per_step:  # a block of experts must not straddle the last group
        cfg = dataclasses.replace(cfg, experts_per_step=1)
    return cfg


def _forward(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array,
             layer: jax.Array | None = None) -> jax.Array:
    """lhs @ rhs by groups; with `layer`, rhs is stacked [L, G, K, N] and rhs[layer] is used (the Pallas kernel
    reads that layer's blocks in place; the XLA path indexes)."""
    if path.name == "xla":
        if layer is not None:
            rhs = rhs[layer]
        hi = jax.lax.Precision.HIGHEST if jnp.float32 in (lhs.dtype, rhs.dtype) else None
        return jax.lax.ragged_dot(lhs, rhs, gs, precision=hi, preferred_element_type=path.out_dtype)
    m, k = lhs.shape
    g, _, n = rhs.shape[-3:]
    ct = jnp.result_type(lhs.dtype, rhs.dtype)
    cfg = _pallas_cfg(path, m, k, n, g, ct)
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(pallas_gmm.gmm_blocks(gs, cfg.experts_per_step), m_padded=mp, tm=cfg.tm, m=m)
    # a stack is cast and padded whole only when it must be (not whole tiles / another dtype): keep it bf16 and tiled
    out = pallas_gmm.gmm(
        pad_to(lhs.astype(ct), (mp, kp)),
        pad_to(rhs.astype(ct), (*rhs.shape[:-3], g, kp, np_)),
        meta,
        cfg=cfg,
        out_dtype=jnp.dtype(path.out_dtype),
        interpret=path.interpret or False,
        offsets=group_offsets(gs, m),
        layer=layer,
    )
    return out[:m, :n]


def _backward(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array, dout: jax.Array):
    m, k = lhs.shape
    g, _, n = rhs.shape
    ct = jnp.result_type(lhs.dtype, rhs.dtype, dout.dtype)
    # one expert per step: tgmm writes one group's gradient per output block
    cfg = (dataclasses.replace(path.config, experts_per_step=1) if path.config is not None
           else backward_config(m, k, n, g, jnp.result_type(lhs.dtype, rhs.dtype)))
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(gs, m_padded=mp, tm=cfg.tm, m=m)
    lhs_p = pad_to(lhs.astype(ct), (mp, kp))
    rhs_p = pad_to(rhs.astype(ct), (g, kp, np_))
    dout_p = pad_to(dout.astype(ct), (mp, np_))
    interpret = path.interpret or False
    # explicit tiles are the caller's; default ones are re-fitted for the swapped kernel's larger output block
    lhs_cfg = cfg.swapped_kn() if path.config is not None else transposed_config(cfg, kp, np_, jnp.dtype(ct).itemsize)
    d_lhs = pallas_gmm.gmm(
        dout_p, rhs_p, meta, offsets=group_offsets(gs, m), cfg=lhs_cfg, out_dtype=lhs.dtype, transpose_rhs=True,
        interpret=interpret,
    )
    d_rhs = pallas_gmm.tgmm(
        lhs_p.T, dout_p, meta, num_groups=g, cfg=cfg, out_dtype=rhs.dtype, interpret=interpret
    )
    return d_lhs[:m, :k], d_rhs[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pallas(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    return _forward(path, lhs, rhs, gs)


def _pallas_fwd(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array):
    return _forward(path, lhs, rhs, gs), (lhs, rhs, gs)


def _pallas_bwd(path: CallPath, res, dout: jax.Array):
    lhs, rhs, gs = res
    d_lhs, d_rhs = _backward(path, lhs, rhs, gs, dout)
    return d_lhs, d_rhs, None


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def run(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    if path.name == "xla":  # jax.lax.ragged_dot has its own differentiation rules
        return _forward(path, lhs, rhs, gs)
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        return cpu_gmm.grouped_matmul(lhs, rhs, gs, path.out_dtype, cap)
    return _pallas(path, lhs, rhs, gs)


@functools.partial(jax.jit, static_argnums=(0,))
def run_stacked(path: CallPath, lhs: jax.Array, rhs: jax.Array, gs: jax.Array, layer: jax.Array) -> jax.Array:
    """run on weights stacked over layers [L, G, K, N] at `layer` (forward only: decode's path)."""
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        return cpu_gmm.grouped_matmul(lhs, rhs[layer], gs, path.out_dtype, cap)
    return _forward(path, lhs, rhs, gs, layer)
