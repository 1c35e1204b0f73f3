"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu,
ahead of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

`compile_cases()` lists CompileCases; each `build()` returns (function, abstract arguments). Cases: the
Pallas path of every TPU validation case, forward and backward (the custom_vjp's gmm + tgmm), in bf16 and
f32, plus the MoE expert projections (gate_up and down) of four models (moe_shapes.py) at decode (64 tokens)
and prefill (4096 tokens). Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._vendor.compile_case import SHORT, Built, CompileCase, abstract_ragged_dot, forward_or_grad, fwd_bwd, with_smoke
from ._vendor.moe_shapes import MOE_MODELS, PHASES

Tiles = dict[str, int] | None


def mosaic_ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, config: Any = None) -> Any:
    """The Pallas path, lowered to Mosaic (never interpreted)."""
    from .api import ragged_dot

    return ragged_dot(lhs, rhs, group_sizes, implementation="pallas", interpret=False, config=config)


def builder(m: int, k: int, n: int, g: int, dtype: str, tiles: Tiles = None) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the forward, or its gradients in lhs and rhs (the transposed gmm for d_lhs, tgmm for d_rhs)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            from .config import RaggedDotConfig

            cfg = None if not tiles else RaggedDotConfig(**tiles)
            fn = lambda lhs, rhs, gs: mosaic_ragged_dot(lhs, rhs, gs, cfg)
            return forward_or_grad(fn, abstract_ragged_dot(m, k, n, g, dtype), grad, (0, 1))

        return build

    return make


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; the first forward and backward validation cases are also tagged "smoke"."""
    from .validation import cases

    out: list[CompileCase] = []
    for c in cases("tpu"):
        if c.implementation == "pallas":
            backward = c.tags[0] in ("decode", "prefill") or c.name.startswith("ragged_m")
            out += fwd_bwd(c.name, c.dtype, ("validation", c.dtype, *c.tags),
                           builder(c.m, c.k, c.n, c.g, c.dtype, dict(c.config) if c.config else None), backward)
    for geo in MOE_MODELS:
        for phase, tokens in PHASES.items():
            for proj, m, k, n, g in geo.projections(tokens):
                for dtype, short in SHORT.items():  # f32 forward; the training-sized backward in bf16
                    tags = ("model", geo.model, phase, proj, dtype)
                    out += fwd_bwd(f"{geo.model}:{phase}:{proj}:{short}", dtype, tags, builder(m, k, n, g, dtype),
                                   phase == "prefill" and short == "bf16")
    return with_smoke(out, {out[0].name, out[1].name})
