"""Validation cases for the kernel-hub harness: `cases(backend)` -> fresh random inputs, a call into the
loaded module, and the NumPy float64 reference of kernel-hub/flash-attention-tpu (reference.py is a
symlink to it). The harness owns the verdict.

The scenarios are flash-attention-tpu's, without attention sinks (Tokamax has none). They cover both
ways the mask reaches Tokamax: native arguments (Sq == Skv causal/window, lengths only) and the explicit
mask (bottom-right causal with Sq != Skv or per-sequence lengths, decode with a window). CPU runs
Tokamax's "xla" in f32 and bf16 and "xla_chunked" alternating dtypes; TPU runs Mosaic, GPU Triton, both
with "xla" beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .reference import reference_attention, reference_decode_attention


@dataclass(frozen=True)
class Scenario:
    """One problem: shapes and features; `decode` switches to decode_attention (q has no Sq axis)."""

    name: str
    b: int
    hq: int
    hkv: int
    sq: int
    skv: int
    d: int
    causal: bool = False
    window: int | None = None
    soft_cap: float | None = None
    ragged: bool = False
    decode: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str
    implementation: str | None
    tags: tuple[str, ...]
    tolerance: float | None = None
    scenario: Scenario = field(default=Scenario("x", 1, 1, 1, 8, 8, 64), repr=False)

    def inputs(self, seed: int) -> dict[str, Any]:
        import jax.numpy as jnp

        sc = self.scenario
        rng = np.random.default_rng(seed)
        q_shape = (sc.b, sc.hq, sc.d) if sc.decode else (sc.b, sc.hq, sc.sq, sc.d)
        kv_shape = (sc.b, sc.hkv, sc.skv, sc.d)
        cast = lambda x: np.asarray(jnp.asarray(x, dtype=self.dtype))
        out: dict[str, Any] = {
            "q": cast(rng.standard_normal(q_shape)),
            "k": cast(rng.standard_normal(kv_shape)),
            "v": cast(rng.standard_normal(kv_shape)),
            "q_lengths": None,
            "kv_lengths": None,
        }
        if sc.decode:  # lengths from 0 (an empty slot) to the full cache
            lens = rng.integers(1, sc.skv + 1, size=sc.b)
            lens[0], lens[-1] = sc.skv, 0 if sc.b > 2 else lens[-1]
            out["kv_lengths"] = lens.astype(np.int32)
        elif sc.ragged:
            out["q_lengths"] = rng.integers(1, sc.sq + 1, size=sc.b).astype(np.int32)
            out["kv_lengths"] = np.maximum(out["q_lengths"], rng.integers(1, sc.skv + 1, size=sc.b)).astype(np.int32)
        return out

    def _features(self) -> dict[str, Any]:
        return {"sliding_window": self.scenario.window, "logits_soft_cap": self.scenario.soft_cap}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        sc = self.scenario
        kw: dict[str, Any] = dict(self._features(), implementation=self.implementation)
        q, k, v = (jnp.asarray(inputs[n]) for n in ("q", "k", "v"))
        if sc.decode:
            return module.decode_attention(q, k, v, jnp.asarray(inputs["kv_lengths"]), **kw)
        for name in ("q_lengths", "kv_lengths"):
            if inputs[name] is not None:
                kw[name] = jnp.asarray(inputs[name])
        return module.flash_attention(q, k, v, causal=sc.causal, **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        sc = self.scenario
        if sc.decode:
            return reference_decode_attention(inputs["q"], inputs["k"], inputs["v"], inputs["kv_lengths"],
                                              **self._features())
        return reference_attention(inputs["q"], inputs["k"], inputs["v"], causal=sc.causal,
                                   q_lengths=inputs["q_lengths"], kv_lengths=inputs["kv_lengths"], **self._features())


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


def _case(sc: Scenario, dtype: str, impl: str, *tags: str) -> Case:
    kind = "decode" if sc.decode else "prefill"
    return Case(name=f"{kind}:{sc.name}:{impl}", dtype=dtype, implementation=impl, tags=(kind, impl, dtype, *tags),
                scenario=sc)


def cases(backend: str) -> list[Case]:
    """Every scenario x implementation for this backend."""
    backend = backend.lower()
    out: list[Case] = []
    if backend == "cpu":
        for i, sc in enumerate(_SMALL):
            out += [_case(sc, dtype, "xla") for dtype in ("float32", "bfloat16")]
            out.append(_case(sc, ("float32", "bfloat16")[i % 2], "xla_chunked"))  # alternate to keep it short
        return out
    fast = {"tpu": "mosaic", "cuda": "triton", "gpu": "triton", "rocm": "triton"}.get(backend)
    for sc in _LARGE:
        for impl in (fast, "xla") if fast else ("xla",):
            out += [_case(sc, dtype, impl) for dtype in ("float32", "bfloat16")]
    return out
