"""Validation cases: the contract between this kernel and the kernel-hub harness.

`cases(backend)` lists cases; each makes fresh random inputs, runs the *loaded* module's ragged_dot and
computes the NumPy float64 reference. The harness scores max|actual-expected| / max(1e-6, max|expected|).
CPU cases cover decode (64 tokens x top-8 over 128 experts), prefill and the edge cases on the "cpu" path,
the Pallas kernel interpreted (small shapes, large tiles), and a few runs under the simulated TPU with
race detection and NaN-filled uninitialised memory. TPU cases run the same shapes through Mosaic.
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
    implementation: str | None
    tags: tuple[str, ...]
    tolerance: float | None = None
    m: int = 128
    k: int = 128
    n: int = 128
    g: int = 8
    routing: str = "random"
    tiles: tuple[int, int, int] | None = None  # (tm, tk, tn) for the pallas path; None = default_config
    interpret: str | None = None  # None | "fast" (interpret=True) | "tpu" (simulated TPU, race checked)

    def inputs(self, seed: int) -> dict[str, Any]:
        import jax.numpy as jnp

        rng = np.random.default_rng(seed)
        dt = jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32
        lhs = rng.standard_normal((self.m, self.k), dtype=np.float32)
        rhs = rng.standard_normal((self.g, self.k, self.n), dtype=np.float32) / np.sqrt(self.k)
        sizes = make_group_sizes(self.routing, self.m, self.g, rng)
        return {
            "lhs": jnp.asarray(lhs, dt),
            "rhs": jnp.asarray(rhs, dt),
            "group_sizes": jnp.asarray(sizes, jnp.int32),
        }

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {"implementation": self.implementation}
        if self.tiles is not None:
            tm, tk, tn = self.tiles
            kwargs["config"] = module.RaggedDotConfig(tm=tm, tk=tk, tn=tn)
        if self.interpret == "fast":
            kwargs["interpret"] = True
        elif self.interpret == "tpu":
            from .interpret import race_checking_params, run_race_checked  # jax-only: not in torch builds

            kwargs["interpret"] = race_checking_params()
            return run_race_checked(module.ragged_dot, **inputs, **kwargs)
        return module.ragged_dot(**inputs, **kwargs)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        return reference_ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"])


@dataclasses.dataclass(frozen=True)
class TorchCase(Case):
    """The same shapes for the torch-facing entry: torch tensors in, `module.ragged_dot(lhs, rhs, sizes)`.

    Inputs are torch tensors (jax is never imported, as in a torch-cpu build); the reference reads them
    through float32 NumPy, so bf16 inputs are compared at the values the kernel saw.
    """

    def inputs(self, seed: int) -> dict[str, Any]:
        import torch

        rng = np.random.default_rng(seed)
        dt = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        lhs = rng.standard_normal((self.m, self.k), dtype=np.float32)
        rhs = rng.standard_normal((self.g, self.k, self.n), dtype=np.float32) / np.sqrt(self.k)
        sizes = make_group_sizes(self.routing, self.m, self.g, rng)
        return {
            "lhs": torch.from_numpy(lhs).to(dt),
            "rhs": torch.from_numpy(rhs).to(dt),
            "group_sizes": torch.from_numpy(sizes.astype(np.int32)),
        }

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        return module.ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"])

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        lhs, rhs = (inputs[k].float().numpy() for k in ("lhs", "rhs"))
        return reference_ragged_dot(lhs, rhs, inputs["group_sizes"].numpy())


def _torch_cases() -> list[TorchCase]:
    """Decode, prefill and edge shapes through the torch entry, both dtypes."""
    out = []
    for dt in ("float32", "bfloat16"):
        s = _SHORT[dt]
        out += [
            TorchCase(f"torch_decode_e128_{s}", dt, "torch", ("decode",), m=512, k=256, n=256, g=128),
            TorchCase(f"torch_prefill_e8_{s}", dt, "torch", ("prefill",), m=1024, k=256, n=256, g=8),
        ]
        for routing in ("empty_groups", "one_group", "partial", "all_empty"):
            out.append(TorchCase(f"torch_{routing}_{s}", dt, "torch", ("edge",), m=200, k=136, n=72, g=16,
                                 routing=routing))
    return out


_DTYPES = ("float32", "bfloat16")
_SHORT = {"float32": "f32", "bfloat16": "bf16"}


def _workload_cases(impl: str, interpret: str | None, prefix: str) -> list[Case]:
    """Decode, prefill and edge shapes for a path that runs at native speed."""
    out = []
    for dt in _DTYPES:
        s = _SHORT[dt]
        out += [
            Case(f"{prefix}decode_e128_{s}", dt, impl, ("decode",), m=512, k=256, n=256, g=128,
                 interpret=interpret),
            Case(f"{prefix}prefill_e8_{s}", dt, impl, ("prefill",), m=1024, k=256, n=256, g=8,
                 interpret=interpret),
        ]
        for routing in ("empty_groups", "one_group", "partial", "all_empty"):
            out.append(Case(f"{prefix}{routing}_{s}", dt, impl, ("edge",), m=200, k=136, n=72, g=16,
                            routing=routing, interpret=interpret))
    out.append(Case(f"{prefix}ragged_m_f32", "float32", impl, ("edge",), m=77, k=96, n=160, g=6,
                    interpret=interpret))
    return out


def _pallas_interpret_cases() -> list[Case]:
    """The Pallas kernel in fast interpret mode: small shapes, large tiles (cost grows with bytes x steps)."""
    out = []
    for dt in _DTYPES:
        s = _SHORT[dt]
        out.append(Case(f"pallas_interpret_decode_e16_{s}", dt, "pallas", ("decode", "interpret"),
                        m=128, k=256, n=256, g=16, tiles=(64, 256, 256), interpret="fast"))
        for routing in ("empty_groups", "one_group", "partial"):
            out.append(Case(f"pallas_interpret_{routing}_{s}", dt, "pallas", ("edge", "interpret"),
                            m=96, k=128, n=128, g=6, routing=routing, tiles=(32, 128, 128), interpret="fast"))
    out += [
        Case("pallas_interpret_ragged_mkn_f32", "float32", "pallas", ("edge", "interpret"),
             m=100, k=200, n=136, g=5, tiles=(32, 128, 128), interpret="fast"),
        Case("pallas_interpret_all_empty_f32", "float32", "pallas", ("edge", "interpret"),
             m=64, k=128, n=128, g=4, routing="all_empty", tiles=(32, 128, 128), interpret="fast"),
    ]
    return out


def _tpu_interpret_cases() -> list[Case]:
    """Simulated TPU with race detection and NaN-filled uninitialised memory."""
    return [
        Case("tpu_interpret_random_f32", "float32", "pallas", ("tpu_interpret",),
             m=64, k=128, n=128, g=4, tiles=(16, 128, 128), interpret="tpu"),
        Case("tpu_interpret_partial_bf16", "bfloat16", "pallas", ("tpu_interpret", "edge"),
             m=48, k=128, n=128, g=4, routing="partial", tiles=(16, 128, 128), interpret="tpu"),
        Case("tpu_interpret_empty_groups_f32", "float32", "pallas", ("tpu_interpret", "edge"),
             m=40, k=128, n=128, g=6, routing="empty_groups", tiles=(16, 128, 128), interpret="tpu"),
    ]


def cases(backend: str, framework: str = "jax") -> list[Case]:
    """Cases for a backend ("cpu", "tpu", "cuda"/"gpu"; others get the portable XLA cases).

    framework="torch" gives the cases for the torch-facing entry (torch_api.py), whatever the backend.
    """
    backend = backend.lower()
    if framework == "torch":
        return list(_torch_cases())
    if backend == "tpu":
        return _workload_cases("pallas", None, "") + [
            Case("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=256, n=256, g=8)
        ]
    oracle = [
        Case("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=128, n=128, g=8),
        Case("xla_oracle_partial_bf16", "bfloat16", "xla", ("oracle", "edge"), m=100, k=128, n=64, g=8,
             routing="partial"),
    ]
    if backend == "cpu":
        return _workload_cases("cpu", None, "cpu_") + _pallas_interpret_cases() + _tpu_interpret_cases() + oracle
    return oracle + _workload_cases("cpu", None, "cpu_")[:2]
