"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu,
ahead of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

`compile_cases()` lists cases; each `build()` returns (function, abstract arguments as ShapeDtypeStructs).
Cases: every TPU validation scenario through the Pallas kernels (prefill forward, its backward = the dk/dv
and dq kernels, and decode), bf16 and f32, plus four models' attention geometries at prefill (4096 tokens,
causal) and decode (batch 64 over a long cache). Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._vendor.attention_shapes import ATTENTION_MODELS, DECODE_BATCH, DECODE_CACHE, PREFILL_TOKENS, HeadGeometry
from ._vendor.compile_case import SHORT, Built, CompileCase, forward_or_grad, fwd_bwd, with_smoke
from .validation import _LARGE, Scenario


def model_scenario(geo: HeadGeometry, phase: str) -> Scenario:
    if phase == "decode":
        return Scenario(f"{geo.model}_decode", b=DECODE_BATCH, hq=geo.hq, hkv=geo.hkv, sq=1, skv=DECODE_CACHE,
                        d=geo.d, window=geo.window, sinks=geo.sinks, decode=True)
    return Scenario(f"{geo.model}_prefill", b=1, hq=geo.hq, hkv=geo.hkv, sq=PREFILL_TOKENS, skv=PREFILL_TOKENS,
                    d=geo.d, causal=True, window=geo.window, sinks=geo.sinks)


def abstract_inputs(sc: Scenario, dtype: str) -> dict[str, Any]:
    """ShapeDtypeStructs for one scenario: q, k, v and the optional sinks / lengths it uses."""
    import jax
    import jax.numpy as jnp

    sds = jax.ShapeDtypeStruct
    q_shape = (sc.b, sc.hq, sc.d) if sc.decode else (sc.b, sc.hq, sc.sq, sc.d)
    kv = sds((sc.b, sc.hkv, sc.skv, sc.d), dtype)
    out: dict[str, Any] = {"q": sds(q_shape, dtype), "k": kv, "v": kv}
    if sc.sinks:
        out["sinks"] = sds((sc.hq,), jnp.float32)
    if sc.decode:
        out["kv_lengths"] = sds((sc.b,), jnp.int32)
    elif sc.ragged:
        out["q_lengths"] = out["kv_lengths"] = sds((sc.b,), jnp.int32)
    return out


def mosaic_call(sc: Scenario, **kw: Any) -> Any:
    """The Pallas kernels, lowered to Mosaic (never interpreted), with the scenario's features."""
    from .api import decode_attention, flash_attention

    features = dict(sliding_window=sc.window, logits_soft_cap=sc.soft_cap, implementation="pallas",
                    interpret=False)
    if sc.decode:
        return decode_attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("kv_lengths"), **features, **kw)
    return flash_attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), causal=sc.causal, **features, **kw)


def builder(sc: Scenario, dtype: str) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the forward, or d/dq, dk, dv (the dk/dv and dq kernels after the forward)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            inputs = abstract_inputs(sc, dtype)
            keys = tuple(inputs)
            fn = lambda *args: mosaic_call(sc, **dict(zip(keys, args, strict=True)))
            return forward_or_grad(fn, tuple(inputs.values()), grad, (0, 1, 2))

        return build

    return make


def _cases_for(sc: Scenario, dtype: str, tags: tuple[str, ...], backward: bool) -> list[CompileCase]:
    kind = "decode" if sc.decode else "prefill"
    return fwd_bwd(f"{kind}:{sc.name}:{SHORT[dtype]}", dtype, (*tags, kind, dtype), builder(sc, dtype),
                   backward and not sc.decode)


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case; a small prefill (forward + backward) and decode are also tagged "smoke"."""
    out: list[CompileCase] = []
    for sc in _LARGE:
        for dtype in SHORT:
            out += _cases_for(sc, dtype, ("validation",), backward=True)
    for geo in ATTENTION_MODELS:
        for phase in ("prefill", "decode"):
            for dtype in SHORT:  # f32 for the forward; the training-sized backward in bf16
                out += _cases_for(model_scenario(geo, phase), dtype, ("model", geo.model), dtype == "bfloat16")
    return with_smoke(out, {"fwd:prefill:causal_gqa_d128:bf16", "bwd:prefill:causal_gqa_d128:bf16",
                            "fwd:decode:decode_gqa_ragged_d64:bf16"})
