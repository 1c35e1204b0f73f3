"""Validation cases of the quantized ragged dot (validation.cases appends them): int8 weights with per-channel
scales and fp8 weights with 128x128 block scales, quantized here in NumPy, against the float64 reference of the
weights they dequantize to (computed here, sharing no code with quant.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._vendor.arrays import to_f64
from ._vendor.cases import tensor
from ._vendor.ragged_cases import RaggedCase, make_group_sizes
from ._vendor.ragged_reference import reference_ragged_dot

BLOCK = 128


def _expand(scale: np.ndarray, k: int, n: int) -> np.ndarray:
    return np.repeat(np.repeat(scale, BLOCK, axis=1), BLOCK, axis=2)[:, :k, :n]


def quantize_numpy(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(quantized weights, f32 scales): int8 by each (expert, output column)'s max, fp8 by each 128x128 block's
    max (e4m3's largest finite value is 448)."""
    g, k, n = w.shape
    if fmt == "int8":
        scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-12) / 127.0
        return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale.astype(np.float32)
    import ml_dtypes

    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    padded = np.zeros((g, kb * BLOCK, nb * BLOCK))
    padded[:, :k, :n] = np.abs(w)
    scale = (np.maximum(padded.reshape(g, kb, BLOCK, nb, BLOCK).max(axis=(2, 4)), 1e-12) / 448.0).astype(np.float32)
    return (w / _expand(scale, k, n)).astype(ml_dtypes.float8_e4m3fn), scale


@dataclasses.dataclass(frozen=True)
class QuantCase(RaggedCase):
    """ragged_dot(lhs, rhs, group_sizes, rhs_scale=) on fresh weights quantized to `fmt` ("int8" or "fp8")."""

    fmt: str = "int8"

    def inputs(self, seed: int) -> dict[str, Any]:
        import jax.numpy as jnp

        rng = np.random.default_rng(seed)
        lhs = rng.standard_normal((self.m, self.k), dtype=np.float32)
        q, scale = quantize_numpy(rng.standard_normal((self.g, self.k, self.n)) / np.sqrt(self.k), self.fmt)
        sizes = make_group_sizes(self.routing, self.m, self.g, rng).astype(np.int32)
        return {"lhs": tensor(lhs, self.dtype, "jax"), "rhs": jnp.asarray(q), "rhs_scale": jnp.asarray(scale),
                "group_sizes": tensor(sizes, "int32", "jax"), "seed": seed}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = self.entry_options(module, inputs["seed"])
        if self.config:
            kw["config"] = module.RaggedDotConfig(**dict(self.config))
        return module.ragged_dot(inputs["lhs"], inputs["rhs"], inputs["group_sizes"], rhs_scale=inputs["rhs_scale"],
                                 **kw)

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        q, s = to_f64(inputs["rhs"]), to_f64(inputs["rhs_scale"])
        w = q * s if self.fmt == "int8" else q * _expand(s, self.k, self.n)
        return reference_ragged_dot(inputs["lhs"], w, inputs["group_sizes"])


def quant_cases(backend: str) -> list[QuantCase]:
    """CPU: the "cpu" path and the Pallas kernel interpreted (small shapes, K and N not multiples of 128 with
    whole-dim tiles, one group holding every row); TPU: the Pallas kernel at a decode shape and the same edges."""
    tiles = (("tm", 32), ("tk", 200), ("tn", 136))
    edge = dict(m=48, k=200, n=136, g=4, routing="one_group")
    if backend == "tpu":
        return [QuantCase(f"quant_{fmt}_decode_{s}", dt, "pallas", ("quantized", "decode"), fmt=fmt, m=512, k=512,
                          n=384, g=64, routing="empty_groups")
                for fmt in ("int8", "fp8") for dt, s in (("bfloat16", "bf16"), ("float32", "f32"))] + [
                QuantCase(f"quant_{fmt}_ragged_kn_bf16", "bfloat16", "pallas", ("quantized", "edge"), fmt=fmt, **edge)
                for fmt in ("int8", "fp8")]
    if backend != "cpu":
        return []
    return [
        QuantCase("cpu_quant_int8_partial_bf16", "bfloat16", "cpu", ("quantized",), fmt="int8", m=64, k=256, n=128,
                  g=6, routing="partial"),
        QuantCase("cpu_quant_fp8_ragged_kn_f32", "float32", "cpu", ("quantized", "edge"), fmt="fp8", **edge),
        QuantCase("pallas_interpret_quant_int8_empty_groups_f32", "float32", "pallas", ("quantized", "interpret"),
                  interpret="fast", config=(("tm", 32), ("tk", 128), ("tn", 128)), fmt="int8", m=64, k=256, n=128,
                  g=6, routing="empty_groups"),
        QuantCase("pallas_interpret_quant_fp8_ragged_kn_bf16", "bfloat16", "pallas", ("quantized", "interpret", "edge"),
                  interpret="fast", config=tiles, fmt="fp8", **edge),
    ]
