"""Dispatch: one ragged_dot, several implementations tried in order (the kernel contract, docs/kernel-contract.md).

  "pallas"  Mosaic TPU kernels (pallas/gmm.py); compiled on a TPU, interpreted elsewhere unless interpret=False.
  "cpu"     capacity + overflow grouped matmul in plain XLA (_vendor/cpu_gmm.py); O(M*K*N) work.
  "xla"     jax.lax.ragged_dot: the oracle and the GPU path. On CPU it densifies to G x the work.

The choice is a pure function of (platform, requested names, interpret), so reports can print it; the platform is
where the operands live (platform.py), not only jax.default_backend().
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import quant
from ._vendor import cpu_gmm
from ._vendor.chips import ChipFacts, chip_for_device_kind
from ._vendor.dispatch import Dispatch
from ._vendor.groups import group_bounds
from ._vendor.interpret import pallas_remark, run_dispatch
from ._vendor.ragged_operands import check_operands
from ._vendor.tiling import round_up
from .pallas import gmm as pallas_gmm
from .pallas.config import RaggedDotConfig, backward_config, default_config, transposed_config
from .pallas.metadata import make_group_metadata

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "cpu", "xla")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas", "xla"),
    "cuda": ("xla", "cpu"),
    "gpu": ("xla", "cpu"),
    "rocm": ("xla", "cpu"),
    "cpu": ("cpu", "xla"),
}


_DISPATCH = Dispatch("ragged_dot", IMPLEMENTATIONS, ORDER, ("xla", "cpu"), remark=pallas_remark)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


# ---- differentiable wrappers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Path:
    """Static description of one implementation call: hashable, so it is a jit / custom_vjp static arg."""

    name: str
    out_dtype: Any
    config: RaggedDotConfig | None
    interpret: Any
    chip: ChipFacts | None = None  # the TPU the forward's default tiles are chosen for (target_chip)


def target_chip(interpret: Any) -> ChipFacts | None:
    """The TPU a Mosaic lowering targets (the default device's kind, which an ahead-of-time compile for a mock TPU
    sets too); None when interpreting or off a TPU. Only the device kind is read, never pltpu.get_tpu_info()
    (that raises off a TPU); the facts themselves come from _vendor.chips.CHIPS."""
    if interpret:
        return None
    try:
        from jax._src.pallas.mosaic import tpu_info

        return chip_for_device_kind(tpu_info.get_device_kind())
    except Exception:  # no device kind to read: the conservative default
        return None


def _pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if x.shape == shape:
        return x
    return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape, strict=True)])


def _pallas_cfg(path: _Path, m: int, k: int, n: int, g: int, dtype: Any) -> RaggedDotConfig:
    cfg = path.config if path.config is not None else default_config(m, k, n, g, dtype, chip=path.chip)
    if g % cfg.experts_per_step:  # a block of experts must not straddle the last group
        cfg = dataclasses.replace(cfg, experts_per_step=1)
    return cfg


def _forward(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    if path.name == "xla":
        hi = jax.lax.Precision.HIGHEST if jnp.float32 in (lhs.dtype, rhs.dtype) else None
        return jax.lax.ragged_dot(lhs, rhs, gs, precision=hi, preferred_element_type=path.out_dtype)
    m, k = lhs.shape
    g, _, n = rhs.shape
    ct = jnp.result_type(lhs.dtype, rhs.dtype)
    cfg = _pallas_cfg(path, m, k, n, g, ct)
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(pallas_gmm.gmm_blocks(gs, cfg.experts_per_step), m_padded=mp, tm=cfg.tm, m=m)
    out = pallas_gmm.gmm(
        _pad_to(lhs.astype(ct), (mp, kp)),
        _pad_to(rhs.astype(ct), (g, kp, np_)),
        meta,
        cfg=cfg,
        out_dtype=jnp.dtype(path.out_dtype),
        interpret=path.interpret or False,
        bounds=group_bounds(gs, m),
    )
    return out[:m, :n]


def _backward(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array, dout: jax.Array):
    m, k = lhs.shape
    g, _, n = rhs.shape
    ct = jnp.result_type(lhs.dtype, rhs.dtype, dout.dtype)
    # one expert per step: tgmm writes one group's gradient per output block
    cfg = (dataclasses.replace(path.config, experts_per_step=1) if path.config is not None
           else backward_config(m, k, n, g, jnp.result_type(lhs.dtype, rhs.dtype)))
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(gs, m_padded=mp, tm=cfg.tm, m=m)
    lhs_p = _pad_to(lhs.astype(ct), (mp, kp))
    rhs_p = _pad_to(rhs.astype(ct), (g, kp, np_))
    dout_p = _pad_to(dout.astype(ct), (mp, np_))
    interpret = path.interpret or False
    # explicit tiles are the caller's; default ones are re-fitted for the swapped kernel's larger output block
    lhs_cfg = cfg.swapped_kn() if path.config is not None else transposed_config(cfg, kp, np_, jnp.dtype(ct).itemsize)
    d_lhs = pallas_gmm.gmm(
        dout_p, rhs_p, meta, cfg=lhs_cfg, out_dtype=lhs.dtype, transpose_rhs=True, interpret=interpret
    )
    d_rhs = pallas_gmm.tgmm(
        lhs_p.T, dout_p, meta, num_groups=g, cfg=cfg, out_dtype=rhs.dtype, interpret=interpret
    )
    return d_lhs[:m, :k], d_rhs[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pallas(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    return _forward(path, lhs, rhs, gs)


def _pallas_fwd(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array):
    return _forward(path, lhs, rhs, gs), (lhs, rhs, gs)


def _pallas_bwd(path: _Path, res, dout: jax.Array):
    lhs, rhs, gs = res
    d_lhs, d_rhs = _backward(path, lhs, rhs, gs, dout)
    return d_lhs, d_rhs, None


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def _run(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    if path.name == "xla":  # jax.lax.ragged_dot has its own differentiation rules
        return _forward(path, lhs, rhs, gs)
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        return cpu_gmm.grouped_matmul(lhs, rhs, gs, path.out_dtype, cap)
    return _pallas(path, lhs, rhs, gs)


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type: Any = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RaggedDotConfig | None = None,
    rhs_scale: Any = None,
) -> jax.Array:
    """Grouped matmul with jax.lax.ragged_dot semantics.

    lhs [M, K], rhs [G, K, N], group_sizes [G] int32 -> [M, N]: rows are grouped contiguously in order,
    row r of group g gets lhs[r] @ rhs[g]; rows past sum(group_sizes) are zero. The result has
    `preferred_element_type` (default lhs.dtype); accumulation is f32 (HIGHEST precision for f32).

    implementation: None takes implementations_for(platform) in order, the platform being where the operands
      live; a name or a sequence of names is tried in order, the first that can run wins; unknown names raise
      ValueError. `last_implementation()` says which ran and why.
    interpret: for "pallas": None compiles with Mosaic on a TPU and interprets elsewhere; True the fast
      interpreter; a pltpu.InterpretParams the TPU simulator (with detect_races, a race raises
      RaceDetectedError); False always lowers to Mosaic (ahead-of-time TPU compiles on any host).
    config: RaggedDotConfig tiles (pallas) / capacity (cpu); None uses default_config for the TPU being compiled
      for (target_chip: its VMEM, bandwidth and peak; interpreted runs get the conservative 16 MiB tiles).
    rhs_scale: for quantized weights (quant.py): rhs int8 with float32 [G, 1, N] per-channel scales, or
      float8_e4m3fn with float32 [G, ceil(K/128), ceil(N/128)] 128x128 block scales; gradients in lhs only.
    """
    lhs, rhs, group_sizes, out_dtype = check_operands(lhs, rhs, group_sizes, preferred_element_type)
    scale = quant.check_scale(lhs, rhs, rhs_scale)
    if scale is not None:
        return quant.quantized_ragged_dot(lhs, rhs, group_sizes, scale, out_dtype, implementation, interpret, config)
    run = lambda name, mode: _run(_Path(name, out_dtype, config, mode, target_chip(mode) if name == "pallas" else None),
                                  lhs, rhs, group_sizes)
    return run_dispatch(_DISPATCH, implementation, interpret, (lhs, rhs, group_sizes), run, "the ragged_dot kernel")
