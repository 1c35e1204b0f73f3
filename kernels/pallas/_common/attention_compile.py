"""TPU compile cases of attention, for every kernel with flash-attention-tpu's contract.

Which problems the compile gate compiles (each validation scenario, prefill forward + backward and decode, in
bf16 and f32; each model geometry of attention_shapes.py at prefill and decode, its backward in bf16) and their
abstract inputs. How a kernel is called on them (its `builder`) stays in the kernel's own tpu_cases.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .attention_cases import Scenario
from .attention_shapes import ATTENTION_MODELS, DECODE_BATCH, DECODE_CACHE, PREFILL_TOKENS, HeadGeometry
from .compile_case import SHORT, Built, CompileCase, fwd_bwd, with_smoke

#: A kernel's builder: (scenario, dtype) -> make(grad) -> build() -> (function, abstract arguments).
Builder = Callable[[Scenario, str], Callable[[bool], Callable[[], Built]]]

#: The quick subset the tests compile: a small prefill (forward + backward) and a ragged decode.
SMOKE = frozenset({"fwd:prefill:causal_gqa_d128:bf16", "bwd:prefill:causal_gqa_d128:bf16",
                   "fwd:decode:decode_gqa_ragged_d64:bf16"})


def model_scenario(geo: HeadGeometry, phase: str, *, sinks: bool = True) -> Scenario:
    """A model's heads at prefill (PREFILL_TOKENS, causal) or decode (DECODE_BATCH over DECODE_CACHE); `sinks`
    False for a kernel without attention sinks (the model then runs without them)."""
    with_sinks = geo.sinks and sinks
    if phase == "decode":
        return Scenario(f"{geo.model}_decode", b=DECODE_BATCH, hq=geo.hq, hkv=geo.hkv, sq=1, skv=DECODE_CACHE,
                        d=geo.d, window=geo.window, sinks=with_sinks, decode=True)
    return Scenario(f"{geo.model}_prefill", b=1, hq=geo.hq, hkv=geo.hkv, sq=PREFILL_TOKENS, skv=PREFILL_TOKENS,
                    d=geo.d, causal=True, window=geo.window, sinks=with_sinks)


def abstract_inputs(sc: Scenario, dtype: str) -> dict[str, Any]:
    """ShapeDtypeStructs for one scenario: q, k, v and the optional sinks / lengths it uses, by keyword."""
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


def scenario_cases(sc: Scenario, dtype: str, tags: tuple[str, ...], builder: Builder,
                   backward: bool) -> list[CompileCase]:
    """The forward case of one scenario and, for a prefill with `backward`, its gradient."""
    kind = "decode" if sc.decode else "prefill"
    return fwd_bwd(f"{kind}:{sc.name}:{SHORT[dtype]}", dtype, (*tags, kind, dtype), builder(sc, dtype),
                   backward and not sc.decode)


def attention_compile_cases(builder: Builder, validation: Iterable[Scenario], *,
                            sinks: bool = True) -> list[CompileCase]:
    """Every TPU compile case of an attention kernel: `validation` scenarios forward and backward in each dtype,
    each model geometry at prefill and decode (f32 forward; the training-sized backward in bf16); SMOKE tagged."""
    out: list[CompileCase] = []
    for sc in validation:
        for dtype in SHORT:
            out += scenario_cases(sc, dtype, ("validation",), builder, backward=True)
    for geo in ATTENTION_MODELS:
        for phase in ("prefill", "decode"):
            for dtype in SHORT:
                out += scenario_cases(model_scenario(geo, phase, sinks=sinks), dtype, ("model", geo.model), builder,
                                      dtype == "bfloat16")
    return with_smoke(out, set(SMOKE))
