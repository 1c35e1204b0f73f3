"""The two seed models' decode-step geometry, and the HBM floor of one decode step on an 8-device TPU slice.

Pure Python (no jax): the step (decode_step.py), the cost rows (decode_worker.py) and bench/seed_decode.py read the
same numbers. Every value comes from the model's public config.json (the source is named beside it):

Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json; transformers' Qwen3MoeConfig names them): 48 layers, hidden 2048,
32 query / 4 KV heads x head_dim 128, q/k RMSNorm on the head dim, RoPE theta 1e6 over the whole head, 128 experts
top-8 with the top-k probabilities renormalised (norm_topk_prob true), expert intermediate 768, SiLU-gated,
RMSNorm eps 1e-6, vocab 151936, embedding and LM head untied.

Gemma 4 26B-A4B (google/gemma-4-26B-A4B text_config, as transformers' Gemma4TextConfig reads it): 30 layers in
5 groups of 5 sliding + 1 global; hidden 2816 (config.json's hidden_size; 2112 is its `intermediate_size`, the
shared expert's width, which some notes give as the hidden size); 16 query heads; sliding layers 8 KV heads x 256
with a 1024-token window and RoPE theta 1e4; global layers 2 KV heads x 512 with keys equal to values
(attention_k_eq_v) and RoPE theta 1e6 on a quarter of the head (partial_rotary_factor 0.25); q/k RMSNorm, a
scale-free v norm, attention scaling 1.0; sandwich norms (pre/post attention, pre/post feed-forward); a dense
GELU-gated MLP of 2112 (the shared expert) beside 128 experts top-8 of 704, GELU-gated (tanh); a router with its own
scale-free RMSNorm; vocab 262144, embedding tied to the LM head and scaled by sqrt(hidden), final logit soft cap 30.
"""

from __future__ import annotations

import dataclasses
import math

#: Seed run (HF's ragged-dot-tpu card): prompt 256 + up to 512 new tokens; the long case the issue adds.
CACHE_LENGTHS = {"seed_start": 257, "seed_end": 768, "long": 8192}
PAGE = 128


@dataclasses.dataclass(frozen=True)
class AttentionKind:
    """One kind of attention layer: KV heads, head dim, sliding window (None: global), RoPE, keys = values."""

    name: str
    kv_heads: int
    head_dim: int
    window: int | None
    rope_theta: float
    rotary_fraction: float = 1.0
    k_eq_v: bool = False


@dataclasses.dataclass(frozen=True)
class DecodeModel:
    name: str
    layers: int
    hidden: int
    vocab: int
    q_heads: int
    pattern: tuple[AttentionKind, ...]  # one group of layers; layers = groups x len(pattern)
    experts: int
    top_k: int
    moe_intermediate: int
    shared_intermediate: int  # a dense MLP beside the experts (Gemma 4's shared expert); 0: none
    activation: str  # the experts' gate ("silu", "gelu": tanh approximation)
    eps: float
    tied_embeddings: bool
    sandwich_norms: bool  # Gemma: norms after attention and after the feed-forward too
    v_norm: bool = False
    attention_scale: float | None = None  # None: 1/sqrt(head_dim)
    logit_softcap: float | None = None
    embed_scale: bool = False  # embeddings times sqrt(hidden)
    sources: str = ""

    @property
    def groups(self) -> int:
        if self.layers % len(self.pattern):
            raise ValueError(f"{self.name}: {self.layers} layers do not split into groups of {len(self.pattern)}")
        return self.layers // len(self.pattern)

    def layer_kinds(self) -> list[AttentionKind]:
        return list(self.pattern) * self.groups


QWEN3_30B_A3B = DecodeModel(
    "qwen3_30b_a3b", layers=48, hidden=2048, vocab=151936, q_heads=32,
    pattern=(AttentionKind("global", 4, 128, None, 1e6),), experts=128, top_k=8, moe_intermediate=768,
    shared_intermediate=0, activation="silu", eps=1e-6, tied_embeddings=False, sandwich_norms=False,
    sources="Qwen/Qwen3-30B-A3B config.json (transformers Qwen3MoeConfig field names)")

_SLIDING = AttentionKind("sliding", 8, 256, 1024, 1e4)
_GLOBAL = AttentionKind("global", 2, 512, None, 1e6, rotary_fraction=0.25, k_eq_v=True)
GEMMA4_26B_A4B = DecodeModel(
    "gemma4_26b_a4b", layers=30, hidden=2816, vocab=262144, q_heads=16, pattern=(_SLIDING,) * 5 + (_GLOBAL,),
    experts=128, top_k=8, moe_intermediate=704, shared_intermediate=2112, activation="gelu", eps=1e-6,
    tied_embeddings=True, sandwich_norms=True, v_norm=True, attention_scale=1.0, logit_softcap=30.0,
    embed_scale=True, sources="google/gemma-4-26B-A4B config.json text_config (transformers Gemma4TextConfig)")

MODELS = {m.name: m for m in (QWEN3_30B_A3B, GEMMA4_26B_A4B)}


