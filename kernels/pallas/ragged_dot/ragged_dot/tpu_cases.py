"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu,
ahead of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

`compile_cases()` lists CompileCases; each `build()` returns (function, abstract arguments). Cases: the
Pallas path of every TPU validation case, forward and backward (the custom_vjp's gmm + tgmm), in bf16 and
f32, the MoE expert projections (gate_up and down) of four models (moe_shapes.py) at decode (64 tokens)
and prefill (4096 tokens), the moe_experts validation cases (one chip, forward and backward), and the quantized
(int8, fp8) cases of quant_cases.py; `moe_route` (alone, and at decode with the norm before it: the residual add, or
a per-expert scale) at the seed models' routers (Qwen3-30B-A3B: 2048 x 128, top 8;
Gemma 4 26B-A4B: 2816 x 128, top 8; Mixtral 8x7B: 4096 x 8, top 2; GPT-OSS-20B: 2880 x 32, top 4) at decode and
prefill, reading a 48-layer stack at a traced layer; moe_experts' dense formulation on one device's experts of
Qwen3, Gemma 4 and Mixtral under 8-way expert parallelism at decode (64 tokens and 1), stacked, and in f32 with its
gradient, and with bf16 weights under f32 activations; moe_routed_experts' fused kernel at Qwen3's and Gemma 4's
decode (64 tokens). Never imports
kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._vendor.compile_case import Built, CompileCase, abstract_ragged_dot, forward_or_grad, fwd_bwd, with_smoke
from ._vendor.moe_shapes import model_compile_cases
from .quant_cases import quant_builder, quant_compile_cases
from .quant_validation import QuantCase

Tiles = dict[str, int] | None


def mosaic_ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, config: Any = None) -> Any:
    """The Pallas path, lowered to Mosaic (never interpreted)."""
    from .api import ragged_dot

    return ragged_dot(lhs, rhs, group_sizes, implementation="pallas", interpret=False, config=config)


def builder(m: int, k: int, n: int, g: int, dtype: str, tiles: Tiles = None) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the forward, or its gradients in lhs and rhs (the transposed gmm for d_lhs, tgmm for d_rhs)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            from .pallas.config import RaggedDotConfig

            cfg = None if not tiles else RaggedDotConfig(**tiles)
            fn = lambda lhs, rhs, gs: mosaic_ragged_dot(lhs, rhs, gs, cfg)
            return forward_or_grad(fn, abstract_ragged_dot(m, k, n, g, dtype), grad, (0, 1))

        return build

    return make


def moe_builder(case: Any) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): moe_experts on one chip at a validation case's shapes, or its gradients in x, topk_weights and
    both weights (the mesh layouts compile in tpu_cost_model.mesh, on an 8-chip slice)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax
            import jax.numpy as jnp

            from .moe.experts import moe_experts

            sds = jax.ShapeDtypeStruct
            args = (sds((case.t, case.h), case.dtype), sds((case.t, case.k), jnp.int32),
                    sds((case.t, case.k), case.dtype), sds((case.e, case.h, 2 * case.i), case.dtype),
                    sds((case.e, case.i, case.h), case.dtype))
            fn = lambda x, ids, w, gu, d: moe_experts(x, ids, w, gu, d, activation=case.activation,
                                                      implementation="pallas", interpret=False)
            return forward_or_grad(fn, args, grad, (0, 2, 3, 4))

        return build

    return make


#: (hidden, experts, top k) of the seed models' routers.
ROUTERS = {"qwen3_30b_a3b": (2048, 128, 8), "gemma4_26b_a4b": (2816, 128, 8), "mixtral_8x7b": (4096, 8, 2),
           "gpt_oss_20b": (2880, 32, 4)}


def route_builder(tokens: int, hidden: int, experts: int, k: int, dtype: str, normed: str = ""
                  ) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): moe_route on a router stacked over 48 layers; normed "add": with the residual add and the norm
    before it (Qwen3), "scaled": with the norm and a per-expert scale (Gemma 4's router), all stacked too."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .moe.route import moe_route

            sds = jax.ShapeDtypeStruct
            args = (sds((tokens, hidden), dtype), sds((48, hidden, experts), dtype), sds((), "int32"),
                    sds((48, hidden), dtype), sds((tokens, hidden), dtype), sds((48, experts), "float32"))
            kw = {"implementation": "pallas", "interpret": False, "top_k": k}
            if normed == "add":
                return (lambda x, w, i, n, r, s: moe_route(x, w, layer=i, norm_weight=n, residual=r, **kw)), args
            if normed == "scaled":
                return (lambda x, w, i, n, r, s: moe_route(x, w, layer=i, norm_weight=n, expert_scale=s, **kw)), args
            return (lambda x, w, i, n, r, s: moe_route(x, w, layer=i, **kw)), args

        return build

    return make


#: (layers, hidden, experts on one of 8 devices, I) of the seed models' expert blocks under 8-way expert parallelism.
DENSE_EXPERTS = {"qwen3_30b_a3b": (48, 2048, 16, 768), "gemma4_26b_a4b": (30, 2816, 16, 704),
                 "mixtral_8x7b": (32, 4096, 1, 14336)}


def dense_builder(tokens: int, hidden: int, experts: int, inter: int, dtype: str, layers: int | None,
                  weight_dtype: str | None = None) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): moe_experts(formulation="dense") on one device's experts (top 8 of 8x as many), the weights a
    stack of `layers` read at a traced layer, or unstacked (None) with the gradient in x, the routing weights and
    the weights. `weight_dtype`: weights of another dtype than x (bf16 under f32 activations)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax
            import jax.numpy as jnp

            from .moe.experts import moe_experts

            sds = jax.ShapeDtypeStruct
            lead = (layers,) if layers else ()
            wdt = weight_dtype or dtype
            args = (sds((tokens, hidden), dtype), sds((tokens, 8), jnp.int32), sds((tokens, 8), dtype),
                    sds((*lead, experts, hidden, 2 * inter), wdt), sds((*lead, experts, inter, hidden), wdt))
            kw = {"implementation": "pallas", "interpret": False, "formulation": "dense"}
            if layers:
                return (lambda x, ids, w, gu, d, i: moe_experts(x, ids, w, gu, d, layer=i, **kw)), (*args, sds((),
                                                                                                               "int32"))
            fn = lambda x, ids, w, gu, d: moe_experts(x, ids, w, gu, d, **kw)
            return forward_or_grad(fn, args, grad, (0, 2, 3, 4))

        return build

    return make


