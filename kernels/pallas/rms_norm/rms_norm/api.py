"""Public entry point: `rms_norm`, several implementations behind it (the kernel contract, docs/kernel-contract.md),
chosen by the platform the operands live on.

Implementations: "pallas" (the TPU kernels; compiled on a TPU, interpreted elsewhere unless interpret=False), "xla"
(the same arithmetic as whole-array XLA with the same hand-written backward: the CPU/GPU path) and "autodiff" (the
forward in XLA, its backward derived by jax: an independent check of the hand-written one). All three are
differentiable in x and weight.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import formula
from ._vendor.dispatch import Dispatch
from ._vendor.interpret import pallas_remark, run_dispatch
from .config import RMSNormConfig, block_rows
from .operands import check_operands
from .pallas_rms import RMSStatic, rms_backward, rms_forward

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "xla", "autodiff")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {"tpu": ("pallas", "xla"), "cpu": ("xla", "autodiff"), "cuda": ("xla",),
                                     "gpu": ("xla",)}

_DISPATCH = Dispatch("rms_norm", IMPLEMENTATIONS, ORDER, ("xla",), remark=pallas_remark)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


def _fwd_impl(impl: str, st: RMSStatic, x2, w):
    if impl == "pallas":
        return rms_forward(st, x2, w)
    return formula.forward(x2, w, eps=st.eps, zero_centered=st.zero_centered, scale_after_cast=st.scale_after_cast)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _rms(impl: str, st: RMSStatic, x2, w):
    return _fwd_impl(impl, st, x2, w)


def _rms_fwd(impl, st, x2, w):
    return _fwd_impl(impl, st, x2, w), (x2, w)


def _rms_bwd(impl, st, residuals, dy):
    x2, w = residuals
    if impl == "pallas":
        dx, dw = rms_backward(st, x2, w, dy)
    else:
        dx, contrib = formula.backward(x2, w, dy, eps=st.eps, zero_centered=st.zero_centered)
        dw = jnp.sum(contrib, axis=0)
    return dx.astype(x2.dtype), dw.astype(w.dtype)


_rms.defvjp(_rms_fwd, _rms_bwd)


@functools.partial(jax.jit, static_argnames=("impl", "eps", "zero_centered", "scale_after_cast", "config",
                                             "interpret"))
def _run(x, w, *, impl, eps, zero_centered, scale_after_cast, config, interpret):
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if impl == "autodiff":
        out = formula.forward(x2, w, eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast)
        return out.reshape(x.shape)
    st = RMSStatic(eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast,
                   block_rows=block_rows(x2.shape[0], h, config), interpret=interpret)
    return _rms(impl, st, x2, w).reshape(x.shape)


def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float,
    zero_centered: bool = False,
    scale_after_cast: bool = False,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RMSNormConfig | None = None,
) -> jax.Array:
    """RMSNorm of x[..., H] over its last axis with weight[H] -> x's shape and dtype, computed in float32.

    zero_centered: scale by (1 + weight) instead of weight (Gemma 1-3's stored form). scale_after_cast: cast the
    normalised x to x's dtype before multiplying by the weight (Llama's order), instead of casting the float32
    product once (Gemma's). Differentiable in x and weight (weight's gradient in weight's dtype).

    implementation / interpret: the kernel contract: a name or a sequence tried in order; interpret None compiles
    on a TPU and interprets elsewhere, False always lowers to Mosaic, a pltpu.InterpretParams with detect_races
    raises RaceDetectedError on a race.
    """
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    eps = check_operands(x.shape, weight.shape, eps)
    cfg = config or RMSNormConfig()
    if x.size == 0:
        return jnp.zeros(x.shape, x.dtype)
    run = lambda impl, mode: _run(x, weight, impl=impl, eps=eps, zero_centered=bool(zero_centered),
                                  scale_after_cast=bool(scale_after_cast), config=cfg, interpret=mode)
    return run_dispatch(_DISPATCH, implementation, interpret, (x, weight), run, "the RMSNorm kernel")
