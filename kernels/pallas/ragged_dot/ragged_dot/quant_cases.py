"""TPU compile cases of the quantized ragged dot (tpu_cases.py appends them): int8 per-channel and fp8 block weights
at the expert projections of the two seed models (Qwen3-30B-A3B, Gemma 4 26B-A4B), decode (64 tokens) and prefill
(4096), bf16 activations; Qwen's gate_up also with f32 activations at decode and its gradient in lhs at prefill (each
f32 or backward case costs libtpu 5-50 CPU seconds, so one geometry stands for both); and moe_experts on quantized
weights at a validation shape, forward and backward. Never imports kernel_hub."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._vendor.compile_case import Built, CompileCase, fwd_bwd
from ._vendor.moe_shapes import MOE_MODELS, PHASES

#: The models whose geometry the quantized cases cover (the issue's seed models).
SEED_MODELS = ("qwen3_30b_a3b", "gemma4_26b_a4b")
FORMATS = {"int8": "int8", "fp8": "float8_e4m3fn"}


def abstract_quantized(m: int, k: int, n: int, g: int, dtype: str, fmt: str) -> tuple[Any, ...]:
    """lhs [M, K] in `dtype`, rhs [G, K, N] quantized, its f32 scales, group sizes [G], as ShapeDtypeStructs."""
    import jax
    import jax.numpy as jnp

    from .quant import scale_shape

    wdt = FORMATS[fmt]
    return (jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), wdt),
            jax.ShapeDtypeStruct(scale_shape((g, k, n), wdt), jnp.float32), jax.ShapeDtypeStruct((g,), jnp.int32))


def quant_builder(m: int, k: int, n: int, g: int, dtype: str, fmt: str) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the quantized forward lowered to Mosaic, or its gradient in lhs."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax
            import jax.numpy as jnp

            from .api import ragged_dot

            fn = lambda lhs, rhs, s, gs: ragged_dot(lhs, rhs, gs, rhs_scale=s, implementation="pallas",
                                                    interpret=False)
            args = abstract_quantized(m, k, n, g, dtype, fmt)
            if not grad:
                return fn, args
            return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=0), args

        return build

    return make


def moe_quant_builder(fmt: str, t: int = 24, h: int = 256, i: int = 128, e: int = 16, k: int = 4
                      ) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): moe_experts on quantized gate_up and down weights (one chip), or its gradient in x."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax
            import jax.numpy as jnp

            from .moe.experts import moe_experts
            from .quant import scale_shape

            sds, wdt = jax.ShapeDtypeStruct, FORMATS[fmt]
            args = (sds((t, h), "bfloat16"), sds((t, k), jnp.int32), sds((t, k), "bfloat16"),
                    sds((e, h, 2 * i), wdt), sds((e, i, h), wdt),
                    sds(scale_shape((e, h, 2 * i), wdt), jnp.float32), sds(scale_shape((e, i, h), wdt), jnp.float32))
            fn = lambda x, ids, w, gu, d, sgu, sd: moe_experts(x, ids, w, gu, d, w_gate_up_scale=sgu, w_down_scale=sd,
                                                               implementation="pallas", interpret=False)
            if not grad:
                return fn, args
            return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 2)), args

        return build

    return make


def quant_compile_cases() -> list[CompileCase]:
    """Every quantized TPU compile case (tags "quantized", the format, and the model/phase/projection ones)."""
    out: list[CompileCase] = []
    for geo in MOE_MODELS:
        if geo.model not in SEED_MODELS:
            continue
        for phase, tokens in PHASES.items():
            for proj, m, k, n, g in geo.projections(tokens):
                first = geo.model == SEED_MODELS[0] and proj == "gate_up"
                for fmt in FORMATS:
                    tags = ("model", "quantized", fmt, geo.model, phase, proj)
                    out += fwd_bwd(f"{geo.model}:{phase}:{proj}:{fmt}:bf16", "bfloat16", (*tags, "bfloat16"),
                                   quant_builder(m, k, n, g, "bfloat16", fmt), phase == "prefill" and first)
                    if phase == "decode" and first:
                        out += fwd_bwd(f"{geo.model}:{phase}:{proj}:{fmt}:f32", "float32", (*tags, "float32"),
                                       quant_builder(m, k, n, g, "float32", fmt), False)
    for fmt in FORMATS:
        out += fwd_bwd(f"moe_quantized_{fmt}_bf16", "bfloat16", ("validation", "quantized", fmt, "moe", "bfloat16"),
                       moe_quant_builder(fmt), True)
    return out
