"""Dispatch: one ragged_dot, several implementations tried in order, each differentiable.

  "pallas"  Mosaic TPU kernels (pallas_gmm.py); off TPU only with `interpret` set.
  "cpu"     capacity + overflow grouped matmul in plain XLA (cpu.py); O(M*K*N) work.
  "xla"     jax.lax.ragged_dot: the oracle and the GPU path. On CPU it densifies to G x the work.

The choice is a pure function of (backend, requested names, interpret), so reports can print it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import cpu, pallas_gmm
from .config import RaggedDotConfig, default_config, round_up
from .metadata import make_group_metadata
from .operands import check_operands

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "cpu", "xla")

_ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas", "xla"),
    "cuda": ("xla", "cpu"),
    "gpu": ("xla", "cpu"),
    "rocm": ("xla", "cpu"),
    "cpu": ("cpu", "xla"),
}

_last: dict[str, str | None] = {"name": None, "reason": None}


def implementations_for(backend: str) -> tuple[str, ...]:
    """Implementations tried, in order, when none is named. Unknown backends get the portable ones."""
    return _ORDER.get(backend.lower(), ("xla", "cpu"))


def _unsupported(name: str, backend: str, interpret: Any) -> str | None:
    """Why `name` cannot run here, or None when it can."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown ragged_dot implementation {name!r}; known: {', '.join(IMPLEMENTATIONS)}")
    if name == "pallas" and backend != "tpu" and not interpret:
        return f"pallas needs a TPU or interpret=True/InterpretParams (backend is {backend})"
    return None


def resolve_implementation(
    backend: str, implementation: str | Sequence[str] | None = None, *, interpret: Any = None
) -> tuple[str, str]:
    """(chosen name, trace of why) for this backend; raises NotImplementedError with the trace if none fits."""
    if implementation is None:
        candidates, source = implementations_for(backend), f"default order for {backend}"
    elif isinstance(implementation, str):
        candidates, source = (implementation,), "requested"
    else:
        candidates, source = tuple(implementation), "requested order"
    if not candidates:
        raise ValueError("implementation sequence is empty")
    trace = []
    for name in candidates:
        why = _unsupported(name, backend, interpret)
        if why is None:
            trace.append(f"{name}: chosen ({source})")
            return name, "; ".join(trace)
        trace.append(f"{name}: skipped, {why}")
    raise NotImplementedError("no ragged_dot implementation fits: " + "; ".join(trace))


def last_implementation() -> tuple[str | None, str | None]:
    """(name, reason) of the most recent dispatch in this process (at trace time under jit)."""
    return _last["name"], _last["reason"]


# ---- differentiable wrappers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Path:
    """Static description of one implementation call: hashable, so it is a jit / custom_vjp static arg."""

    name: str
    out_dtype: Any
    config: RaggedDotConfig | None
    interpret: Any


def _pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if x.shape == shape:
        return x
    return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape, strict=True)])


def _pallas_cfg(path: _Path, m: int, k: int, n: int, g: int, dtype: Any) -> RaggedDotConfig:
    return path.config if path.config is not None else default_config(m, k, n, g, dtype)


def _forward(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    if path.name == "xla":
        hi = jax.lax.Precision.HIGHEST if jnp.float32 in (lhs.dtype, rhs.dtype) else None
        return jax.lax.ragged_dot(lhs, rhs, gs, precision=hi, preferred_element_type=path.out_dtype)
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        return cpu.gmm(lhs, rhs, gs, out_dtype=path.out_dtype, capacity=cap)
    m, k = lhs.shape
    g, _, n = rhs.shape
    ct = jnp.result_type(lhs.dtype, rhs.dtype)
    cfg = _pallas_cfg(path, m, k, n, g, ct)
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(gs, m_padded=mp, tm=cfg.tm, m=m)
    out = pallas_gmm.gmm(
        _pad_to(lhs.astype(ct), (mp, kp)),
        _pad_to(rhs.astype(ct), (g, kp, np_)),
        meta,
        cfg=cfg,
        out_dtype=jnp.dtype(path.out_dtype),
        interpret=path.interpret or False,
    )
    return out[:m, :n]


def _backward(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array, dout: jax.Array):
    m, k = lhs.shape
    g, _, n = rhs.shape
    if path.name == "cpu":
        cap = path.config.cpu_capacity if path.config is not None else None
        d_lhs = cpu.gmm(dout, rhs, gs, out_dtype=lhs.dtype, transpose_rhs=True, capacity=cap)
        d_rhs = cpu.tgmm(lhs, dout, gs, out_dtype=rhs.dtype, capacity=cap)
        return d_lhs, d_rhs
    ct = jnp.result_type(lhs.dtype, rhs.dtype, dout.dtype)
    cfg = _pallas_cfg(path, m, k, n, g, jnp.result_type(lhs.dtype, rhs.dtype))
    mp, kp, np_ = round_up(m, cfg.tm), round_up(k, cfg.tk), round_up(n, cfg.tn)
    meta = make_group_metadata(gs, m_padded=mp, tm=cfg.tm, m=m)
    lhs_p = _pad_to(lhs.astype(ct), (mp, kp))
    rhs_p = _pad_to(rhs.astype(ct), (g, kp, np_))
    dout_p = _pad_to(dout.astype(ct), (mp, np_))
    interpret = path.interpret or False
    d_lhs = pallas_gmm.gmm(
        dout_p, rhs_p, meta, cfg=cfg.swapped_kn(), out_dtype=lhs.dtype, transpose_rhs=True, interpret=interpret
    )
    d_rhs = pallas_gmm.tgmm(
        lhs_p.T, dout_p, meta, num_groups=g, cfg=cfg, out_dtype=rhs.dtype, interpret=interpret
    )
    return d_lhs[:m, :k], d_rhs[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    return _forward(path, lhs, rhs, gs)


def _grouped_fwd(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array):
    return _forward(path, lhs, rhs, gs), (lhs, rhs, gs)


def _grouped_bwd(path: _Path, res, dout: jax.Array):
    lhs, rhs, gs = res
    d_lhs, d_rhs = _backward(path, lhs, rhs, gs, dout)
    return d_lhs, d_rhs, None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def _run(path: _Path, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    if path.name == "xla":  # jax.lax.ragged_dot has its own differentiation rules
        return _forward(path, lhs, rhs, gs)
    return _grouped(path, lhs, rhs, gs)


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type: Any = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RaggedDotConfig | None = None,
) -> jax.Array:
    """Grouped matmul with jax.lax.ragged_dot semantics.

    lhs [M, K], rhs [G, K, N], group_sizes [G] int32 -> [M, N]: rows are grouped contiguously in order,
    row r of group g gets lhs[r] @ rhs[g]; rows past sum(group_sizes) are zero. The result has
    `preferred_element_type` (default lhs.dtype); accumulation is f32 (HIGHEST precision for f32).

    implementation: None picks by jax.default_backend() (see implementations_for); a name or a sequence
      of names is tried in order (the first that can run here is used).
    interpret: for "pallas" off TPU: True, or a pltpu.InterpretParams (TPU simulation, race detection).
    config: RaggedDotConfig tiles (pallas) / capacity (cpu); None uses default_config.
    """
    lhs, rhs, group_sizes, out_dtype = check_operands(lhs, rhs, group_sizes, preferred_element_type)

    name, reason = resolve_implementation(jax.default_backend(), implementation, interpret=interpret)
    _last["name"], _last["reason"] = name, reason
    return _run(_Path(name, out_dtype, config, interpret), lhs, rhs, group_sizes)
