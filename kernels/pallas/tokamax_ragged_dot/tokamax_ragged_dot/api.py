"""Dispatch: tokamax.ragged_dot behind the hub's ragged_dot contract (docs/kernel-contract.md), plus the hub's CPU path.

  "mosaic"   Tokamax Pallas Mosaic kernel (TPU; Mosaic GPU on Hopper+). Needs every non-group dim >= 128.
  "triton"   Tokamax Pallas Triton kernel (CUDA/ROCm GPUs).
  "xla"      Tokamax's XLA path (jax.lax.ragged_dot). On CPU it densifies to one dot over all G groups:
             G x the work. Runs there only when named, as the oracle.
  "hub_cpu"  kernel-hub's capacity + overflow grouped matmul (_vendor/cpu_gmm.py, vendored from the shared code
             ragged-dot-tpu uses too): O(M*K*N) work. The CPU default, since Tokamax has no CPU kernel of its own.

Names are tried in the declared order; Tokamax's NotImplementedError for a shape moves to the next one and is kept
in the reason that `last_implementation()` returns.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import tokamax

from ._vendor import cpu_gmm
from ._vendor.dispatch import Dispatch
from ._vendor.platform import platform_of
from ._vendor.ragged_operands import check_operands
from ._vendor.tokamax_support import ensure_flags_parsed, tokamax_why_not

IMPLEMENTATIONS: tuple[str, ...] = ("mosaic", "triton", "xla", "hub_cpu")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("mosaic", "xla"),
    "cuda": ("triton", "mosaic", "xla"),
    "gpu": ("triton", "mosaic", "xla"),
    "rocm": ("triton", "xla"),
    "cpu": ("hub_cpu",),
}


def _remark(name: str, platform: str, interpret: Any) -> str | None:
    del interpret
    if name == "xla" and platform.lower() == "cpu":
        return "densifies on cpu (G x the work): oracle only"
    if name == "hub_cpu":
        return "kernel-hub CPU path, not a Tokamax kernel"
    return None


_DISPATCH = Dispatch("ragged_dot", IMPLEMENTATIONS, ORDER, ("xla", "hub_cpu"), why_not=tokamax_why_not,
                     remark=_remark)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


@functools.partial(jax.jit, static_argnames=("name", "out_dtype"))
def _run(lhs: jax.Array, rhs: jax.Array, gs: jax.Array, *, name: str, out_dtype: Any) -> jax.Array:
    if name == "hub_cpu":
        return cpu_gmm.grouped_matmul(lhs, rhs, gs, out_dtype)
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
    interpret: Any = None,
) -> jax.Array:
    """Grouped matmul with jax.lax.ragged_dot semantics, the contract of kernel-hub/ragged-dot-tpu.

    lhs [M, K], rhs [G, K, N], group_sizes [G] int32 -> [M, N]: rows are grouped contiguously in order,
    row r of group g gets lhs[r] @ rhs[g]; rows past sum(group_sizes) are zero. The result has
    `preferred_element_type` (default lhs.dtype).

    implementation: None tries implementations_for(platform) in order, the platform being where the operands
      live; a name or a sequence is tried in the given order. `last_implementation()` says which ran and why.
    interpret: None or False (Tokamax's Pallas ops choose their own mode; any other value skips them).
    """
    lhs, rhs, group_sizes, out_dtype = check_operands(lhs, rhs, group_sizes, preferred_element_type)
    ensure_flags_parsed()
    return _DISPATCH.run(platform_of(lhs, rhs, group_sizes), implementation, interpret,
                         lambda name: _run(lhs, rhs, group_sizes, name=name, out_dtype=out_dtype))
