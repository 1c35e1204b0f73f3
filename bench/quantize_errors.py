"""Errors of the quantized ragged dot and of kernelize(quantize=...), as tables (a minute or two, offline).

1. The torch ragged dot with int8 / float8_e4m3fn weights, per lhs dtype and implementation (the native AVX512 rows
   kernel, the dequantize-and-matmul route), against a float64 NumPy product of the dequantized weights: max abs and
   max relative (numerics.relative_error) error, on a decode-sized call (Qwen3-30B-A3B gate_up, 64 tokens x top-8 over
   128 experts) and on a tail call (K, N not multiples of 128, an empty group, a one-row group).
2. kernelize(tiny model, quantize=...) for Qwen3-MoE, Mixtral and GPT-OSS: each expert block's error against its own
   bf16 layer and the bound it is held to (layers/quantize.py error_bound).

    python bench/quantize_errors.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.tiny_models, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels/pallas/ragged_dot/tests"))  # quant_testutil

FORMATS = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def dequantized64(q: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """The float64 weights [G, K, N] the quantized rhs stands for (the tests' NumPy dequantize)."""
    from quant_testutil import dequantize64

    return dequantize64(q.to(torch.float32).numpy(), s.numpy(), "int8" if q.dtype == torch.int8 else "fp8")


def kernel_table(rd) -> list[str]:
    from kernel_hub.verify.numerics import relative_error

    tq = sys.modules[f"{rd.__name__}.torch_cpu.quantized_ragged_dot"]
    nq = sys.modules[f"{rd.__name__}.torch_cpu.native_quant"]
    gen = torch.Generator().manual_seed(0)
    decode_sizes = torch.bincount(torch.randint(0, 128, (512,), generator=gen), minlength=128).tolist()
    shapes = {"decode [512x2048]x[128,2048,1536]": (2048, 1536, decode_sizes),
              "tails [30x200]x[6,200,136]": (200, 136, [0, 1, 3, 0, 17, 5])}
    rows = [("call", "weights", "lhs", "implementation", "max abs", "max rel")]
    for label, (k, n, sizes) in shapes.items():
        for fmt, dtype in FORMATS.items():
            w = torch.randn(len(sizes), n, k, generator=gen) / k ** 0.5
            q, s = rd.quantize(w.transpose(1, 2), dtype)
            q = q.transpose(1, 2).contiguous().transpose(1, 2)  # nn.Linear-style bytes: what kernelize stores
            w64 = dequantized64(q, s)
            for lhs_dtype in (torch.bfloat16, torch.float32):
                lhs = torch.randn(sum(sizes), k, generator=gen).to(lhs_dtype)
                x64 = lhs.to(torch.float32).numpy().astype(np.float64)
                ref = np.zeros((lhs.shape[0], n))
                start = 0
                for g, size in enumerate(sizes):
                    ref[start:start + size] = x64[start:start + size] @ w64[g]
                    start += size
                native_ok, _ = tq.native_support(dtype)
                for impl in ("native rows kernel", "dequantize + matmul"):
                    if impl.startswith("native") and not native_ok:
                        continue
                    ready = tq._native_ready
                    if not impl.startswith("native"):
                        tq._native_ready = lambda *a: False
                    try:
                        out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s)
                    finally:
                        tq._native_ready = ready
                    err = np.abs(out.to(torch.float32).numpy().astype(np.float64) - ref)
                    vnni = (impl.startswith("native") and dtype == torch.int8 and lhs_dtype == torch.bfloat16
                            and nq.x16_available()[0])
                    impl = f"{impl} (VNNI, int16 lhs rows)" if vnni else impl
                    rows.append((label, fmt, str(lhs_dtype).removeprefix("torch."), impl, f"{err.max():.2e}",
                                 f"{relative_error(out, ref):.2e}"))
    return _table(rows)


def family_table() -> list[str]:
    import kernel_hub as kh
    from tests import tiny_models as tiny

    rows = [("family", "format", "layer", "error vs own bf16 layer", "bound", "bytes before -> after")]
    for family in ("qwen3_moe", "mixtral", "gpt_oss"):
        for fmt in FORMATS:
            model = tiny.tiny_model(family, dtype=torch.bfloat16)
            report = kh.kernelize_report(
                kh.kernelize(model, quantize=fmt, mapping={"attention": None, "rms_norm": None}))
            for r in report.replaced:
                rows.append((family, fmt, r.layer, f"{r.max_error:.2e}", f"{r.tolerance:.2e}",
                             f"{r.bytes_before:,} -> {r.bytes_after:,}" if r.quantized else r.why or ""))
            kh.restore(model)
    return _table(rows)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def main() -> int:
    import kernel_hub as kh

    rd = kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")
    print("quantized ragged dot vs float64 of the dequantized weights")
    print("\n".join(kernel_table(rd)))
    print("\nkernelize(quantize=...) per expert block: error against the block's own bf16 layer, and its bound")
    print("\n".join(family_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
