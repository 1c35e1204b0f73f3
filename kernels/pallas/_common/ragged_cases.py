"""Validation cases of a ragged dot (grouped matmul), for every kernel with ragged-dot-tpu's contract.

Fresh random inputs (lhs [M,K], rhs [G,K,N] scaled by 1/sqrt(K), group sizes from a routing that exercises an edge
case), the loaded module's `ragged_dot`, and the NumPy float64 reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .cases import SHORT, Case, tensor
from .ragged_reference import reference_ragged_dot

#: How group sizes are drawn. All are deterministic in the seed.
ROUTINGS = ("random", "empty_groups", "one_group", "partial", "all_empty", "all_but_last_empty")


def make_group_sizes(routing: str, m: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """Group sizes summing to m (or less, for the routings that leave trailing rows)."""
    if routing == "random":
        return np.bincount(rng.integers(0, g, m), minlength=g)
    if routing == "empty_groups":  # about half the groups empty, others random
        live = rng.permutation(g)[: max(1, g // 2)]
        return np.bincount(live[rng.integers(0, live.size, m)], minlength=g)
    if routing == "one_group":
        sizes = np.zeros(g, np.int64)
        sizes[rng.integers(0, g)] = m
        return sizes
    if routing == "partial":  # rows past sum(group_sizes) must come out zero
        return np.bincount(rng.integers(0, g, max(1, (2 * m) // 3)), minlength=g)
    if routing == "all_empty":
        return np.zeros(g, np.int64)
    if routing == "all_but_last_empty":
        sizes = np.zeros(g, np.int64)
        sizes[-1] = m
        return sizes
    raise ValueError(f"unknown routing {routing!r}")


@dataclasses.dataclass(frozen=True)
class RaggedCase(Case):
    m: int = 128
    k: int = 128
    n: int = 128
    g: int = 8
    routing: str = "random"

    def inputs(self, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        lhs = rng.standard_normal((self.m, self.k), dtype=np.float32)
        rhs = rng.standard_normal((self.g, self.k, self.n), dtype=np.float32) / np.sqrt(self.k)
        sizes = make_group_sizes(self.routing, self.m, self.g, rng).astype(np.int32)
        return {
            "lhs": tensor(lhs, self.dtype, self.framework),
            "rhs": tensor(rhs, self.dtype, self.framework),
            "group_sizes": tensor(sizes, "int32", self.framework),
            "seed": seed,
        }

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = self.entry_options(module, inputs["seed"])
        if self.config:
            kw["config"] = module.RaggedDotConfig(**dict(self.config))
        return module.ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"], **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        return reference_ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"])


_EDGE_ROUTINGS = ("empty_groups", "one_group", "partial", "all_empty")
_SAME = object()


def workload_cases(impl: str | None, prefix: str, *, edge_impl: Any = _SAME, framework: str = "jax",
                   ragged_m: bool = True) -> list[RaggedCase]:
    """Decode (64 tokens x top-8 over 128 experts), prefill and edge shapes (empty groups, one group with every
    row, rows past the groups, no rows at all; ragged K/N) in f32 and bf16, plus M not a tile multiple (f32).
    `edge_impl` runs the edge shapes (default: `impl`)."""
    edge = impl if edge_impl is _SAME else edge_impl
    out = []
    for dt, s in SHORT.items():
        out += [
            RaggedCase(f"{prefix}decode_e128_{s}", dt, impl, ("decode",), framework=framework,
                       m=512, k=256, n=256, g=128),
            RaggedCase(f"{prefix}prefill_e8_{s}", dt, impl, ("prefill",), framework=framework,
                       m=1024, k=256, n=256, g=8),
        ]
        out += [RaggedCase(f"{prefix}{routing}_{s}", dt, edge, ("edge",), framework=framework,
                           m=200, k=136, n=72, g=16, routing=routing) for routing in _EDGE_ROUTINGS]
    if ragged_m:
        out.append(RaggedCase(f"{prefix}ragged_m_f32", "float32", edge, ("edge",), framework=framework,
                              m=77, k=96, n=160, g=6))
    return out


def oracle_cases() -> list[RaggedCase]:
    """jax.lax.ragged_dot ("xla") on small G, where its dense expansion is affordable."""
    return [
        RaggedCase("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=128, n=128, g=8),
        RaggedCase("xla_oracle_partial_bf16", "bfloat16", "xla", ("oracle", "edge"), m=100, k=128, n=64, g=8,
                   routing="partial"),
    ]
