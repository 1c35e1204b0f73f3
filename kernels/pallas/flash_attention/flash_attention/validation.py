"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

Each case (AttentionCase, _vendor/attention_cases.py) makes fresh random inputs, calls the loaded module and
computes the independent NumPy float64 reference; the harness owns the verdict. On CPU the "pallas" cases run the
kernels interpreted (small shapes, 128-wide blocks so several blocks and the block-skipping index maps are
exercised); cases tagged tpu_interpret run the TPU simulator with race detection, which raises on a race.
framework="torch": the prefill scenarios through the torch-facing entry (torch_api.py). Ragged paged attention's
cases (paged_cases.PagedCase) check the output and both updated caches against the float64 reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._vendor.attention_cases import AttentionCase, Scenario
from ._vendor.cases import DTYPES, SHORT
from .paged_cases import SMALL as PAGED_SMALL
from .paged_cases import PagedCase

#: Small problems for CPU: interpreted kernels cost per grid step in proportion to operand bytes.
_SMALL = (
    Scenario("causal_gqa_d128", b=2, hq=4, hkv=2, sq=256, skv=256, d=128, causal=True),
    Scenario("noncausal_mha_d64", b=1, hq=2, hkv=2, sq=200, skv=136, d=64),
    Scenario("mqa_window_d64", b=2, hq=4, hkv=1, sq=256, skv=256, d=64, causal=True, window=100),
    Scenario("softcap_sinks_d256", b=1, hq=2, hkv=1, sq=160, skv=160, d=256, causal=True, soft_cap=20.0, sinks=True),
    Scenario("ragged_kvcache_d64", b=3, hq=4, hkv=2, sq=130, skv=300, d=64, causal=True, ragged=True, sinks=True),
    Scenario("decode_gqa_ragged_d64", b=8, hq=8, hkv=2, sq=1, skv=384, d=64, decode=True, sinks=True, window=200),
    Scenario("decode_mqa_d128", b=4, hq=4, hkv=1, sq=1, skv=256, d=128, decode=True, soft_cap=30.0),
)

#: Chip-sized problems for real TPUs and GPUs (one compile each; the work is trivial there).
_LARGE = (
    Scenario("causal_gqa_d128", b=2, hq=8, hkv=2, sq=1024, skv=1024, d=128, causal=True),
    Scenario("mqa_window_d64", b=2, hq=8, hkv=1, sq=1024, skv=1024, d=64, causal=True, window=256),
    Scenario("softcap_sinks_d256", b=1, hq=4, hkv=2, sq=512, skv=512, d=256, causal=True, soft_cap=20.0, sinks=True),
    Scenario("ragged_kvcache_d64", b=4, hq=8, hkv=2, sq=384, skv=1280, d=64, causal=True, ragged=True, sinks=True),
    Scenario("decode_gqa_ragged_d64", b=64, hq=64, hkv=8, sq=1, skv=2048, d=64, decode=True, sinks=True, window=128),
)

_SMALL_BLOCKS = (("block_q", 128), ("block_kv", 128), ("decode_block_kv", 128), ("cpu_block_q", 64),
                 ("heads_per_block", 4))


def _case(sc: Scenario, dtype: str, impl: str, *tags: str, **kw: Any) -> AttentionCase:
    kind = "decode" if sc.decode else "prefill"
    name = f"{kind}:{sc.name}:{impl}{':tpu-interpret' if kw.get('interpret') else ''}:{SHORT[dtype]}"
    return AttentionCase(name=name, dtype=dtype, implementation=impl, tags=(kind, impl, *tags), scenario=sc, **kw)


def _paged_cases(backend: str) -> list[PagedCase]:
    """CPU: the page walk on each small problem (dtypes alternating), the interpreted kernel, the gather path and
    the TPU simulator with race detection on one each. TPU / GPU: every small problem on each implementation."""
    def case(sc, dtype, impl, *tags, **kw):
        mode = ":tpu-interpret" if kw.get("interpret") else ""
        return PagedCase(name=f"paged:{sc.name}:{impl}{mode}:{SHORT[dtype]}", dtype=dtype, implementation=impl,
                         tags=("paged", impl, *tags), scenario=sc, **kw)

    if backend == "cpu":
        out = [case(sc, DTYPES[i % 2], "cpu", DTYPES[i % 2]) for i, sc in enumerate(PAGED_SMALL)]
        out.append(case(PAGED_SMALL[0], "bfloat16", "pallas", "interpret"))
        out.append(case(PAGED_SMALL[0], "float32", "xla", "float32"))
        out.append(case(PAGED_SMALL[1], "float32", "pallas", "tpu_interpret", interpret="tpu"))
        return out
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    return [case(sc, dtype, impl, dtype) for sc in PAGED_SMALL for impl in impls for dtype in DTYPES]


def _torch_cases() -> list[AttentionCase]:
    """The prefill scenarios (GQA, MQA + window, softcap + sinks, ragged lengths) through the torch entry."""
    return [AttentionCase(name=f"torch:{sc.name}:{dtype}", dtype=dtype, implementation=None,
                          tags=("prefill", "torch", dtype), framework="torch", scenario=sc)
            for sc in _SMALL if not sc.decode for dtype in DTYPES]


def cases(backend: str, framework: str = "jax") -> list[AttentionCase]:
    """Every scenario x implementation for this backend, in f32 and bf16."""
    if framework == "torch":
        return _torch_cases()
    backend = backend.lower()
    out: list[AttentionCase] = []
    if backend == "cpu":
        for i, sc in enumerate(_SMALL):
            for dtype in DTYPES:
                out.append(_case(sc, dtype, "cpu", dtype, config=_SMALL_BLOCKS))
            # the interpreted kernel alternates dtypes to keep the run short
            out.append(_case(sc, DTYPES[i % 2], "pallas", "interpret", config=_SMALL_BLOCKS))
        out.append(_case(_SMALL[1], "float32", "xla", "float32"))
        out.append(_case(_SMALL[4], "bfloat16", "xla", "bfloat16"))
        tiny = dataclasses.replace(_SMALL[4], b=2, hq=2, hkv=1, sq=130, skv=260)
        out.append(_case(tiny, "float32", "pallas", "tpu_interpret", interpret="tpu", config=_SMALL_BLOCKS))
        out.append(_case(_SMALL[5], "float32", "pallas", "tpu_interpret", interpret="tpu", config=_SMALL_BLOCKS))
        return out + _paged_cases(backend)
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    for sc in _LARGE:
        for impl in impls:
            for dtype in DTYPES:
                out.append(_case(sc, dtype, impl, dtype))
    return out + _paged_cases(backend)
