"""The `layer=` argument of kernels whose operands come stacked over a model's layers ([L, ...]): an integer scalar,
concrete or traced (a scan's counter), picking the layer the call reads, so no per-layer slice is taken outside the
kernel. Never imports kernel_hub."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def layer_index(layer: Any, layers: int, who: str) -> jax.Array:
    """`layer` as an int32 0-d array in [0, layers). One ValueError naming what to fix for a layer that is not an
    integer scalar, an empty stack, or a concrete layer outside it; a traced layer is clamped into the stack (nothing
    outside it is read)."""
    if layers <= 0:
        raise ValueError(f"{who}: the stack holds no layers")
    dtype = np.int64 if isinstance(layer, int) else getattr(layer, "dtype", None)
    if isinstance(layer, bool) or np.ndim(layer) != 0 or dtype is None or not np.issubdtype(np.dtype(dtype),
                                                                                           np.integer):
        raise ValueError(f"{who}: layer must be an integer scalar (a Python int or an int32 0-d array, traced or "
                         f"not), got {layer!r}")
    if isinstance(layer, jax.core.Tracer):
        return jnp.clip(jnp.asarray(layer).astype(jnp.int32), 0, layers - 1).reshape(())
    n = int(np.asarray(layer))
    if not 0 <= n < layers:
        raise ValueError(f"{who}: layer must be in [0, {layers}) for a stack of {layers} layers, got {n}")
    return jnp.asarray(n, jnp.int32)
