"""Ragged paged attention problems: random inputs for validation and tests, and abstract ones for the compile gate.

A PagedScenario lists its sequences as (new tokens, length including them); its page table gives every sequence
`pages_per_seq` distinct pages in shuffled order out of a cache with spare pages, and `pad` extra token rows follow
the last sequence (padding). Nothing here imports kernel_hub.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._vendor.cases import Case, tensor


@dataclasses.dataclass(frozen=True)
class PagedScenario:
    name: str
    seqs: tuple[tuple[int, int], ...]  # (q_len, kv_len) per sequence; kv_len counts the new tokens
    hq: int
    hkv: int
    d: int
    page_size: int
    pages_per_seq: int
    spare_pages: int = 3
    pad: int = 0
    empty_slots: int = 0  # rows of kv_lens / page_indices past num_seqs
    causal: bool = True
    window: int | None = None
    soft_cap: float | None = None
    sinks: bool = False

    @property
    def tokens(self) -> int:
        return sum(q for q, _ in self.seqs) + self.pad

    @property
    def max_seqs(self) -> int:
        return len(self.seqs) + self.empty_slots

    @property
    def num_pages(self) -> int:
        return self.max_seqs * self.pages_per_seq + self.spare_pages


def paged_inputs(sc: PagedScenario, dtype: str, seed: int, framework: str = "jax") -> dict[str, Any]:
    """Fresh random inputs of one scenario (numpy metadata; tensors in `framework`)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: tensor(rng.standard_normal(shape).astype(np.float32), dtype, framework)
    s, n = sc.max_seqs, len(sc.seqs)
    q_lens = np.array([q for q, _ in sc.seqs] + [0] * sc.empty_slots, np.int32)
    kv_lens = np.array([k for _, k in sc.seqs] + [0] * sc.empty_slots, np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    table = rng.permutation(sc.num_pages)[: s * sc.pages_per_seq].reshape(s, sc.pages_per_seq).astype(np.int32)
    cache_shape = (sc.num_pages, sc.page_size, sc.hkv, sc.d)
    return {
        "seed": seed,
        "queries": normal(sc.tokens, sc.hq, sc.d),
        "keys": normal(sc.tokens, sc.hkv, sc.d),
        "values": normal(sc.tokens, sc.hkv, sc.d),
        "k_cache": normal(*cache_shape),
        "v_cache": normal(*cache_shape),
        "kv_lens": kv_lens,
        "page_indices": table,
        "cu_q_lens": cu,
        "num_seqs": n,
        "sinks": tensor(rng.standard_normal(sc.hq).astype(np.float32), "float32", framework) if sc.sinks else None,
    }


def features(sc: PagedScenario) -> dict[str, Any]:
    return {"sliding_window": sc.window, "soft_cap": sc.soft_cap, "causal": sc.causal}


def flat(out: Any, k_cache: Any, v_cache: Any) -> np.ndarray:
    """The output and both caches as one float64 vector: one number checks the attention and the cache update."""
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in (out, k_cache, v_cache)])


@dataclasses.dataclass(frozen=True)
class PagedCase(Case):
    """Validation case: the loaded module's ragged_paged_attention against reference_ragged_paged_attention (the
    output and both updated caches, compared as one vector)."""

    scenario: PagedScenario = dataclasses.field(default=PagedScenario("x", ((1, 1),), 1, 1, 128, 8, 1), repr=False)

    def inputs(self, seed: int) -> dict[str, Any]:
        return paged_inputs(self.scenario, self.dtype, seed)

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = dict(features(self.scenario), **self.entry_options(module, inputs["seed"]))
        if self.config:
            kw["config"] = module.AttentionConfig(**dict(self.config))
        args = [inputs[k] for k in ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices",
                                    "cu_q_lens", "num_seqs")]
        return flat(*module.ragged_paged_attention(*args, sinks=inputs["sinks"], **kw))

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        from .paged_reference import reference_ragged_paged_attention

        args = [inputs[k] for k in ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices",
                                    "cu_q_lens", "num_seqs")]
        return flat(*reference_ragged_paged_attention(*args, sinks=inputs["sinks"], **features(self.scenario)))


#: Small problems for CPU (interpreted kernel included): every feature, page boundaries, an empty sequence, padding.
SMALL = (
    PagedScenario("mixed_gqa_window", ((1, 1), (3, 17), (16, 16), (0, 9), (9, 9), (5, 60), (1, 50)), hq=4, hkv=2,
                  d=128, page_size=16, pages_per_seq=4, pad=3, empty_slots=1, window=24),
    PagedScenario("decode_mqa_softcap_sinks", ((1, 16), (1, 17), (1, 1), (1, 64)), hq=4, hkv=1, d=128,
                  page_size=16, pages_per_seq=4, soft_cap=15.0, sinks=True),
    PagedScenario("prefill_mha_noncausal", ((12, 30), (5, 5)), hq=8, hkv=8, d=128, page_size=16, pages_per_seq=2,
                  causal=False),
)


def compile_scenarios() -> list[tuple[PagedScenario, tuple[str, ...]]]:
    """The compile gate's problems: the product's two attention geometries (Qwen3-30B-A3B: 32 q / 4 kv heads x 128;
    Gemma 4 26B-A4B: sliding layers 16 / 8 x 256 with a 1024 window, global layers 16 / 2 x 512) at decode (64
    sequences over 8k positions, pages of 128) and a mixed batch (4 prefill chunks of 496 tokens beside 60 decode
    steps), plus the small validation problems."""
    out: list[tuple[PagedScenario, tuple[str, ...]]] = []
    geos = (("qwen3_30b_a3b", 32, 4, 128, None), ("gemma4_26b_a4b_sliding", 16, 8, 256, 1024),
            ("gemma4_26b_a4b_global", 16, 2, 512, None))
    for model, hq, hkv, d, window in geos:
        decode = tuple((1, 8192) for _ in range(64))
        mixed = tuple((496, 4096) for _ in range(4)) + tuple((1, 8192) for _ in range(60))
        out.append((PagedScenario(f"{model}_decode_b64_8k", decode, hq, hkv, d, 128, 64, spare_pages=0,
                                  window=window), ("model", model, "decode")))
        out.append((PagedScenario(f"{model}_mixed_4x496_60x1", mixed, hq, hkv, d, 128, 64, spare_pages=0, pad=4,
                                  window=window), ("model", model, "mixed")))
    out += [(sc, ("validation",)) for sc in SMALL]
    return out


def abstract_paged(sc: PagedScenario, dtype: str) -> tuple[Any, ...]:
    """ShapeDtypeStructs in ragged_paged_attention's argument order (sinks last when the scenario has them)."""
    import jax
    import jax.numpy as jnp

    sds = jax.ShapeDtypeStruct
    cache = sds((sc.num_pages, sc.page_size, sc.hkv, sc.d), dtype)
    args = (sds((sc.tokens, sc.hq, sc.d), dtype), sds((sc.tokens, sc.hkv, sc.d), dtype),
            sds((sc.tokens, sc.hkv, sc.d), dtype), cache, cache, sds((sc.max_seqs,), jnp.int32),
            sds((sc.max_seqs, sc.pages_per_seq), jnp.int32), sds((sc.max_seqs + 1,), jnp.int32),
            sds((), jnp.int32))
    return args + ((sds((sc.hq,), jnp.float32),) if sc.sinks else ())
