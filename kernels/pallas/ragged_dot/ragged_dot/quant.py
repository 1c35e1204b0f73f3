"""The ragged dot on quantized weights: `ragged_dot(lhs, rhs, group_sizes, rhs_scale=...)` lands here.

Two formats (the layouts the torch entry takes too):
  int8           rhs [G, K, N] int8, rhs_scale [G, 1, N] float32: one scale per (expert, output channel);
                 w[g, k, n] = rhs[g, k, n] * rhs_scale[g, 0, n].
  float8_e4m3fn  rhs [G, K, N] float8_e4m3fn, rhs_scale [G, ceil(K/128), ceil(N/128)] float32: one scale per
                 128x128 block (transformers' fine-grained FP8 layout, `weight_scale_inv`);
                 w[g, k, n] = rhs[g, k, n] * rhs_scale[g, k // 128, n // 128].
lhs is bf16 or f32; the result has lhs's dtype (or preferred_element_type).

Implementations (the same dispatch as the unquantized op, so last_implementation() reports them):
  "xla"     the reference: dequantize to f32, then jax.lax.ragged_dot at HIGHEST precision in f32.
  "cpu"     int8: the CPU grouped matmul on the int8 values upcast to lhs's dtype (exact), each row's output
            scaled by its expert's channel scales; fp8: dequantized to f32 first (a copy per call).
  "pallas"  pallas_quant.gmm_quant: HBM moves the 1-byte weights and the scales; upcast in VMEM.

Gradients: with respect to lhs only (weights are frozen). rhs and rhs_scale get zero cotangents: jax.grad with
respect to an fp8 rhs or rhs_scale returns zeros, and an int8 rhs is an integer input jax.grad refuses anyway. The
backward dequantizes the weights (lhs's dtype; f32 for f32) and runs the unquantized kernel against their transpose.

Scales holding NaN or inf: refused with a ValueError when rhs_scale is a concrete array (checked eagerly, before
anything runs); under jit they cannot be checked and propagate into the output rows of the experts they belong to.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._vendor import cpu_gmm
from ._vendor.groups import group_bounds
from ._vendor.interpret import run_dispatch
from ._vendor.tiling import cdiv, round_up
from .dense import pad_to, run
from .dispatch import DISPATCH, CallPath, target_chip
from .pallas import gmm as pallas_gmm
from .pallas import quant as pallas_quant
from .pallas.metadata import group_offsets, make_group_metadata

#: Quantized weight dtypes and the scale layout each takes.
FORMATS: dict[str, str] = {"int8": "[G, 1, N] (per expert and output channel)",
                           "float8_e4m3fn": "[G, ceil(K/128), ceil(N/128)] (128x128 blocks)"}
BLOCK = pallas_quant.BLOCK


def scale_shape(rhs_shape: tuple[int, ...], rhs_dtype: Any) -> tuple[int, int, int]:
    """The rhs_scale shape a quantized rhs [G, K, N] of this dtype takes."""
    g, k, n = rhs_shape
    if jnp.dtype(rhs_dtype) == jnp.int8:
        return (g, 1, n)
    return (g, cdiv(k, BLOCK), cdiv(n, BLOCK))


def check_scale(lhs: jax.Array, rhs: jax.Array, rhs_scale: Any, names: tuple[str, str] = ("rhs", "rhs_scale")
                ) -> jax.Array | None:
    """rhs_scale as an f32 array, None for unquantized weights, or one ValueError naming the argument to fix
    (`names`: what the caller calls the weights and the scales). Concrete scales holding NaN or inf are refused
    here; traced ones cannot be checked."""
    rname, sname = names
    name = jnp.dtype(rhs.dtype).name
    if rhs_scale is None:
        if name in FORMATS:
            raise ValueError(f"{rname} of dtype {name} needs {sname}: float32 {FORMATS[name]}")
        return None
    if name not in FORMATS:
        raise ValueError(f"{sname} is for quantized {rname} (int8 or float8_e4m3fn); got {rname} of dtype {name}: "
                         f"pass {sname}=None for unquantized weights")
    if jnp.dtype(lhs.dtype).name not in ("bfloat16", "float32"):
        raise ValueError(f"lhs must be bfloat16 or float32 with quantized {rname}, got {jnp.dtype(lhs.dtype).name}")
    scale = rhs_scale if isinstance(rhs_scale, jax.Array) else jnp.asarray(rhs_scale)
    want = scale_shape(rhs.shape, rhs.dtype)
    if jnp.dtype(scale.dtype) != jnp.float32 or tuple(scale.shape) != want:
        layout = "[G, 1, N]" if name == "int8" else "[G, ceil(K/128), ceil(N/128)]"
        raise ValueError(f"{sname} must be float32 {layout} = {list(want)} for {name} {rname}, got "
                         f"{jnp.dtype(scale.dtype).name} {list(scale.shape)}")
    if not isinstance(scale, jax.core.Tracer) and not bool(np.isfinite(np.asarray(scale)).all()):
        bad = np.argwhere(~np.isfinite(np.asarray(scale)))[0].tolist()
        raise ValueError(f"{sname} holds NaN or inf (first at index {bad}); scales must be finite")
    return scale


def dequantize(rhs: jax.Array, rhs_scale: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """The weights the quantized rhs stands for, [G, K, N] in `dtype` (computed in f32)."""
    w = rhs.astype(jnp.float32)
    if rhs.dtype == jnp.int8:
        return (w * rhs_scale).astype(dtype)
    k, n = rhs.shape[1:]
    s = jnp.repeat(jnp.repeat(rhs_scale, BLOCK, axis=1), BLOCK, axis=2)[:, :k, :n]
    return (w * s).astype(dtype)


def _compute_dtype(lhs: jax.Array) -> Any:
    return jnp.float32 if lhs.dtype == jnp.float32 else jnp.bfloat16


def _row_channel_scales(scale: jax.Array, gs: jax.Array, m: int) -> jax.Array:
    """[M, N]: each row's expert's channel scales (rows past the groups take the last expert's; they are zero)."""
    _, ends = group_bounds(gs, m)
    group = jnp.minimum(jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right"), gs.shape[0] - 1)
    return scale[group, 0, :]


def _forward(path: CallPath, lhs: jax.Array, rhs: jax.Array, scale: jax.Array, gs: jax.Array) -> jax.Array:
    m, k = lhs.shape
    g, _, n = rhs.shape
    ct = _compute_dtype(lhs)
    if path.name == "xla":
        w = dequantize(rhs, scale)
        out = jax.lax.ragged_dot(lhs.astype(jnp.float32), w, gs, precision=jax.lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)
        return out.astype(path.out_dtype)
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        if rhs.dtype == jnp.int8:  # int8 values are exact in bf16: scale the f32 product, not the weights
            out = cpu_gmm.gmm(lhs.astype(ct), rhs.astype(ct), gs, out_dtype=jnp.float32, capacity=cap)
            return (out * _row_channel_scales(scale, gs, m)).astype(path.out_dtype)
        return cpu_gmm.gmm(lhs.astype(jnp.float32), dequantize(rhs, scale), gs, out_dtype=path.out_dtype,
                           capacity=cap)
    block = rhs.dtype != jnp.int8
    if path.config is not None:
        cfg = path.config
    else:
        cfg = pallas_quant.choose_quant_config(m, k, n, g, ct, block, chip=path.chip)[0]
    if g % cfg.experts_per_step:
        cfg = dataclasses.replace(cfg, experts_per_step=1)
    if block:
        pallas_quant.check_block_tiles(cfg, k, n)
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(pallas_gmm.gmm_blocks(gs, cfg.experts_per_step), m_padded=mp, tm=cfg.tm, m=m)
    scale_p = (pallas_quant.arrange_block_scales(scale, kp, np_, cfg.tk, cfg.tn) if block
               else pad_to(scale, (g, 1, np_)))
    out = pallas_quant.gmm_quant(
        pad_to(lhs.astype(ct), (mp, kp)), pad_to(rhs, (g, kp, np_)), scale_p, meta, cfg=cfg,
        out_dtype=jnp.dtype(path.out_dtype), interpret=path.interpret or False, offsets=group_offsets(gs, m),
    )
    return out[:m, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _quantized(path: CallPath, lhs: jax.Array, rhs: jax.Array, scale: jax.Array, gs: jax.Array) -> jax.Array:
    return _forward(path, lhs, rhs, scale, gs)


def _quantized_fwd(path: CallPath, lhs, rhs, scale, gs):
    return _forward(path, lhs, rhs, scale, gs), (lhs, rhs, scale, gs)


def _quantized_bwd(path: CallPath, res, dout):
    lhs, rhs, scale, gs = res
    ct = _compute_dtype(lhs)
    w_t = jnp.swapaxes(dequantize(rhs, scale, ct), 1, 2)  # [G, N, K]
    d_lhs = run(CallPath(path.name, lhs.dtype, None, path.interpret, path.chip), dout.astype(ct), w_t, gs)
    return d_lhs, None, None, None  # None: a zero cotangent (weights and scales are frozen)


_quantized.defvjp(_quantized_fwd, _quantized_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def _run_quantized(path: CallPath, lhs: jax.Array, rhs: jax.Array, scale: jax.Array, gs: jax.Array) -> jax.Array:
    return _quantized(path, lhs, rhs, scale, gs)


def quantized_ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, rhs_scale: jax.Array,
                         out_dtype: Any, implementation: Any, interpret: Any, config: Any) -> jax.Array:
    """The dispatch of ragged_dot(..., rhs_scale=) once the operands are checked (api.ragged_dot calls it)."""
    call = lambda name, mode: _run_quantized(
        CallPath(name, out_dtype, config, mode, target_chip(mode) if name == "pallas" else None),
        lhs, rhs, rhs_scale, group_sizes)
    return run_dispatch(DISPATCH, implementation, interpret, (lhs, rhs, group_sizes), call,
                        "the quantized ragged_dot kernel")
