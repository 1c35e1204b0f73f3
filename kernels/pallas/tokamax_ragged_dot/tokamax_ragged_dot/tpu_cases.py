"""TPU compile cases: the wrapper as a TPU user calls it (default implementation order: Tokamax's Mosaic ragged
dot, then Tokamax's XLA path where Mosaic refuses, e.g. "Not supported on TPU v4"), lowered and compiled by
kernel-hub's compile gate with the real TPU compiler (libtpu, ahead of time, one mock TPU per generation); the
gate records which implementation compiled (the kernel contract's last_implementation()).

`compile_cases()` lists CompileCases (compile_case.py, vendored): the shapes of the Mosaic validation cases
(forward and backward) in bf16 and f32, and the MoE expert projections of four models (moe_shapes.py, vendored)
at decode and prefill. Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable

from ._vendor.compile_case import Built, CompileCase, abstract_ragged_dot, forward_or_grad, fwd_bwd, with_smoke
from ._vendor.moe_shapes import model_compile_cases


def builder(m: int, k: int, n: int, g: int, dtype: str) -> Callable[[bool], Callable[[], Built]]:
    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            from .api import ragged_dot

            fn = lambda lhs, rhs, gs: ragged_dot(lhs, rhs, gs)  # default order, as a user calls it
            return forward_or_grad(fn, abstract_ragged_dot(m, k, n, g, dtype), grad, (0, 1))

        return build

    return make


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; the first forward and backward are also tagged "smoke"."""
    from .validation import cases

    out: list[CompileCase] = []
    for c in cases("tpu"):
        if c.implementation == "mosaic":
            out += fwd_bwd(c.name.removeprefix("mosaic_"), c.dtype, ("validation", c.dtype, *c.tags),
                           builder(c.m, c.k, c.n, c.g, c.dtype), backward=True)
    out += model_compile_cases(builder)
    return with_smoke(out, {out[0].name, out[1].name})
