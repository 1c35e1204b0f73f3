"""`python bench/moe_decode.py --quantize int8|fp8`: one Qwen3-30B-A3B MoE layer at decode batch 64, kernelized with
quantized expert weights against the same layer kernelized in bf16, side by side in one run.

Both are kh.kernelize'd copies of one bf16 block on the same routing (the bf16 one with its usual CPU path: the native
rows kernel on the original weights; the quantized one reading int8 / float8 copies through the native quantized rows
kernel), timed interleaved with the order rotated each round (verify.timing), with the memory floors of both byte
counts measured in the same rounds (moe_decode.FloorCopy). Each sample is the mean of --calls back-to-back calls
(default 4) after a 50 ms idle: a decode step runs its layers back to back, and one call alone after an idle also
times the cores waking (a few ms on these VMs, the same for both, so a larger share of the shorter int8 call);
--calls 1 times that. Per round: quantized time / bf16 time (the target
for int8: <= 0.6), and each one's time / its own floor. Medians with interquartile ranges; every sample in the JSON.
Writes bench/out/moe_decode_<fmt>.json.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

#: The target: kernelized int8 time <= this x kernelized bf16 time.
TARGET = {"int8": 0.6, "fp8": 0.6}


def _spread(values: list[float]) -> dict[str, float]:
    from dataclasses import asdict

    from kernel_hub.verify.timing import Spread

    return {k: v for k, v in asdict(Spread.of(values)).items() if k != "n"}


def bench_quantized(fmt: str, *, batch: int, reps: int, floor: Any, calls: int = 4) -> dict[str, Any]:
    """Time bf16-kernelized and `fmt`-kernelized copies of one block, interleaved, each sample the mean of `calls`
    back-to-back calls after the idle gap; the grouped_mm output is the reference of both errors."""
    from moe_common import FLOOR_COPY_BYTES, FLOOR_KINDS, GAP_S, active_bytes, build_layer, routing

    import kernel_hub as kh
    from kernel_hub.verify.numerics import relative_error
    from kernel_hub.verify.timing import interleaved_samples

    dtype = torch.bfloat16
    container, _ = build_layer(dtype)
    hidden, index, weights = routing(batch, dtype)
    experts = container.experts
    with torch.no_grad():
        reference = type(experts).forward(experts, hidden, index, weights)  # grouped_mm, the block's own
    quantized = copy.deepcopy(container)
    bf16_report = kh.kernelize_report(kh.kernelize(container))
    q_report = kh.kernelize_report(kh.kernelize(quantized, quantize=fmt))
    row = q_report.replaced[0]

    def forward(block):
        def call() -> torch.Tensor:
            with torch.no_grad():
                return block(hidden, index, weights)
        return call

    bf16_call, q_call = forward(container.experts), forward(quantized.experts)
    out_bf16, out_q = bf16_call(), q_call()
    times = interleaved_samples({"bf16": bf16_call, fmt: q_call, "floor_pool": floor.pool_copy,
                                 "floor_threads": floor.threads_copy, "floor_read": floor.pool_read},
                                repeats=reps, warmup=1, gap_s=GAP_S, calls=calls)
    bf16_bytes = active_bytes(index, dtype)
    q_bytes = bf16_bytes * (row.bytes_after / row.bytes_before)  # the quantized bytes (scales included)
    for kind in FLOOR_KINDS:
        times[kind] = [t * (2 if kind == "floor_read" else 1) / (2 * FLOOR_COPY_BYTES) for t in times[kind]]
    per_byte = [min(r) for r in zip(*(times[kind] for kind in FLOOR_KINDS), strict=True)]  # seconds a byte
    times["floor_bf16"] = [s * bf16_bytes for s in per_byte]
    times[f"floor_{fmt}"] = [s * q_bytes for s in per_byte]
    result = {
        "format": fmt,
        "calls_per_sample": calls,
        "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items() if not k.startswith("floor_")
                      or k in ("floor_bf16", f"floor_{fmt}")},
        "samples_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
        "spread_ms": {k: {s: v * 1e3 for s, v in _spread(times[k]).items()} for k in ("bf16", fmt)},
        f"{fmt}_over_bf16": _spread([q / b for q, b in zip(times[fmt], times["bf16"], strict=True)]),
        "bf16_over_floor": _spread([b / f for b, f in zip(times["bf16"], times["floor_bf16"], strict=True)]),
        f"{fmt}_over_floor": _spread([q / f for q, f in zip(times[fmt], times[f"floor_{fmt}"], strict=True)]),
        "target": TARGET[fmt],
        "rel_error_vs_grouped_mm": {"bf16": relative_error(out_bf16, reference), fmt: relative_error(out_q, reference)},
        "bytes": {"bf16": row.bytes_before, fmt: row.bytes_after},
        "active_bytes": {"bf16": bf16_bytes, fmt: q_bytes},
        "kernelize": {"bf16": bf16_report.replaced[0].why, fmt: row.why, "bound": row.tolerance,
                      "error": row.max_error},
    }
    kh.restore(container)
    kh.restore(quantized)
    return result


def table(r: dict[str, Any]) -> str:
    fmt = r["format"]
    s, ratio = r["spread_ms"], r[f"{fmt}_over_bf16"]
    lines = [f"{'kernelized':12s} {'median':>9s} {'IQR':>17s} {'min-max':>17s} {'time/floor [IQR]':>20s}  "
             f"rel err vs grouped_mm"]
    for name in ("bf16", fmt):
        f = r[f"{name}_over_floor"]
        lines.append(f"{name:12s} {s[name]['median']:7.1f}ms {s[name]['q1']:7.1f}-{s[name]['q3']:.1f}ms "
                     f"{s[name]['min']:7.1f}-{s[name]['max']:.1f}ms {f['median']:8.2f}x [{f['q1']:.2f}-{f['q3']:.2f}]  "
                     f"{r['rel_error_vs_grouped_mm'][name]:.1e}")
    from moe_common import GAP_S

    verdict = "met" if ratio["median"] <= r["target"] else "missed"
    calls = r["calls_per_sample"]
    why = "a decode step runs its layers back to back" if calls > 1 else "wake-up included"
    lines.insert(0, f"each sample: the mean of {calls} back-to-back calls after {GAP_S * 1e3:.0f} ms idle ({why})")
    lines.append(f"{fmt} time / bf16 time per round: {ratio['median']:.2f} [IQR {ratio['q1']:.2f}-{ratio['q3']:.2f}, "
                 f"min {ratio['min']:.2f}, max {ratio['max']:.2f}]; target <= {r['target']}: {verdict}")
    mib = {k: v / 2**20 for k, v in r["bytes"].items()}
    lines.append(f"expert weights {mib['bf16']:.0f} MiB bf16 -> {mib[fmt]:.0f} MiB {fmt}; "
                 f"floors (active bytes once): bf16 {r['median_ms']['floor_bf16']:.1f} ms, "
                 f"{fmt} {r['median_ms'][f'floor_{fmt}']:.1f} ms")
    lines.append(f"kernelize {fmt}: error {r['kernelize']['error']:.2e} vs bound {r['kernelize']['bound']:.2e}")
    return "\n".join(lines)


def main_quantized(fmt: str, *, batch: int, reps: int, out: Path | None, floor: Any, calls: int = 4) -> int:
    load_before = os.getloadavg()
    result = bench_quantized(fmt, batch=batch, reps=reps, floor=floor, calls=calls)
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(table(result))
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in result['load_average']['after'])}")
    if out is not None:
        from json_out import write_result

        write_result(out, result)
    return 0


if __name__ == "__main__":  # pragma: no cover - run through moe_decode.py --quantize
    sys.exit("run: python bench/moe_decode.py --quantize int8")
