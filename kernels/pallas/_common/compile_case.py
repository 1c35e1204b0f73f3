"""The TPU compile case type every kernel's tpu_cases.py lists (kernel-hub's compile gate reads name, dtype,
tags and calls build()). Vendored into each kernel package (kernel.yaml `vendor:`). Never imports kernel_hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

#: (function, abstract arguments as jax.ShapeDtypeStructs): what kernel-hub lowers and compiles.
Built = tuple[Callable[..., Any], tuple[Any, ...]]
SHORT = {"bfloat16": "bf16", "float32": "f32"}


@dataclasses.dataclass(frozen=True)
class CompileCase:
    name: str
    dtype: str
    tags: tuple[str, ...]
    build: Callable[[], Built]


def forward_or_grad(fn: Callable[..., Any], args: tuple[Any, ...], grad: bool, argnums: tuple[int, ...]) -> Built:
    """(fn, args), or the gradient of sum(fn) in the `argnums` arguments: the kernel's backward pass."""
    if not grad:
        return fn, args
    import jax
    import jax.numpy as jnp

    return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=argnums), args


def abstract_ragged_dot(m: int, k: int, n: int, g: int, dtype: str) -> tuple[Any, ...]:
    """lhs [M, K], rhs [G, K, N] in `dtype`, group sizes [G] int32, as ShapeDtypeStructs."""
    import jax
    import jax.numpy as jnp

    return (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), dtype),
            jax.ShapeDtypeStruct((g,), jnp.int32))


def fwd_bwd(name: str, dtype: str, tags: Sequence[str], make: Callable[[bool], Callable[[], Built]],
            backward: bool) -> list[CompileCase]:
    """The forward case "fwd:<name>" and, if `backward`, its gradient "bwd:<name>"; make(grad) -> builder."""
    out = [CompileCase(f"fwd:{name}", dtype, (*tags, "fwd"), make(False))]
    if backward:
        out.append(CompileCase(f"bwd:{name}", dtype, (*tags, "bwd"), make(True)))
    return out


def with_smoke(cases: list[CompileCase], names: set[str]) -> list[CompileCase]:
    """The same cases, those named also tagged "smoke" (the quick subset tests compile)."""
    return [dataclasses.replace(c, tags=(*c.tags, "smoke")) if c.name in names else c for c in cases]