def routed_builder(tokens: int, hidden: int, experts: int, k: int, inter: int, form: str
                   ) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): moe_routed_experts' fused kernel at a seed model's router and experts (every expert on the
    chip: the program one device of an expert-parallel mesh runs, on 8x its experts), stacked over 2 layers read at
    a traced layer; form "add": the residual add and the norm (Qwen3), "scaled": Gemma 4's whole block after its
    attention (the post-attention norm and the add, a per-expert scale, the experts' and the shared MLP's own norms,
    and the shared MLP, one device's 264 of its 2112 columns)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .moe.routed import moe_routed_experts

            sds = jax.ShapeDtypeStruct
            bf = "bfloat16"
            args = (sds((tokens, hidden), bf), sds((2, hidden, experts), bf), sds((2, experts, hidden, 2 * inter), bf),
                    sds((2, experts, inter, hidden), bf), sds((), "int32"), sds((2, hidden), bf),
                    sds((tokens, hidden), bf), sds((2, experts), "float32"))
            kw = {"implementation": "pallas", "interpret": False, "top_k": k, "fuse": True}
            if form == "add":
                return (lambda x, w, gu, d, i, n, r, s: moe_routed_experts(x, w, gu, d, layer=i, norm_weight=n,
                                                                           residual=r, **kw)), args
            shared = (sds((2, hidden, 264), bf), sds((2, hidden, 264), bf), sds((2, 264, hidden), bf))
            return (lambda x, w, gu, d, i, n, r, s, sg, su, sd: moe_routed_experts(
                x, w, gu, d, layer=i, norm_weight=n, residual=r, expert_scale=s, expert_norm_weight=n, x_weight=n,
                shared_experts=(sg, su, sd), shared_norm_weight=n, activation="gelu", **kw)), (*args, *shared)

        return build

    return make


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; the first forward and backward validation cases are also tagged "smoke"."""
    from .validation import MoeCase, cases

    out: list[CompileCase] = []
    for c in cases("tpu"):
        if isinstance(c, MoeCase):  # routings and a one-device mesh compile the same program: one per dtype/gate
            if c.routing == "random" and not c.mesh:
                out += fwd_bwd(c.name, c.dtype, ("validation", c.dtype, *c.tags), moe_builder(c), True)
        elif isinstance(c, QuantCase):  # quantized weights: the forward at the case's shapes
            out += fwd_bwd(c.name, c.dtype, ("validation", c.dtype, *c.tags), quant_builder(c.m, c.k, c.n, c.g,
                                                                                           c.dtype, c.fmt), False)
        elif c.implementation == "pallas":
            backward = c.tags[0] in ("decode", "prefill") or c.name.startswith("ragged_m")
            out += fwd_bwd(c.name, c.dtype, ("validation", c.dtype, *c.tags),
                           builder(c.m, c.k, c.n, c.g, c.dtype, dict(c.config) if c.config else None), backward)
    out += model_compile_cases(builder)
    out += quant_compile_cases()
    for model, (hidden, experts, k) in ROUTERS.items():
        for phase, tokens in (("decode", 64), ("prefill", 4096)):
            out += fwd_bwd(f"route_{model}_{phase}_t{tokens}:bf16", "bfloat16", (phase, "bfloat16", "route"),
                           route_builder(tokens, hidden, experts, k, "bfloat16"), False)
        for normed in ("add", "scaled"):
            out += fwd_bwd(f"route_{model}_decode_t64_norm_{normed}:bf16", "bfloat16", ("decode", "bfloat16", "route"),
                           route_builder(64, hidden, experts, k, "bfloat16", normed), False)
    for model, (layers, hidden, experts, inter) in DENSE_EXPERTS.items():
        for tokens in (64, 1):
            out += fwd_bwd(f"dense_{model}_decode_t{tokens}_stacked:bf16", "bfloat16", ("decode", "bfloat16", "dense"),
                           dense_builder(tokens, hidden, experts, inter, "bfloat16", layers), False)
    for model, form in (("qwen3_30b_a3b", "add"), ("gemma4_26b_a4b", "scaled")):
        hidden, experts, k = ROUTERS[model]
        out += fwd_bwd(f"routed_{model}_decode_t64_{form}:bf16", "bfloat16", ("decode", "bfloat16", "routed"),
                       routed_builder(64, hidden, experts, k, DENSE_EXPERTS[model][3], form), False)
    out += fwd_bwd("dense_decode_t64_e4:f32", "float32", ("decode", "float32", "dense"),
                   dense_builder(64, 2048, 4, 768, "float32", None), True)
    out += fwd_bwd("dense_decode_t64_e4_bf16_weights:f32", "float32", ("decode", "float32", "dense"),
                   dense_builder(64, 2048, 4, 768, "float32", None, "bfloat16"), False)
    return with_smoke(out, {out[0].name, out[1].name})