def tiny(model: DecodeModel, groups: int = 1, head_dim: int = 32) -> DecodeModel:
    """The same architecture at a geometry a CPU runs in milliseconds (heads divisible by 2 devices); the last two
    kinds of its layer pattern (Gemma: a sliding and a global layer). head_dim 128 fits the TPU kernels' lanes."""
    pattern = tuple(dataclasses.replace(k, kv_heads=2, head_dim=head_dim if k.window else 2 * head_dim,
                                        window=None if k.window is None else 24) for k in model.pattern[-2:])
    w = 1 if head_dim < 128 else 4
    return dataclasses.replace(model, name=f"tiny_{model.name}", layers=len(pattern) * groups, hidden=64 * w,
                               vocab=256 * w, q_heads=8, pattern=pattern, experts=16, top_k=2,
                               moe_intermediate=32 * w, shared_intermediate=48 * w if model.shared_intermediate else 0)


# ---------------------------------------------------------------------------------------------- the floor

def kv_heads_per_device(kv_heads: int, devices: int) -> int:
    """KV heads one device holds under tensor parallelism: its share, or one replicated head when there are fewer
    KV heads than devices (each device keeps the head its query heads read)."""
    return max(1, kv_heads // devices)


def dense_weight_bytes_per_device(m: DecodeModel, devices: int, itemsize: int = 2) -> int:
    """Attention, norms, router and shared MLP of every layer on one device (attention and shared MLP split over
    the devices, router and norms replicated)."""
    total = 0
    for kind in m.layer_kinds():
        q = m.hidden * (m.q_heads // devices) * kind.head_dim
        kv = m.hidden * kv_heads_per_device(kind.kv_heads, devices) * kind.head_dim * (1 if kind.k_eq_v else 2)
        o = (m.q_heads // devices) * kind.head_dim * m.hidden
        norms = (4 if m.sandwich_norms else 2) * m.hidden + 2 * kind.head_dim
        router = m.hidden * m.experts + (m.hidden if m.sandwich_norms else 0)
        shared = 3 * m.hidden * m.shared_intermediate // devices + (3 * m.hidden if m.shared_intermediate else 0)
        total += q + kv + o + norms + router + shared
    return (total + m.hidden) * itemsize  # + the final norm


def expert_weight_bytes_per_device(m: DecodeModel, devices: int, itemsize: int = 2) -> int:
    """Every layer's experts on one device (E / devices whole experts each)."""
    return m.layers * (m.experts // devices) * 3 * m.hidden * m.moe_intermediate * itemsize


def embedding_bytes_per_device(m: DecodeModel, devices: int, itemsize: int = 2) -> int:
    """Vocab-sharded embedding table plus the LM head (the same table when tied)."""
    return (1 if m.tied_embeddings else 2) * (m.vocab // devices) * m.hidden * itemsize


def weight_bytes_per_device(m: DecodeModel, devices: int, itemsize: int = 2) -> int:
    return (dense_weight_bytes_per_device(m, devices, itemsize) + expert_weight_bytes_per_device(m, devices, itemsize)
            + embedding_bytes_per_device(m, devices, itemsize))


def experts_touched_fraction(batch: int, experts: int, top_k: int) -> float:
    """Expected share of experts a decode step reads: each token picks top_k distinct of E uniformly."""
    return 1.0 - (1.0 - top_k / experts) ** batch


def kv_bytes_read_per_device(m: DecodeModel, batch: int, cache: int, devices: int, itemsize: int = 2) -> int:
    """K and V one device reads in one step: each sequence's visible positions (its window on sliding layers)."""
    total = 0
    for kind in m.layer_kinds():
        seen = cache if kind.window is None else min(cache, kind.window)
        total += (1 if kind.k_eq_v else 2) * batch * seen * kv_heads_per_device(kind.kv_heads, devices) * \
            kind.head_dim * itemsize
    return total


def kv_cache_bytes_per_device(m: DecodeModel, batch: int, cache: int, devices: int, itemsize: int = 2) -> int:
    """The paged cache one device holds (pages of PAGE positions, K and V separate; keys = values stored once)."""
    pages = batch * math.ceil(cache / PAGE)
    return sum((1 if k.k_eq_v else 2) * pages * PAGE * kv_heads_per_device(k.kv_heads, devices) * k.head_dim *
               itemsize for k in m.layer_kinds())


def floor_bytes_per_device(m: DecodeModel, batch: int, cache: int, devices: int, itemsize: int = 2) -> int:
    """What one device must read from HBM in one decode step at least: dense weights, the experts a uniform routing
    touches on it, the embedding rows it owns and its LM-head shard, and the K/V it attends over."""
    experts = expert_weight_bytes_per_device(m, devices, itemsize) * experts_touched_fraction(batch, m.experts,
                                                                                               m.top_k)
    lm_head = (m.vocab // devices) * m.hidden * itemsize
    return int(dense_weight_bytes_per_device(m, devices, itemsize) + experts + lm_head
               + kv_bytes_read_per_device(m, batch, cache, devices, itemsize))


def floor_seconds(floor_bytes: int, hbm_bytes_per_s: float) -> float:
    """The floor's bytes at the device's spec HBM bandwidth."""
    return floor_bytes / hbm_bytes_per_s
