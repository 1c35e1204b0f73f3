"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

Each case (RaggedCase, _vendor/ragged_cases.py) makes fresh random inputs, runs the *loaded* module's ragged_dot
and computes the NumPy float64 reference; the harness owns the verdict. CPU cases cover decode (64 tokens x top-8
over 128 experts), prefill and the edge cases on the "cpu" path, the Pallas kernel interpreted (small shapes, large
tiles), and a few runs under the simulated TPU with race detection and NaN-filled uninitialised memory. TPU cases
run the same shapes through Mosaic. framework="torch": the cases of the torch-facing entry (torch_api.py).
"""

from __future__ import annotations

from ._vendor.cases import DTYPES, SHORT
from ._vendor.ragged_cases import RaggedCase, oracle_cases, workload_cases


def _tiles(tm: int, tk: int, tn: int) -> tuple[tuple[str, int], ...]:
    return (("tm", tm), ("tk", tk), ("tn", tn))


def _pallas_interpret_cases() -> list[RaggedCase]:
    """The Pallas kernel in fast interpret mode: small shapes, large tiles (cost grows with bytes x steps)."""
    out = []
    for dt in DTYPES:
        s = SHORT[dt]
        out.append(RaggedCase(f"pallas_interpret_decode_e16_{s}", dt, "pallas", ("decode", "interpret"),
                              interpret="fast", config=_tiles(64, 256, 256), m=128, k=256, n=256, g=16))
        for routing in ("empty_groups", "one_group", "partial"):
            out.append(RaggedCase(f"pallas_interpret_{routing}_{s}", dt, "pallas", ("edge", "interpret"),
                                  interpret="fast", config=_tiles(32, 128, 128), m=96, k=128, n=128, g=6,
                                  routing=routing))
    out += [
        RaggedCase("pallas_interpret_ragged_mkn_f32", "float32", "pallas", ("edge", "interpret"),
                   interpret="fast", config=_tiles(32, 128, 128), m=100, k=200, n=136, g=5),
        RaggedCase("pallas_interpret_all_empty_f32", "float32", "pallas", ("edge", "interpret"),
                   interpret="fast", config=_tiles(32, 128, 128), m=64, k=128, n=128, g=4, routing="all_empty"),
    ]
    return out


def _tpu_interpret_cases() -> list[RaggedCase]:
    """Simulated TPU with race detection and NaN-filled uninitialised memory."""
    tiles = _tiles(16, 128, 128)
    return [
        RaggedCase("tpu_interpret_random_f32", "float32", "pallas", ("tpu_interpret",), interpret="tpu",
                   config=tiles, m=64, k=128, n=128, g=4),
        RaggedCase("tpu_interpret_partial_bf16", "bfloat16", "pallas", ("tpu_interpret", "edge"), interpret="tpu",
                   config=tiles, m=48, k=128, n=128, g=4, routing="partial"),
        RaggedCase("tpu_interpret_empty_groups_f32", "float32", "pallas", ("tpu_interpret", "edge"),
                   interpret="tpu", config=tiles, m=40, k=128, n=128, g=6, routing="empty_groups"),
    ]


def cases(backend: str, framework: str = "jax") -> list[RaggedCase]:
    """Cases for a backend ("cpu", "tpu", "cuda"/"gpu"; others get the portable XLA cases) and an entry."""
    backend = backend.lower()
    if framework == "torch":
        return workload_cases("torch", "torch_", framework="torch", ragged_m=False)
    if backend == "tpu":
        return [*workload_cases("pallas", ""),
                RaggedCase("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=256, n=256, g=8)]
    if backend == "cpu":
        return [*workload_cases("cpu", "cpu_"), *_pallas_interpret_cases(), *_tpu_interpret_cases(), *oracle_cases()]
    return oracle_cases() + workload_cases("cpu", "cpu_")[:2]
