"""The entry: one ragged_dot, several implementations tried in order (the kernel contract, docs/kernel-contract.md).

  "pallas"  Mosaic TPU kernels (pallas/gmm.py); compiled on a TPU, interpreted elsewhere unless interpret=False.
  "cpu"     capacity + overflow grouped matmul in plain XLA (_vendor/cpu_gmm.py); O(M*K*N) work.
  "xla"     jax.lax.ragged_dot: the oracle and the GPU path. On CPU it densifies to G x the work.

The choice is a pure function of (platform, requested names, interpret), so reports can print it; the platform is
where the operands live (platform.py), not only jax.default_backend(). The names, their order and the dispatch are
dispatch.py's (this module is where the contract and the torch bridge find them); the unquantized call is
dense.py's, the quantized one (rhs_scale) quant.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import quant
from ._vendor.interpret import run_dispatch
from ._vendor.ragged_operands import check_operands
from ._vendor.shapes import check_ragged_dot_shapes
from .dense import run, run_stacked
from .dispatch import (
    DISPATCH,
    IMPLEMENTATIONS,
    ORDER,
    CallPath,
    implementations_for,
    last_implementation,
    resolve_implementation,
    target_chip,
)
from .pallas.config import RaggedDotConfig

#: The JAX entry's names (docs/kernel-contract.md; the torch bridges reach them here through _vendor.torch_jax).
__all__ = ["IMPLEMENTATIONS", "ORDER", "implementations_for", "last_implementation", "ragged_dot",
           "resolve_implementation"]


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
    layer: Any = None,
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
    layer: an int32 scalar (may be traced, e.g. a scan's counter) when rhs is stacked over layers [L, G, K, N]: the
      result is ragged_dot(lhs, rhs[layer], group_sizes) and the Pallas kernel reads rhs[layer]'s blocks in place
      (no slice of the stack is copied). Forward only; unquantized weights only.
    """
    if layer is not None:
        return _stacked(lhs, rhs, group_sizes, layer, preferred_element_type, implementation, interpret, config,
                        rhs_scale)
    lhs, rhs, group_sizes, out_dtype = check_operands(lhs, rhs, group_sizes, preferred_element_type)
    scale = quant.check_scale(lhs, rhs, rhs_scale)
    if scale is not None:
        return quant.quantized_ragged_dot(lhs, rhs, group_sizes, scale, out_dtype, implementation, interpret, config)
    call = lambda name, mode: run(
        CallPath(name, out_dtype, config, mode, target_chip(mode) if name == "pallas" else None), lhs, rhs, group_sizes)
    return run_dispatch(DISPATCH, implementation, interpret, (lhs, rhs, group_sizes), call, "the ragged_dot kernel")


def _stacked(lhs, rhs, group_sizes, layer, preferred_element_type, implementation, interpret, config, rhs_scale):
    """ragged_dot on rhs [L, G, K, N] at `layer`: the operands checked as for rhs[layer], then the dispatch."""
    if rhs_scale is not None:
        raise ValueError("ragged_dot: layer= takes unquantized weights only; pass rhs[layer] with its rhs_scale")
    rhs = jnp.asarray(rhs)
    layer = jnp.asarray(layer)
    if rhs.ndim != 4 or layer.ndim != 0 or not jnp.issubdtype(layer.dtype, jnp.integer):
        raise ValueError(f"ragged_dot: layer= needs rhs stacked [L, G, K, N] and an integer scalar layer, got rhs "
                         f"{rhs.shape} and layer {layer.shape} {layer.dtype}")
    if not isinstance(layer, jax.core.Tracer) and not 0 <= int(layer) < rhs.shape[0]:
        raise ValueError(f"ragged_dot: layer {int(layer)} is outside the stack's {rhs.shape[0]} layers")
    lhs = jnp.asarray(lhs)
    check_ragged_dot_shapes(lhs.shape, rhs.shape[1:], jnp.shape(group_sizes))
    # the checks and dtype policy of one layer's weights, on an empty stand-in of the layer (no slice is taken)
    proxy = jnp.zeros((rhs.shape[1], rhs.shape[2], 0), rhs.dtype)
    lhs, _, group_sizes, out_dtype = check_operands(lhs, proxy, group_sizes, preferred_element_type)
    layer = layer.astype(jnp.int32)
    call = lambda name, mode: run_stacked(
        CallPath(name, out_dtype, config, mode, target_chip(mode) if name == "pallas" else None),
        lhs, rhs, group_sizes, layer)
    return run_dispatch(DISPATCH, implementation, interpret, (lhs, rhs, group_sizes), call, "the ragged_dot kernel")
