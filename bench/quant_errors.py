"""Error table of the quantized ragged dot (rhs_scale=): every JAX implementation against a float64 NumPy reference of
the dequantized weights, per weight format (int8 per-channel, fp8 128x128 blocks) and lhs dtype, over the tail
shapes (empty groups, one-row groups, one group holding every row, rows past the groups, K and N not multiples of
128). Weights are quantized here in NumPy (the kernel's own code never makes its inputs).

    python bench/quant_errors.py [--json]

Columns: max |out - ref| over all shapes and the relative error max|out - ref| / max|ref| (the harness's metric,
kernel_hub.verify.numerics) with the contract's tolerance for the dtype. "pallas" runs interpreted on CPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import kernel_hub as kh
from kernel_hub.verify.numerics import TOLERANCE, relative_error

ROOT = Path(__file__).resolve().parents[1]
rd = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "ragged_dot")
quant_validation = importlib.import_module(f"{rd.__name__}.quant_validation")  # the cases' NumPy quantizer

# name, M, K, N, group sizes
SHAPES = [
    ("empty_one_row_past_sum", 70, 256, 256, [0, 1, 45, 0, 20]),
    ("one_group_all_rows_k200_n136", 48, 200, 136, [0, 48, 0]),
    ("decode_like_e16", 128, 384, 256, [8, 0, 16, 4, 12, 0, 8, 8, 16, 4, 12, 8, 8, 0, 16, 8]),
]


def _dequantized(q: np.ndarray, s: np.ndarray, fmt: str) -> np.ndarray:
    q64, s64 = np.asarray(q).astype(np.float64), s.astype(np.float64)
    if fmt == "int8":
        return q64 * s64
    k, n = q.shape[1:]
    return q64 * np.repeat(np.repeat(s64, 128, axis=1), 128, axis=2)[:, :k, :n]


def _reference(lhs64: np.ndarray, w64: np.ndarray, sizes: list[int]) -> np.ndarray:
    out, start = np.zeros((lhs64.shape[0], w64.shape[2])), 0
    for g, size in enumerate(sizes):
        out[start:start + size] = lhs64[start:start + size] @ w64[g]
        start += size
    return out


def rows() -> list[dict]:
    out = []
    for fmt in ("int8", "fp8"):
        for dtype in ("bfloat16", "float32"):
            for impl in ("xla", "cpu", "pallas"):
                worst_abs, worst_rel = 0.0, 0.0
                for i, (_name, m, k, n, sizes) in enumerate(SHAPES):
                    rng = np.random.default_rng(100 + i)
                    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dtype)
                    q, s = quant_validation.quantize_numpy(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), fmt)
                    kw = {}
                    if impl == "pallas":
                        kw = {"interpret": True, "config": rd.RaggedDotConfig(
                            tm=32, tk=128 if k % 128 == 0 else k, tn=128 if n % 128 == 0 else n)}
                    y = rd.ragged_dot(lhs, jnp.asarray(q), jnp.asarray(sizes, jnp.int32), rhs_scale=jnp.asarray(s),
                                      implementation=impl, **kw)
                    ref = _reference(np.asarray(lhs.astype(jnp.float32), np.float64), _dequantized(q, s, fmt), sizes)
                    got = np.asarray(y.astype(jnp.float32), np.float64)
                    worst_abs = max(worst_abs, float(np.abs(got - ref).max()))
                    worst_rel = max(worst_rel, relative_error(got, ref))
                out.append({"format": fmt, "lhs": dtype, "implementation": impl, "max_abs": worst_abs,
                            "max_rel": worst_rel, "tolerance": TOLERANCE[dtype]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    table = rows()
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    print(f"{'format':7} {'lhs':9} {'impl':7} {'max abs':>9} {'max rel':>9} {'tol':>6}")
    for r in table:
        print(f"{r['format']:7} {r['lhs']:9} {r['implementation']:7} {r['max_abs']:9.2e} {r['max_rel']:9.2e} "
              f"{r['tolerance']:6.0e}")
    print(f"shapes: {', '.join(s[0] for s in SHAPES)}; reference: float64 NumPy on the dequantized weights")
    return 0 if all(r["max_rel"] <= r["tolerance"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
