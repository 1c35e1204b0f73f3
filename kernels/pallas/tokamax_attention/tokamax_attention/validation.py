"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

Fresh random inputs, a call into the loaded module, and the NumPy float64 reference of flash-attention-tpu
(AttentionCase, vendored shared code); the harness owns the verdict. The scenarios are flash-attention-tpu's,
without attention sinks (Tokamax has none). They cover both ways the mask reaches Tokamax: native arguments
(Sq == Skv causal/window, lengths only) and the explicit mask (bottom-right causal with Sq != Skv or per-sequence
lengths, decode with a window). CPU runs Tokamax's "xla" in f32 and bf16 and "xla_chunked" alternating dtypes; TPU
runs Mosaic, GPU Triton, both with "xla" beside them. No torch entry: framework="torch" has no cases.
"""

from __future__ import annotations

from ._vendor.attention_cases import AttentionCase, Scenario
from ._vendor.cases import DTYPES, SHORT

#: flash-attention-tpu's CPU scenarios without sinks, plus causal with Sq > Skv (explicit mask, empty rows).
_SMALL = (
    Scenario("causal_gqa_d128", b=2, hq=4, hkv=2, sq=256, skv=256, d=128, causal=True),
    Scenario("noncausal_mha_d64", b=1, hq=2, hkv=2, sq=200, skv=136, d=64),
    Scenario("mqa_window_d64", b=2, hq=4, hkv=1, sq=256, skv=256, d=64, causal=True, window=100),
    Scenario("softcap_d256", b=1, hq=2, hkv=1, sq=160, skv=160, d=256, causal=True, soft_cap=20.0),
    Scenario("ragged_kvcache_d64", b=3, hq=4, hkv=2, sq=130, skv=300, d=64, causal=True, ragged=True),
    Scenario("causal_sq_gt_skv_d64", b=2, hq=2, hkv=1, sq=160, skv=96, d=64, causal=True),
    Scenario("decode_gqa_ragged_d64", b=8, hq=8, hkv=2, sq=1, skv=384, d=64, decode=True, window=200),
    Scenario("decode_mqa_d128", b=4, hq=4, hkv=1, sq=1, skv=256, d=128, decode=True, soft_cap=30.0),
)

#: Chip-sized problems for real TPUs and GPUs (one compile each; the work is trivial there).
_LARGE = (
    Scenario("causal_gqa_d128", b=2, hq=8, hkv=2, sq=1024, skv=1024, d=128, causal=True),
    Scenario("mqa_window_d64", b=2, hq=8, hkv=1, sq=1024, skv=1024, d=64, causal=True, window=256),
    Scenario("softcap_d256", b=1, hq=4, hkv=2, sq=512, skv=512, d=256, causal=True, soft_cap=20.0),
    Scenario("ragged_kvcache_d64", b=4, hq=8, hkv=2, sq=384, skv=1280, d=64, causal=True, ragged=True),
    Scenario("decode_gqa_ragged_d64", b=64, hq=64, hkv=8, sq=1, skv=2048, d=64, decode=True, window=128),
)


def _case(sc: Scenario, dtype: str, impl: str) -> AttentionCase:
    kind = "decode" if sc.decode else "prefill"
    return AttentionCase(name=f"{kind}:{sc.name}:{impl}:{SHORT[dtype]}", dtype=dtype, implementation=impl,
                         tags=(kind, impl, dtype), scenario=sc)


def cases(backend: str, framework: str = "jax") -> list[AttentionCase]:
    """Every scenario x implementation for this backend."""
    if framework != "jax":
        return []
    backend = backend.lower()
    out: list[AttentionCase] = []
    if backend == "cpu":
        for i, sc in enumerate(_SMALL):
            out += [_case(sc, dtype, "xla") for dtype in DTYPES]
            out.append(_case(sc, DTYPES[i % 2], "xla_chunked"))  # alternate to keep it short
        return out
    fast = {"tpu": "mosaic", "cuda": "triton", "gpu": "triton", "rocm": "triton"}.get(backend)
    for sc in _LARGE:
        for impl in (fast, "xla") if fast else ("xla",):
            out += [_case(sc, dtype, impl) for dtype in DTYPES]
    return out
