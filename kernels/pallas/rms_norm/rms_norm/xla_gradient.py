"""Ops whose forward has several implementations (a Pallas kernel, the XLA arithmetic) and whose gradient is always
jax's own of the XLA arithmetic, recomputed from the inputs in the backward (nothing but the inputs stored).

Used by the ops without a hand-written backward (the fused residual add, qk_norm_rope, attention_front): one custom
VJP rule instead of one per op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax


def with_xla_gradient(kernel: Callable[..., Any], xla: Callable[..., Any]) -> Callable[..., Any]:
    """op(impl, static, layer, *arrays): kernel(static, layer, *arrays) when impl is "pallas", else xla(static,
    layer, *arrays); differentiable in the arrays (not in layer) with the gradient of the xla one either way. impl and
    static are hashable (static arguments)."""

    def forward(impl: str, static: Any, layer: Any, *arrays: Any) -> Any:
        return (kernel if impl == "pallas" else xla)(static, layer, *arrays)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
    def op(impl: str, static: Any, layer: Any, *arrays: Any) -> Any:
        return forward(impl, static, layer, *arrays)

    def fwd(impl: str, static: Any, layer: Any, *arrays: Any) -> tuple[Any, tuple[Any, tuple[Any, ...]]]:
        return forward(impl, static, layer, *arrays), (layer, arrays)

    def bwd(impl: str, static: Any, residuals: tuple[Any, tuple[Any, ...]], cts: Any) -> tuple[Any, ...]:
        layer, arrays = residuals
        _, vjp = jax.vjp(functools.partial(xla, static, layer), *arrays)
        return (None, *vjp(cts))

    op.defvjp(fwd, bwd)
    return op
