"""What the cost model's worker rows share: the ragged_dot package with the MoE geometries it vendors, a uniform
top-k routing over its experts, and the ideal time a modeled time is set against. Runs in the TPU environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from kernel_hub.json_types import JsonDict
from kernel_hub.tpu.worker_common import load_package

from .rates import stream_bytes_per_s

if TYPE_CHECKING:
    from kernel_hub.tpu.chips import Chip


class MoeGeometry(Protocol):
    """A MoE model's layer shapes, as a ragged_dot package vendors them (`_vendor.moe_shapes.MoeGeometry`)."""

    model: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    def projections(self, tokens: int) -> tuple[tuple[str, int, int, int, int], ...]:
        """(projection, m, k, n, groups) of each ragged dot a layer runs for `tokens` tokens."""
        ...


class HeadGeometry(Protocol):
    """A model's attention heads, as an attention package vendors them (`_vendor.attention_shapes.HeadGeometry`)."""

    model: str
    hq: int
    hkv: int
    d: int
    window: int | None
    sinks: bool


class AttentionShapes(Protocol):
    """The attention workloads a peer table runs: `_vendor.attention_shapes`, or smaller ones for a quick check."""

    PREFILL_TOKENS: int
    DECODE_BATCH: int
    DECODE_CACHE: int


class MoeKernel(NamedTuple):
    """A request's ragged_dot package with the MoE geometries it vendors (the model workers' common start)."""

    rd: ModuleType  # the package, imported through the verified loader
    shapes: ModuleType  # its _vendor.moe_shapes module (MOE_MODELS, PHASES)
    geos: dict[str, MoeGeometry]  # model name -> geometry


def load_moe_kernel(package: JsonDict | str | Path) -> MoeKernel:
    """load_package of a ragged_dot package, with its MoE geometries by model name; raises as load_package does."""
    rd = load_package(package)
    shapes = importlib.import_module(f"{rd.__name__}._vendor.moe_shapes")
    return MoeKernel(rd, shapes, {g.model: g for g in shapes.MOE_MODELS})


def topk_routing(tokens: int, experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    """ids [tokens, top_k] of a uniform routing: each token picks top_k distinct experts."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].astype(np.int32)


def routing(tokens: int, experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    """Group sizes of a uniform top-k routing: each token picks top_k distinct experts."""
    return np.bincount(topk_routing(tokens, experts, top_k, seed).ravel(), minlength=experts).astype(np.int32)


def ideal_seconds(bytes_: float, flops: float, c: Chip) -> float:
    """The ideal time of a workload on chip `c`: its bytes once at HBM bandwidth, or its FLOPs at peak if longer."""
    return max(bytes_ / stream_bytes_per_s(c), flops / c.bf16_flops_per_s)
