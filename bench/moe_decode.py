"""One MoE expert layer at Qwen3-30B-A3B geometry, decode batch 64: transformers vs the hub kernel.

Runs transformers' eager, grouped_mm and batched_mm experts implementations and the kernelized layer
(kernel-hub/ragged-dot-tpu through kh.kernelize) on the same weights and routing, interleaved, and
reports medians, ratios to grouped_mm and to the memory floor (each with its interquartile range): every active
expert's weights read once at this machine's measured copy bandwidth. Writes bench/out/moe_decode.json (every
sample, the environment).

    python bench/moe_decode.py [--quick] [--dtypes bf16,f32] [--reps N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

GEOMETRY = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Bytes per second moved (read + write) by a large tensor copy: the memory roof on this machine."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times)


def build_layer(dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """A Qwen3-MoE experts block with random weights, inside a container module (kernelize's target)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(**GEOMETRY, hidden_act="silu")
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    with torch.device("cpu"):
        experts = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in (experts.gate_up_proj, experts.down_proj):
            p.normal_(0.0, 0.02)
    container = torch.nn.Module()
    container.experts = experts.to(dtype).requires_grad_(False)
    return container, config


def routing(batch: int, dtype: torch.dtype, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, GEOMETRY["hidden_size"], generator=g).to(dtype)
    probs = torch.softmax(torch.randn(batch, GEOMETRY["num_experts"], generator=g), dim=-1)
    weights, index = torch.topk(probs, GEOMETRY["num_experts_per_tok"], dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype)
    return hidden, index, weights


def active_bytes(index: torch.Tensor, dtype: torch.dtype) -> int:
    h, i = GEOMETRY["hidden_size"], GEOMETRY["moe_intermediate_size"]
    active = int(torch.unique(index).numel())
    return active * 3 * h * i * torch.tensor([], dtype=dtype).element_size()


def bench_dtype(name: str, dtype: torch.dtype, *, batch: int, reps: int, batched_reps: int,
                bandwidth: float, log) -> dict[str, Any]:
    import kernel_hub as kh
    from kernel_hub.numerics import relative_error
    from kernel_hub.timing import Spread, bench_records, interleaved_samples

    container, config = build_layer(dtype)
    experts = container.experts
    hidden, index, weights = routing(batch, dtype)

    def run_with(impl: str):
        # The class-level forward is transformers' dispatcher: it follows config._experts_implementation
        # and ignores the instance forward kernelize gives this (non-PreTrainedModel) container's block.
        dispatch = type(experts).forward

        def run() -> torch.Tensor:
            config._experts_implementation = impl
            with torch.no_grad():
                return dispatch(experts, hidden, index, weights)
        return run

    eager, grouped, batched = run_with("eager"), run_with("grouped_mm"), run_with("batched_mm")
    reference = grouped()
    report = kh.kernelize(container)
    config._experts_implementation = "grouped_mm"

    def kernelized() -> torch.Tensor:
        with torch.no_grad():
            return container.experts(hidden, index, weights)

    out = kernelized()
    max_rel = relative_error(out, reference)
    variants = {"eager": eager, "grouped_mm": grouped, "kernelized": kernelized}
    times = interleaved_samples(variants, repeats=reps, warmup=1)
    if batched_reps:  # seconds per call: timed apart, after the others, so it never precedes them
        times.update(interleaved_samples({"batched_mm": batched}, repeats=batched_reps, warmup=0))
    kh.restore(container)
    floor_s = active_bytes(index, dtype) / bandwidth  # each byte read once, at the copy traffic rate
    med = {k: statistics.median(v) for k, v in times.items() if v}
    kern = Spread.of(times["kernelized"])
    result = {
        "dtype": name,
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "runs": {k: len(v) for k, v in times.items()},
        "floor_ms": floor_s * 1e3,
        "kernelized_vs_grouped_mm": med["kernelized"] / med["grouped_mm"],
        "kernelized_vs_floor": med["kernelized"] / floor_s,
        "kernelized_vs_floor_iqr": [kern.q1 / floor_s, kern.q3 / floor_s],
        "records": bench_records(times, group=f"{name}, decode batch {batch}", baseline="grouped_mm"),
        "max_rel_error_vs_grouped_mm": max_rel,
        "active_experts": int(torch.unique(index).numel()),
        "implementation": report.replaced[0].implementation if report.replaced else None,
        "variant": report.replaced[0].variant if report.replaced else None,
    }
    return result


def table(results: list[dict[str, Any]]) -> str:
    from kernel_hub.timing import format_ratio

    cols = ["eager", "grouped_mm", "batched_mm", "kernelized"]
    lines = ["dtype  " + "  ".join(f"{c:>11s}" for c in cols) +
             "      floor  kern x vs grouped (IQR)  kern/floor (IQR)  max rel err"]
    for r in results:
        ms = r["median_ms"]
        cells = "  ".join(f"{ms[c]:9.1f}ms" if c in ms else f"{'-':>11s}" for c in cols)
        speed = next(format_ratio(x["vs_baseline"]) for x in r["records"] if x["method"] == "kernelized")
        lo, hi = r["kernelized_vs_floor_iqr"]
        floor = f"{r['kernelized_vs_floor']:.2f}x ({lo:.2f}-{hi:.2f})"
        lines.append(f"{r['dtype']:5s}  {cells}  {r['floor_ms']:7.1f}ms  {speed:>22s}  {floor:>16s}  "
                     f"{r['max_rel_error_vs_grouped_mm']:.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 interleaved runs, no batched_mm (~1 min)")
    parser.add_argument("--dtypes", default="bf16,f32", help="comma list from: bf16, f32")
    parser.add_argument("--batch", type=int, default=64, help="decode batch (tokens)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved runs per implementation (default 9)")
    parser.add_argument("--batched-reps", type=int, default=None,
                        help="runs of batched_mm (slow, gathers every selected expert's weights; default 1)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "moe_decode.json")
    args = parser.parse_args(argv)
    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in names if d not in DTYPES]
    if unknown:
        print(f"error: unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    reps = args.reps or (3 if args.quick else 9)
    batched_reps = args.batched_reps if args.batched_reps is not None else (0 if args.quick else 1)
    bandwidth = copy_bandwidth()
    print(f"Qwen3-30B-A3B MoE layer {GEOMETRY}, decode batch {args.batch}, {torch.get_num_threads()} threads; "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read+write)")
    results = [bench_dtype(n, DTYPES[n], batch=args.batch, reps=reps, batched_reps=batched_reps,
                           bandwidth=bandwidth, log=print) for n in names]
    print(table(results))
    if results and results[0]["implementation"]:
        print(f"kernelized: {results[0]['variant']} / {results[0]['implementation']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from kernel_hub.report.environment import environment

    args.out.write_text(json.dumps({
        "benchmark": "moe_decode", "environment": environment(with_libtpu=False).model_dump(),
        "baseline": "grouped_mm", "ours": ["kernelized"],
        "records": [rec for r in results for rec in r["records"]],
        "geometry": GEOMETRY, "batch": args.batch, "threads": torch.get_num_threads(),
        "copy_bandwidth_gbs": bandwidth / 1e9, "machine": platform.machine(), "torch": torch.__version__,
        "results": results,
    }, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
