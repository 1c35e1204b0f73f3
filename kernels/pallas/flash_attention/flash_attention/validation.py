"""Validation cases for the kernel-hub harness: `cases(backend)` -> fresh random inputs, a call into the
loaded module, and an independent NumPy float64 reference. The harness owns the verdict.

On CPU the "pallas" cases run the kernels interpreted (small shapes, 128-wide blocks so several blocks
and the block-skipping index maps are exercised); cases tagged tpu_interpret run the TPU simulator with
race detection, which raises on a race.
"""

from __future__ import annotations

import dataclasses
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
    sinks: bool = False
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
    interpret: str | None = None  # None: the module's default; "tpu": the TPU simulator with race checks
    config: dict[str, int] | None = None

    def inputs(self, seed: int) -> dict[str, Any]:
        import jax.numpy as jnp

        sc = self.scenario
        rng = np.random.default_rng(seed)
        q_shape = (sc.b, sc.hq, sc.d) if sc.decode else (sc.b, sc.hq, sc.sq, sc.d)
        kv_shape = (sc.b, sc.hkv, sc.skv, sc.d)
        cast = lambda x: np.asarray(jnp.asarray(x, dtype=self.dtype))
        out: dict[str, Any] = {
            "seed": seed,
            "q": cast(rng.standard_normal(q_shape)),
            "k": cast(rng.standard_normal(kv_shape)),
            "v": cast(rng.standard_normal(kv_shape)),
            "sinks": rng.standard_normal(sc.hq).astype(np.float32) if sc.sinks else None,
            "q_lengths": None,
            "kv_lengths": None,
        }
        if sc.decode:  # ragged by nature: lengths from 0 (empty slot) to the full cache
            lens = rng.integers(1, sc.skv + 1, size=sc.b)
            lens[0], lens[-1] = sc.skv, 0 if sc.b > 2 else lens[-1]
            out["kv_lengths"] = lens.astype(np.int32)
        elif sc.ragged:
            out["q_lengths"] = rng.integers(1, sc.sq + 1, size=sc.b).astype(np.int32)
            out["kv_lengths"] = np.maximum(out["q_lengths"], rng.integers(1, sc.skv + 1, size=sc.b)).astype(np.int32)
        return out

    def _features(self) -> dict[str, Any]:
        sc = self.scenario
        return {"sliding_window": sc.window, "logits_soft_cap": sc.soft_cap}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        sc = self.scenario
        kw: dict[str, Any] = dict(self._features(), implementation=self.implementation)
        if self.config:
            kw["config"] = module.AttentionConfig(**self.config)
        if self.interpret == "tpu":
            kw["interpret"] = module.tpu_interpret_params(seed=inputs["seed"])
        if inputs["sinks"] is not None:
            kw["sinks"] = jnp.asarray(inputs["sinks"])
        q, k, v = (jnp.asarray(inputs[n]) for n in ("q", "k", "v"))
        if sc.decode:
            return module.decode_attention(q, k, v, jnp.asarray(inputs["kv_lengths"]), **kw)
        for name in ("q_lengths", "kv_lengths"):
            if inputs[name] is not None:
                kw[name] = jnp.asarray(inputs[name])
        return module.flash_attention(q, k, v, causal=sc.causal, **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        sc = self.scenario
        common = dict(self._features(), sinks=inputs["sinks"])
        if sc.decode:
            return reference_decode_attention(inputs["q"], inputs["k"], inputs["v"], inputs["kv_lengths"], **common)
        return reference_attention(inputs["q"], inputs["k"], inputs["v"], causal=sc.causal,
                                   q_lengths=inputs["q_lengths"], kv_lengths=inputs["kv_lengths"], **common)


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

_SMALL_BLOCKS = {"block_q": 128, "block_kv": 128, "decode_block_kv": 128, "cpu_block_q": 64}


def _case(sc: Scenario, dtype: str, impl: str, *tags: str, **kw: Any) -> Case:
    name = f"{'decode' if sc.decode else 'prefill'}:{sc.name}:{impl}{':tpu-interpret' if kw.get('interpret') else ''}"
    kind = "decode" if sc.decode else "prefill"
    return Case(name=name, dtype=dtype, implementation=impl, tags=(kind, impl, *tags), scenario=sc, **kw)


@dataclass(frozen=True)
class TorchCase(Case):
    """A prefill scenario through the torch-facing entry: torch tensors in (jax is never imported, as in
    a torch-cpu build); the reference reads them through float32 NumPy, at the values the kernel saw."""

    def inputs(self, seed: int) -> dict[str, Any]:
        import torch

        sc = self.scenario
        rng = np.random.default_rng(seed)
        dt = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        mk = lambda *shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dt)
        kv_shape = (sc.b, sc.hkv, sc.skv, sc.d)
        out: dict[str, Any] = {"q": mk(sc.b, sc.hq, sc.sq, sc.d), "k": mk(*kv_shape), "v": mk(*kv_shape),
                               "sinks": mk(sc.hq).float() if sc.sinks else None, "q_lengths": None,
                               "kv_lengths": None}
        if sc.ragged:
            ql = rng.integers(1, sc.sq + 1, size=sc.b)
            out["q_lengths"] = torch.from_numpy(ql.astype(np.int32))
            kl = np.maximum(ql, rng.integers(1, sc.skv + 1, size=sc.b))
            out["kv_lengths"] = torch.from_numpy(kl.astype(np.int32))
        return out

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = {n: inputs[n] for n in ("sinks", "q_lengths", "kv_lengths") if inputs[n] is not None}
        out = module.flash_attention(inputs["q"], inputs["k"], inputs["v"], causal=self.scenario.causal,
                                     implementation=self.implementation, **self._features(), **kw)
        return out.float().numpy()

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        f = lambda name: None if inputs[name] is None else inputs[name].float().numpy()
        lengths = {n: None if inputs[n] is None else inputs[n].numpy() for n in ("q_lengths", "kv_lengths")}
        return reference_attention(f("q"), f("k"), f("v"), causal=self.scenario.causal, sinks=f("sinks"),
                                   **self._features(), **lengths)


