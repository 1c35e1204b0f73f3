"""TPU compile cases: Tokamax's Mosaic ragged dot as kernel-hub's compile gate lowers and compiles it with the
real TPU compiler (libtpu, ahead of time, one mock TPU per generation).

`compile_cases()` lists cases; each `build()` returns (function, abstract arguments as ShapeDtypeStructs):
the Mosaic validation cases (forward and backward) in bf16 and f32, and the MoE expert projections of four
models (moe_shapes.py, linked from kernel-hub/ragged-dot-tpu) at decode and prefill. Never imports kernel_hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .moe_shapes import MOE_MODELS, PHASES

Built = tuple[Callable[..., Any], tuple[Any, ...]]
_SHORT = {"bfloat16": "bf16", "float32": "f32"}


@dataclasses.dataclass(frozen=True)
class CompileCase:
    name: str
    dtype: str
    tags: tuple[str, ...]
    build: Callable[[], Built]


def _builder(m: int, k: int, n: int, g: int, dtype: str, grad: bool) -> Callable[[], Built]:
    def build() -> Built:
        import jax
        import jax.numpy as jnp

        from .api import ragged_dot

        fn = lambda lhs, rhs, gs: ragged_dot(lhs, rhs, gs, implementation="mosaic")
        args = (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), dtype),
                jax.ShapeDtypeStruct((g,), jnp.int32))
        if grad:
            return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1)), args
        return fn, args

    return build


def _pair(name: str, shape: tuple[int, int, int, int], dtype: str, tags: tuple[str, ...], backward: bool):
    out = [CompileCase(f"fwd:{name}", dtype, (*tags, dtype, "fwd"), _builder(*shape, dtype, False))]
    if backward:
        out.append(CompileCase(f"bwd:{name}", dtype, (*tags, dtype, "bwd"), _builder(*shape, dtype, True)))
    return out


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; the first forward and backward are also tagged "smoke"."""
    from .validation import cases

    out: list[CompileCase] = []
    for c in cases("tpu"):
        if c.implementation == "mosaic":
            out += _pair(c.name, (c.m, c.k, c.n, c.g), c.dtype, ("validation", *c.tags), backward=True)
    for geo in MOE_MODELS:
        for phase, tokens in PHASES.items():
            for proj, m, k, n, g in geo.projections(tokens):
                for dtype, short in _SHORT.items():
                    out += _pair(f"{geo.model}:{phase}:{proj}:{short}", (m, k, n, g), dtype,
                                 ("model", geo.model, phase, proj), backward=phase == "prefill" and short == "bf16")
    smoke = {out[0].name, out[1].name}
    return [dataclasses.replace(c, tags=(*c.tags, "smoke")) if c.name in smoke else c for c in out]
