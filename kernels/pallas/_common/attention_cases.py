"""Validation cases of attention (prefill and decode), for every kernel with flash-attention-tpu's contract.

Fresh random q, k, v (and sinks, lengths) for a Scenario, the loaded module's `flash_attention` or
`decode_attention`, and the NumPy float64 reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .attention_reference import reference_attention, reference_decode_attention
from .cases import Case, tensor


@dataclasses.dataclass(frozen=True)
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
    sinks: bool = False
    ragged: bool = False
    decode: bool = False


@dataclasses.dataclass(frozen=True)
class AttentionCase(Case):
    scenario: Scenario = dataclasses.field(default=Scenario("x", 1, 1, 1, 8, 8, 64), repr=False)

    def inputs(self, seed: int) -> dict[str, Any]:
        sc, fw = self.scenario, self.framework
        rng = np.random.default_rng(seed)
        q_shape = (sc.b, sc.hq, sc.d) if sc.decode else (sc.b, sc.hq, sc.sq, sc.d)
        kv_shape = (sc.b, sc.hkv, sc.skv, sc.d)
        normal = lambda shape, dtype: tensor(rng.standard_normal(shape).astype(np.float32), dtype, fw)
        out: dict[str, Any] = {
            "seed": seed,
            "q": normal(q_shape, self.dtype),
            "k": normal(kv_shape, self.dtype),
            "v": normal(kv_shape, self.dtype),
            "sinks": normal((sc.hq,), "float32") if sc.sinks else None,
            "q_lengths": None,
            "kv_lengths": None,
        }
        if sc.decode:  # ragged by nature: lengths from 0 (an empty slot) to the full cache
            lens = rng.integers(1, sc.skv + 1, size=sc.b)
            lens[0], lens[-1] = sc.skv, 0 if sc.b > 2 else lens[-1]
            out["kv_lengths"] = tensor(lens.astype(np.int32), "int32", fw)
        elif sc.ragged:
            q_len = rng.integers(1, sc.sq + 1, size=sc.b)
            kv_len = np.maximum(q_len, rng.integers(1, sc.skv + 1, size=sc.b))
            out["q_lengths"] = tensor(q_len.astype(np.int32), "int32", fw)
            out["kv_lengths"] = tensor(kv_len.astype(np.int32), "int32", fw)
        return out

    def _features(self) -> dict[str, Any]:
        return {"sliding_window": self.scenario.window, "logits_soft_cap": self.scenario.soft_cap}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        sc = self.scenario
        kw = dict(self._features(), **self.entry_options(module, inputs["seed"]))
        if self.config:
            kw["config"] = module.AttentionConfig(**dict(self.config))
        if inputs["sinks"] is not None:
            kw["sinks"] = inputs["sinks"]
        if sc.decode:
            return module.decode_attention(inputs["q"], inputs["k"], inputs["v"], inputs["kv_lengths"], **kw)
        for name in ("q_lengths", "kv_lengths"):
            if inputs[name] is not None:
                kw[name] = inputs[name]
        return module.flash_attention(inputs["q"], inputs["k"], inputs["v"], causal=sc.causal, **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        sc = self.scenario
        common = dict(self._features(), sinks=inputs["sinks"])
        if sc.decode:
            return reference_decode_attention(inputs["q"], inputs["k"], inputs["v"], inputs["kv_lengths"], **common)
        return reference_attention(inputs["q"], inputs["k"], inputs["v"], causal=sc.causal,
                                   q_lengths=inputs["q_lengths"], kv_lengths=inputs["kv_lengths"], **common)
