"""Validation cases: the contract between this wrapper and the kernel-hub harness.

The same shapes, routings and NumPy float64 reference as kernel-hub/ragged-dot-tpu. CPU runs the hub
CPU path (the default there) on decode, prefill and edge shapes, and Tokamax's "xla" path on small G as
the oracle. TPU runs Mosaic on shapes it accepts (every non-group dim >= 128) and the declared order
("auto") on the edge shapes, where Mosaic may refuse and hand over to "xla"; GPU runs Triton likewise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .reference import reference_ragged_dot
from .routing import make_group_sizes


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    dtype: str  # "float32" | "bfloat16"
    implementation: str | None  # None: the declared order for this backend
    tags: tuple[str, ...]
    tolerance: float | None = None
    m: int = 128
    k: int = 128
    n: int = 128
    g: int = 8
    routing: str = "random"

    def inputs(self, seed: int) -> dict[str, Any]:
        import jax.numpy as jnp

        rng = np.random.default_rng(seed)
        dt = jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32
        lhs = rng.standard_normal((self.m, self.k), dtype=np.float32)
        rhs = rng.standard_normal((self.g, self.k, self.n), dtype=np.float32) / np.sqrt(self.k)
        sizes = make_group_sizes(self.routing, self.m, self.g, rng)
        return {"lhs": jnp.asarray(lhs, dt), "rhs": jnp.asarray(rhs, dt), "group_sizes": jnp.asarray(sizes, jnp.int32)}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        return module.ragged_dot(**inputs, implementation=self.implementation)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        return reference_ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"])


_SHORT = {"float32": "f32", "bfloat16": "bf16"}


def _workload_cases(impl: str | None, edge_impl: str | None, prefix: str) -> list[Case]:
    """Decode (64 tokens x top-8 over 128 experts), prefill and edge shapes (ragged K/N, M not a tile
    multiple, empty groups, one group with every row, rows past the groups, no rows at all)."""
    out = []
    for dt, s in _SHORT.items():
        out += [
            Case(f"{prefix}decode_e128_{s}", dt, impl, ("decode",), m=512, k=256, n=256, g=128),
            Case(f"{prefix}prefill_e8_{s}", dt, impl, ("prefill",), m=1024, k=256, n=256, g=8),
        ]
        for routing in ("empty_groups", "one_group", "partial", "all_empty"):
            out.append(Case(f"{prefix}{routing}_{s}", dt, edge_impl, ("edge",), m=200, k=136, n=72, g=16,
                            routing=routing))
    out.append(Case(f"{prefix}ragged_m_f32", "float32", edge_impl, ("edge",), m=77, k=96, n=160, g=6))
    return out


def cases(backend: str) -> list[Case]:
    """Cases for a backend ("cpu", "tpu", "cuda"/"gpu"; others get the portable ones)."""
    backend = backend.lower()
    oracle = [
        Case("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=128, n=128, g=8),
        Case("xla_oracle_partial_bf16", "bfloat16", "xla", ("oracle", "edge"), m=100, k=128, n=64, g=8,
             routing="partial"),
    ]
    if backend == "tpu":
        return _workload_cases("mosaic", None, "mosaic_") + oracle
    if backend in ("cuda", "gpu", "rocm"):
        return _workload_cases("triton", None, "triton_") + oracle
    return _workload_cases("hub_cpu", "hub_cpu", "hub_cpu_") + oracle
