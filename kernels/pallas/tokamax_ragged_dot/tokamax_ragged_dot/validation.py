"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

The same shapes, routings and NumPy float64 reference as kernel-hub/ragged-dot-tpu (vendored ragged_cases). CPU runs
the hub CPU path (the default there) on decode, prefill and edge shapes, and Tokamax's "xla" path on small G as the
oracle. TPU runs Mosaic on shapes it accepts (every non-group dim >= 128) and the declared order ("auto") on the edge
shapes, where Mosaic may refuse and hand over to "xla"; GPU runs Triton likewise. No torch entry: framework="torch"
has no cases.
"""

from __future__ import annotations

from ._vendor.ragged_cases import RaggedCase, oracle_cases, workload_cases


def cases(backend: str, framework: str = "jax") -> list[RaggedCase]:
    """Cases for a backend ("cpu", "tpu", "cuda"/"gpu"; others get the portable ones)."""
    if framework != "jax":
        return []
    backend = backend.lower()
    if backend == "tpu":
        return workload_cases("mosaic", "mosaic_", edge_impl=None) + oracle_cases()
    if backend in ("cuda", "gpu", "rocm"):
        return workload_cases("triton", "triton_", edge_impl=None) + oracle_cases()
    return workload_cases("hub_cpu", "hub_cpu_") + oracle_cases()
