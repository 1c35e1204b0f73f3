"""What the cost model's worker rows share: the ragged_dot package with the MoE geometries it vendors, a uniform
top-k routing over its experts, and the ideal time a modeled time is set against. Runs in the TPU environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from kernel_hub.tpu.worker_common import load_package

from .rates import stream_bytes_per_s


class MoeKernel(NamedTuple):
    """A request's ragged_dot package with the MoE geometries it vendors (the model workers' common start)."""

    rd: Any  # the package, imported through the verified loader
    shapes: Any  # its _vendor.moe_shapes module (MOE_MODELS, PHASES)
    geos: dict[str, Any]  # model name -> geometry


def load_moe_kernel(package: dict[str, Any] | str | Path) -> MoeKernel:
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


def ideal_seconds(bytes_: float, flops: float, c: Any) -> float:
    """The ideal time of a workload on chip `c`: its bytes once at HBM bandwidth, or its FLOPs at peak if longer."""
    return max(bytes_ / stream_bytes_per_s(c), flops / c.bf16_flops_per_s)
