"""Dispatch: tokamax.ragged_dot behind the hub's ragged_dot contract, plus the hub's CPU path.

  "mosaic"   Tokamax Pallas Mosaic kernel (TPU; Mosaic GPU on Hopper+). Needs every non-group dim >= 128.
  "triton"   Tokamax Pallas Triton kernel (CUDA/ROCm GPUs).
  "xla"      Tokamax's XLA path (jax.lax.ragged_dot). On CPU it densifies to one dot over all G groups:
             G x the work. Runs there only when named, as the oracle.
  "hub_cpu"  kernel-hub's capacity + overflow grouped matmul (_hub_cpu/, shared with ragged-dot-tpu):
             O(M*K*N) work. The CPU default, since Tokamax has no CPU kernel of its own.

Names are tried in the declared order; Tokamax's NotImplementedError for a shape moves to the next one
and is kept in the reason that `last_implementation()` returns.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import tokamax

from . import _dispatch
from ._hub_cpu import cpu
from .operands import check_operands

IMPLEMENTATIONS: tuple[str, ...] = ("mosaic", "triton", "xla", "hub_cpu")

#: Declared order per backend (kernel.yaml `implementations` says the same; a test keeps them equal).
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("mosaic", "xla"),
    "cuda": ("triton", "mosaic", "xla"),
    "gpu": ("triton", "mosaic", "xla"),
    "rocm": ("triton", "xla"),
    "cpu": ("hub_cpu",),
}
_FALLBACK = ("xla", "hub_cpu")

_last: dict[str, str | None] = {"name": None, "reason": None}


def implementations_for(backend: str) -> tuple[str, ...]:
    """Implementations tried, in order, when none is named. Unknown backends get the portable ones."""
    return ORDER.get(backend.lower(), _FALLBACK)


def _remark(backend: str) -> Any:
    def remark(name: str) -> str | None:
        if name == "xla" and backend.lower() == "cpu":
            return "densifies on cpu (G x the work): oracle only"
        if name == "hub_cpu":
            return "kernel-hub CPU path, not a Tokamax kernel"
        return None

    return remark


def resolve_implementation(backend: str, implementation: str | Sequence[str] | None = None) -> tuple[str, str]:
    """(first name that can run on `backend`, trace of why), without calling Tokamax.

    Tokamax may still refuse a shape at call time; `last_implementation()` reports what actually ran.
    """
    runnable, trace, source = _dispatch.resolve(ORDER, IMPLEMENTATIONS, backend, implementation, _FALLBACK,
                                                "ragged_dot")
    name = runnable[0]
    extra = _remark(backend)(name)
    trace.append(f"{name}: chosen ({source}){'; ' + extra if extra else ''}")
    return name, "; ".join(trace)


def last_implementation() -> tuple[str | None, str | None]:
    """(name, reason) of the most recent dispatch in this process (at trace time under jit)."""
    return _last["name"], _last["reason"]


# ---- the hub CPU path, differentiable -----------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hub_cpu(out_dtype: Any, lhs: jax.Array, rhs: jax.Array, gs: jax.Array) -> jax.Array:
    return cpu.gmm(lhs, rhs, gs, out_dtype=out_dtype)


def _hub_cpu_fwd(out_dtype: Any, lhs: jax.Array, rhs: jax.Array, gs: jax.Array):
    return cpu.gmm(lhs, rhs, gs, out_dtype=out_dtype), (lhs, rhs, gs)


def _hub_cpu_bwd(out_dtype: Any, res: tuple, dout: jax.Array):
    del out_dtype
    lhs, rhs, gs = res
    d_lhs = cpu.gmm(dout, rhs, gs, out_dtype=lhs.dtype, transpose_rhs=True)
    d_rhs = cpu.tgmm(lhs, dout, gs, out_dtype=rhs.dtype)
    return d_lhs, d_rhs, None


_hub_cpu.defvjp(_hub_cpu_fwd, _hub_cpu_bwd)


@functools.partial(jax.jit, static_argnames=("name", "out_dtype"))
def _run(lhs: jax.Array, rhs: jax.Array, gs: jax.Array, *, name: str, out_dtype: Any) -> jax.Array:
    if name == "hub_cpu":
        return _hub_cpu(out_dtype, lhs, rhs, gs)
    # f32 operands get HIGHEST: TPU's default f32 dot rounds through bf16 passes.
    hi = jax.lax.Precision.HIGHEST if jnp.float32 in (lhs.dtype, rhs.dtype) else None
    return tokamax.ragged_dot(lhs, rhs, gs, precision=hi, preferred_element_type=out_dtype, implementation=name)


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type: Any = None,
    implementation: str | Sequence[str] | None = None,
) -> jax.Array:
    """Grouped matmul with jax.lax.ragged_dot semantics, the contract of kernel-hub/ragged-dot-tpu.

    lhs [M, K], rhs [G, K, N], group_sizes [G] int32 -> [M, N]: rows are grouped contiguously in order,
    row r of group g gets lhs[r] @ rhs[g]; rows past sum(group_sizes) are zero. The result has
    `preferred_element_type` (default lhs.dtype).

    implementation: None tries implementations_for(jax.default_backend()) in order; a name or a sequence
      is tried in the given order. `last_implementation()` says which one ran and why.
    """
    lhs, rhs, group_sizes, out_dtype = check_operands(lhs, rhs, group_sizes, preferred_element_type)

    backend = jax.default_backend()
    runnable, trace, source = _dispatch.resolve(ORDER, IMPLEMENTATIONS, backend, implementation, _FALLBACK,
                                                "ragged_dot")
    _dispatch.ensure_flags_parsed()
    out, name, reason = _dispatch.run_in_order(
        runnable, trace, source,
        lambda n: _run(lhs, rhs, group_sizes, name=n, out_dtype=out_dtype),
        "ragged_dot", _remark(backend),
    )
    _last["name"], _last["reason"] = name, reason
    return out
