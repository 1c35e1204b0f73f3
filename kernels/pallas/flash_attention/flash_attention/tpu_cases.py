"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu,
ahead of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

`compile_cases()` lists cases; each `build()` returns (function, abstract arguments as ShapeDtypeStructs).
Cases: every TPU validation scenario through the Pallas kernels (prefill forward, its backward = the dk/dv
and dq kernels, and decode), bf16 and f32, plus four models' attention geometries at prefill (4096 tokens,
causal) and decode (batch 64 over a long cache); ragged paged attention on the product's geometries (decode batch 64
over 8k positions, a mixed prefill + decode batch) and its small validation problems. Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._vendor.attention_compile import abstract_inputs, attention_compile_cases
from ._vendor.compile_case import SHORT, Built, CompileCase, forward_or_grad
from .paged_cases import PagedScenario, abstract_paged, compile_scenarios, features
from .validation import _LARGE, Scenario


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


def paged_builder(sc: PagedScenario, dtype: str) -> Callable[[], Built]:
    """ragged_paged_attention lowered to Mosaic on a scenario's abstract inputs (traced metadata: clamped)."""

    def build() -> Built:
        from .paged import ragged_paged_attention

        def fn(*args: Any) -> Any:
            sinks = args[9] if sc.sinks else None
            return ragged_paged_attention(*args[:9], sinks=sinks, implementation="pallas", interpret=False,
                                          **features(sc))

        return fn, abstract_paged(sc, dtype)

    return build


#: The ragged paged attention cases the quick compile subset includes.
PAGED_SMOKE = frozenset({"fwd:paged:mixed_gqa_window:bf16"})


def paged_compile_cases() -> list[CompileCase]:
    """Ragged paged attention: each model problem in bf16 (the serving dtype; an f32 cache of Gemma 4's sliding
    layers at 64 x 8k is 16 GiB, past a v5e's HBM), each small one in bf16 and f32."""
    out = []
    for sc, tags in compile_scenarios():
        for dtype in ("bfloat16",) if "model" in tags else tuple(SHORT):
            name = f"fwd:paged:{sc.name}:{SHORT[dtype]}"
            smoke = ("smoke",) if name in PAGED_SMOKE else ()
            out.append(CompileCase(name, dtype, (*tags, "paged", dtype, "fwd", *smoke), paged_builder(sc, dtype)))
    return out


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case (attention_compile.py: the validation scenarios and the model geometries; then ragged
    paged attention's); a small prefill (forward + backward), decode and paged problem are also tagged "smoke"."""
    return attention_compile_cases(builder, _LARGE) + paged_compile_cases()
