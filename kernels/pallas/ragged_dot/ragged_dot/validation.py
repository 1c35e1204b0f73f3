"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

Each case (RaggedCase, _vendor/ragged_cases.py) makes fresh random inputs, runs the *loaded* module's ragged_dot
and computes the NumPy float64 reference; the harness owns the verdict. CPU cases cover decode (64 tokens x top-8
over 128 experts), prefill and the edge cases on the "cpu" path, the Pallas kernel interpreted (small shapes, large
tiles), and a few runs under the simulated TPU with race detection and NaN-filled uninitialised memory. TPU cases
run the same shapes through Mosaic. framework="torch": the cases of the torch-facing entry (torch_api.py).
MoeCase: the whole expert block `moe_experts` (SiLU and Gemma 4's GELU, experts without tokens, one expert in every
token's top-k, a one-device mesh) against the float64 loop of `reference_moe_experts`. QuantCase
(quant_validation.py): int8 / fp8 weights with their scales (rhs_scale=) against the float64 dequantized weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._vendor.cases import DTYPES, SHORT, Case, tensor
from ._vendor.moe_reference import reference_moe_experts
from ._vendor.ragged_cases import RaggedCase, oracle_cases, workload_cases
from .quant_validation import quant_cases

#: MoE routings: "random" top-k; "empty_experts" leaves half the experts without a token; "hot_expert" puts expert 1
#: in every token's top-k (it holds T of the T*k rows).
MOE_ROUTINGS = ("random", "empty_experts", "hot_expert")


@dataclasses.dataclass(frozen=True)
class MoeCase(Case):
    """moe_experts(x[T,H], ids[T,k], weights[T,k], w_gate_up[E,H,2I], w_down[E,I,H]) on fresh random inputs."""

    t: int = 24
    h: int = 128
    i: int = 64
    e: int = 16
    k: int = 4
    routing: str = "random"
    activation: str = "silu"
    mesh: bool = False  # on a one-device mesh (the expert-parallel shard_map path)
    formulation: str | None = None  # moe_experts' formulation= (None: its own choice)

    def inputs(self, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        pool = np.arange(self.e) if self.routing != "empty_experts" else rng.permutation(self.e)[: self.e // 2]
        ids = np.stack([rng.choice(pool, self.k, replace=False) for _ in range(self.t)])
        if self.routing == "hot_expert":
            ids[:, 0] = np.where((ids[:, 1:] == 1).any(axis=1), ids[:, 0], 1)
        w = rng.random((self.t, self.k))
        return {
            "x": tensor(rng.standard_normal((self.t, self.h), dtype=np.float32), self.dtype, "jax"),
            "topk_ids": tensor(ids.astype(np.int32), "int32", "jax"),
            "topk_weights": tensor((w / w.sum(1, keepdims=True)).astype(np.float32), self.dtype, "jax"),
            "w_gate_up": tensor(rng.standard_normal((self.e, self.h, 2 * self.i), dtype=np.float32)
                                / np.sqrt(self.h), self.dtype, "jax"),
            "w_down": tensor(rng.standard_normal((self.e, self.i, self.h), dtype=np.float32) / np.sqrt(self.i),
                             self.dtype, "jax"),
            "seed": seed,
        }

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = self.entry_options(module, inputs["seed"])
        if self.mesh:
            import jax

            kw.update(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("expert",)), expert_axis="expert")
        if self.formulation is not None:
            kw["formulation"] = self.formulation
        args = [inputs[n] for n in ("x", "topk_ids", "topk_weights", "w_gate_up", "w_down")]
        return module.moe_experts(*args, activation=self.activation, **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        return reference_moe_experts(*(inputs[n] for n in ("x", "topk_ids", "topk_weights", "w_gate_up", "w_down")),
                                     activation=self.activation)


#: bf16 MoE: two chained bf16 matmuls with a bf16 intermediate, measured up to 8.6e-3 (tests/test_moe_mesh.py);
#: the table's 1e-2 leaves too little room for fresh inputs.
MOE_BF16_TOLERANCE = 2e-2


def _moe_cases(impl: str | None, prefix: str) -> list[MoeCase]:
    """Every routing in f32; random and hot-expert routings and GELU (Gemma 4 runs bf16) in bf16; a one-device
    mesh; on the Pallas path both formulations (at these sizes a TPU chooses "dense": the sorted one asked for).
    Five compilations on CPU."""
    out = [MoeCase(f"{prefix}moe_{routing}_f32", "float32", impl, ("moe",), routing=routing)
           for routing in MOE_ROUTINGS]
    out += [MoeCase(f"{prefix}moe_{routing}_bf16", "bfloat16", impl, ("moe",), MOE_BF16_TOLERANCE, routing=routing)
            for routing in ("random", "hot_expert")]
    out.append(MoeCase(f"{prefix}moe_gelu_bf16", "bfloat16", impl, ("moe",), MOE_BF16_TOLERANCE, activation="gelu"))
    out.append(MoeCase(f"{prefix}moe_mesh1_f32", "float32", impl, ("moe", "mesh"), mesh=True, routing="empty_experts",
                       t=13))
    if impl == "pallas":
        out += [MoeCase(f"{prefix}moe_sorted_{routing}_{SHORT[dt]}", dt, impl, ("moe", "sorted"),
                        MOE_BF16_TOLERANCE if dt == "bfloat16" else None, routing=routing, formulation="sorted")
                for dt, routing in (("float32", "empty_experts"), ("bfloat16", "random"))]
    return out


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
                RaggedCase("xla_oracle_e8_f32", "float32", "xla", ("oracle",), m=256, k=256, n=256, g=8),
                *_moe_cases("pallas", ""), *quant_cases("tpu")]
    if backend == "cpu":
        return [*workload_cases("cpu", "cpu_"), *_pallas_interpret_cases(), *_tpu_interpret_cases(), *oracle_cases(),
                *_moe_cases("cpu", "cpu_"),
                MoeCase("pallas_interpret_moe_f32", "float32", "pallas", ("moe", "interpret"), interpret="fast"),
                MoeCase("pallas_interpret_moe_dense_f32", "float32", "pallas", ("moe", "interpret", "dense"),
                        interpret="fast", routing="empty_experts", t=21, formulation="dense"),
                MoeCase("tpu_interpret_moe_dense_bf16", "bfloat16", "pallas", ("moe", "tpu_interpret", "dense"),
                        MOE_BF16_TOLERANCE, interpret="tpu", routing="hot_expert", t=16, h=128, i=128, e=4,
                        formulation="dense"),
                *quant_cases("cpu")]
    return oracle_cases() + workload_cases("cpu", "cpu_")[:2]
