"""Modeled TPU time of our kernels, from their own schedules, beside the ideal and XLA's own estimate.

    python bench/tpu_model.py [--json] [--generations v5e,v6e] [--out PATH] [--quantized]

Rows: one MoE layer (gate_up + down ragged dots) of Qwen3-30B-A3B and Gemma 4 26B-A4B at decode (64 tokens)
and prefill (4096 tokens), a uniform top-k routing; attention prefill (4096, causal) and decode (batch 64,
8192-long caches) at GPT-OSS-20B's head geometry (64 query / 8 kv heads of 64, sinks). Per JAX device (a
v7x chip is two, one per TensorCore; kernel_hub.tpu.chips):
  modeled_s       tpu_cost_model.schedule: the kernels' grids walked with the real group metadata:
                  per call max(HBM bytes / bandwidth, MXU FLOPs / peak) + steps x 0.35 us
  ideal_s         max(bytes moved once / bandwidth, useful FLOPs / peak): each active expert's weights once
                  plus the activations; attention q, k, v, o once
  xla_estimate_s  cost_analysis()["optimal_seconds"] of jax.lax.ragged_dot / jax.nn.dot_product_attention
                  compiled for that chip by libtpu
Runs the model in the TPU environment (make setup-tpu); bf16 throughout. --quantized: instead, the MoE layer on
int8 (per-channel scales) and fp8 (128x128 block scales) expert weights beside bf16
(tpu_cost_model.model_quant): each format's modeled time over the bf16 layer's and over its own ideal
(quantized bytes + scales read once).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernel_hub.report.environment import environment  # noqa: E402
from kernel_hub.tpu.chips import parse_generations  # noqa: E402
from kernel_hub.tpu.env import tpu_env  # noqa: E402
from kernel_hub.tpu.package import folder_package  # noqa: E402
from kernel_hub.tpu.worker_client import refusal  # noqa: E402
from tpu_cost_model.calibration import STEP_OVERHEAD_S  # noqa: E402
from tpu_cost_model.worker import run_in_worker  # noqa: E402

#: Decode rows must stay within this of the ideal (the decode target).
DECODE_TARGET = 1.15


def model_rows(generations: tuple[str, ...]) -> list[dict]:
    request = {
        "mode": "model",
        # each kernel folder's TPU build, hashed here and imported by the worker only against these digests
        "ragged_dot": folder_package(ROOT / "kernels/pallas/ragged_dot").request(),
        "flash_attention": folder_package(ROOT / "kernels/pallas/flash_attention").request(),
        "generations": list(generations),
        "moe_models": ["qwen3_30b_a3b", "gemma4_26b_a4b"],
        "attention_model": "gpt_oss_20b",
        "dtype": "bfloat16",
    }
    events, status, stderr = run_in_worker(tpu_env(), request, timeout=3600)
    refused = refusal(events)
    if refused is not None:
        raise SystemExit(f"the TPU model worker refused a kernel: {refused}")
    rows = [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "row"]
    if status != 0 or not any(e.get("event") == "done" for e in events):
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        raise SystemExit(f"the TPU model worker failed (exit {status}): {' | '.join(tail)}")
    return rows


def quant_rows(generations: tuple[str, ...]) -> list[dict]:
    request = {"mode": "quant_model", "ragged_dot": folder_package(ROOT / "kernels/pallas/ragged_dot").request(),
               "generations": list(generations), "moe_models": ["qwen3_30b_a3b", "gemma4_26b_a4b"]}
    events, status, stderr = run_in_worker(tpu_env(), request, timeout=3600)
    refused = refusal(events)
    if refused is not None:
        raise SystemExit(f"the TPU model worker refused a kernel: {refused}")
    if status != 0 or not any(e.get("event") == "done" for e in events):
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        raise SystemExit(f"the TPU model worker failed (exit {status}): {' | '.join(tail)}")
    return [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "row"]


def quant_table(rows: list[dict]) -> str:
    head = ("model", "phase", "format", "chip", "ours ms", "ideal ms", "ours/ideal", "ours/bf16",
            "ours/bf16 fast..slow", "steps", "HBM MiB")
    out = [head]
    for r in rows:
        lo, hi = r["over_bf16_band"]
        out.append((r["model"], f"{r['phase']} {r['tokens']}", r["format"], r["generation"],
                    f"{r['modeled_s'] * 1e3:.3f}", f"{r['ideal_s'] * 1e3:.3f}", f"{r['modeled_over_ideal']:.3f}",
                    f"{r['over_bf16']:.3f}", f"{lo:.3f}..{hi:.3f}", str(r["steps"]), f"{r['hbm_bytes'] / 2**20:.0f}"))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out]
    lines.append("decode targets: quantized ours/bf16 <= 0.55, ours/ideal <= 1.15 (ideal: quantized "
                 "weights + scales of active experts once, bf16 activations); fast..slow: the ratio at both ends of "
                 "the constants' bands (docs/tpu-cost-model.md)")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = ("kernel", "shape", "chip", "ours ms", "ideal ms", "XLA est ms", "ours/ideal", "steps", "HBM MiB", "GFLOP")
    out = [head]
    for r in rows:
        xla = "-" if r["xla_estimate_s"] is None else f"{r['xla_estimate_s'] * 1e3:.3f}"
        ms = lambda key, r=r: f"{r[key] * 1e3:.3f}"
        out.append((r["kernel"], r["shape"], r["generation"], ms("modeled_s"), ms("ideal_s"), xla,
                    f"{r['modeled_over_ideal']:.3f}", str(r["steps"]), f"{r['hbm_bytes'] / 2**20:.0f}",
                    f"{r['flops'] / 1e9:.1f}"))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out]
    lines.append(f"step overhead {STEP_OVERHEAD_S * 1e6:.2f} us/grid step; decode target ours/ideal <= {DECODE_TARGET}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--generations", default="v5e,v6e", help="TPU generations (default v5e,v6e)")
    parser.add_argument("--out", type=Path, help="also write the rows and the environment as JSON here")
    parser.add_argument("--quick", action="store_true", help="accepted for the report; the model is quick anyway")
    parser.add_argument("--quantized", action="store_true", help="the MoE layer on int8 / fp8 weights beside bf16")
    args = parser.parse_args(argv)
    if args.quantized:
        rows = quant_rows(parse_generations(args.generations))
        print(json.dumps(rows, indent=1) if args.json else quant_table(rows))
    else:
        rows = model_rows(parse_generations(args.generations))
        print(json.dumps(rows, indent=1) if args.json else table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "tpu_model", "environment": environment().model_dump(),
                                        "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
