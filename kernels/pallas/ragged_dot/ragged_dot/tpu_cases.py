"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu,
ahead of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

`compile_cases()` lists cases; each `build()` returns (function, abstract arguments as ShapeDtypeStructs).
Cases: the Pallas path of every TPU validation case, forward and backward (the custom_vjp's gmm + tgmm), in
bf16 and f32, plus the MoE expert projections (gate_up and down) of four models at decode (64 tokens) and
prefill (4096 tokens). `MOE_MODELS` is also what kernel-hub's TPU cost model runs. Never imports kernel_hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .moe_shapes import MOE_MODELS, PHASES

Built = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class CompileCase:
    name: str
    dtype: str
    tags: tuple[str, ...]
    build: Callable[[], Built]


_SHORT = {"bfloat16": "bf16", "float32": "f32"}


def _abstract(m: int, k: int, n: int, g: int, dtype: str) -> tuple[Any, ...]:
    import jax
    import jax.numpy as jnp

    return (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), dtype),
            jax.ShapeDtypeStruct((g,), jnp.int32))


def mosaic_ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, config: Any = None) -> Any:
    """The Pallas path, lowered to Mosaic (never interpreted)."""
    from .api import ragged_dot

    return ragged_dot(lhs, rhs, group_sizes, implementation="pallas", interpret=False, config=config)


Tiles = tuple[int, int, int] | None


def forward(m: int, k: int, n: int, g: int, dtype: str, tiles: Tiles = None) -> Callable[[], Built]:
    def build() -> Built:
        from .config import RaggedDotConfig

        cfg = None if tiles is None else RaggedDotConfig(*tiles)
        return (lambda lhs, rhs, gs: mosaic_ragged_dot(lhs, rhs, gs, cfg)), _abstract(m, k, n, g, dtype)

    return build


def backward(m: int, k: int, n: int, g: int, dtype: str, tiles: Tiles = None) -> Callable[[], Built]:
    """Gradients in lhs and rhs: the forward gmm, then the transposed gmm (d_lhs) and tgmm (d_rhs)."""

    def build() -> Built:
        import jax
        import jax.numpy as jnp

        from .config import RaggedDotConfig

        cfg = None if tiles is None else RaggedDotConfig(*tiles)
        loss = lambda lhs, rhs, gs: jnp.sum(mosaic_ragged_dot(lhs, rhs, gs, cfg).astype(jnp.float32))
        return jax.grad(loss, argnums=(0, 1)), _abstract(m, k, n, g, dtype)

    return build


def _validation_cases() -> list[CompileCase]:
    from .validation import cases

    out = []
    for c in cases("tpu"):
        if c.implementation != "pallas":
            continue
        shape = (c.m, c.k, c.n, c.g, c.dtype)
        tags = ("validation", c.dtype, *c.tags)
        out.append(CompileCase(f"fwd:{c.name}", c.dtype, (*tags, "fwd"), forward(*shape, tiles=c.tiles)))
        if c.tags[0] in ("decode", "prefill") or c.name.startswith("ragged_m"):
            out.append(CompileCase(f"bwd:{c.name}", c.dtype, (*tags, "bwd"), backward(*shape, tiles=c.tiles)))
    return out


def _model_cases() -> list[CompileCase]:
    out = []
    for geo in MOE_MODELS:
        for phase, tokens in PHASES.items():
            for proj, m, k, n, g in geo.projections(tokens):
                for dtype, short in _SHORT.items():
                    tags = ("model", geo.model, phase, proj, dtype)
                    name = f"{geo.model}:{phase}:{proj}:{short}"
                    out.append(CompileCase(f"fwd:{name}", dtype, (*tags, "fwd"), forward(m, k, n, g, dtype)))
                    if phase == "prefill" and dtype == "bfloat16":  # training-sized backward
                        out.append(CompileCase(f"bwd:{name}", dtype, (*tags, "bwd"), backward(m, k, n, g, dtype)))
    return out


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; the first forward and backward validation cases are also tagged "smoke"."""
    cases = _validation_cases() + _model_cases()
    smoke = {next(c.name for c in cases if "fwd" in c.tags), next(c.name for c in cases if "bwd" in c.tags)}
    return [dataclasses.replace(c, tags=(*c.tags, "smoke")) if c.name in smoke else c for c in cases]