def _torch_cases() -> list[Case]:
    """The prefill scenarios (GQA, MQA + window, softcap + sinks, ragged lengths) through the torch entry."""
    out: list[Case] = []
    for sc in _SMALL:
        if sc.decode:
            continue
        for dtype in ("float32", "bfloat16"):
            out.append(TorchCase(name=f"torch:{sc.name}:{dtype}", dtype=dtype, implementation=None,
                                 tags=("prefill", "torch", dtype), scenario=sc))
    return out


def cases(backend: str, framework: str = "jax") -> list[Case]:
    """Every scenario x implementation for this backend, in f32 and bf16; framework="torch": the cases
    for the torch-facing entry (torch_api.py), whatever the backend."""
    if framework == "torch":
        return _torch_cases()
    out: list[Case] = []
    if backend == "cpu":
        for i, sc in enumerate(_SMALL):
            for dtype in ("float32", "bfloat16"):
                out.append(_case(sc, dtype, "cpu", dtype, config=_SMALL_BLOCKS))
            # the interpreted kernel alternates dtypes to keep the run short
            out.append(_case(sc, ("float32", "bfloat16")[i % 2], "pallas", "interpret", config=_SMALL_BLOCKS))
        out.append(_case(_SMALL[1], "float32", "xla", "float32"))
        out.append(_case(_SMALL[4], "bfloat16", "xla", "bfloat16"))
        tiny = dataclasses.replace(_SMALL[4], b=2, hq=2, hkv=1, sq=130, skv=260)
        out.append(_case(tiny, "float32", "pallas", "tpu_interpret", interpret="tpu", config=_SMALL_BLOCKS))
        out.append(_case(_SMALL[5], "float32", "pallas", "tpu_interpret", interpret="tpu", config=_SMALL_BLOCKS))
        return out
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    for sc in _LARGE:
        for impl in impls:
            for dtype in ("float32", "bfloat16"):
                out.append(_case(sc, dtype, impl, dtype))
    return out
