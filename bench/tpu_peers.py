"""Our TPU kernels beside the TPU kernels a user would pick instead, every one read by the same cost model.

    python bench/tpu_peers.py [--json] [--generations v5e,v6e,v7x] [--kernels ragged_dot,attention] [--out PATH]
                              [--quick]

Rows (tpu_cost_model.peers_worker): per seed MoE geometry (Qwen3-30B-A3B, Gemma 4 26B-A4B), gate_up and down,
decode 64 tokens and prefill 4096 (one uniform top-8 routing per row): our ragged dot, megablox gmm (default tiling and
the best of a sweep over legal tilings), vLLM's megablox gmm (tpu-inference 0.32.0, installed; best legal tiling),
Tokamax 0.0.12's Mosaic ragged dot (or its refusal), jax.lax.ragged_dot (XLA's optimal_seconds); attention at
GPT-OSS-20B heads (64/8 x 64, sinks), prefill 4096 causal and decode batch 64 over 8192-long caches: ours, jax
flash_attention, splash_attention, paged_attention, ragged_paged_attention, vLLM's RPA v3 (tpu-inference); ragged
paged attention (tpu_cost_model/paged_peers.py) at Qwen3-30B-A3B and Gemma 4 26B-A4B heads, decode 64 x 8k and a mixed
prefill + decode batch: ours, vLLM's RPA v3, jax paged_attention (decode).
modeled_s: tpu_cost_model.schedule.kernel_cost, calibrated against measured TPU times
(bench/tpu_calibration.py, docs/tpu-cost-model.md), at the points of its per-generation constants; band_s: the same at
both ends of their bands; ours<=best across band: whether ours is no slower than the best peer at the point and at
both ends (each evaluated with the same constants); ideal_s: bytes moved once at streamed-copy bandwidth or useful
FLOPs / peak; compiled: libtpu for
that generation ("yes" or the compiler's first line). One TPU-env worker per generation, run in parallel.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernel_hub.report.environment import environment  # noqa: E402
from kernel_hub.tpu.chips import parse_generations  # noqa: E402
from kernel_hub.tpu.env import tpu_env  # noqa: E402
from kernel_hub.tpu.package import folder_package  # noqa: E402
from kernel_hub.tpu.worker_client import default_jobs, refusal  # noqa: E402
from tpu_cost_model.worker import run_in_worker  # noqa: E402

KEYS = ("kernel", "peer", "shape", "generation", "modeled_s", "band_s", "ideal_s", "ratio_to_ideal", "best_peer",
        "best_peer_s", "ours_over_best_peer", "ours_le_best_across_band", "compiled")


def request(generation: str, *, moe_models: list[str], phases: dict[str, int] | None = None,
            kernels: list[str] | None = None, attention_shapes: dict[str, int] | None = None,
            moe_geometries: list[dict] | None = None) -> dict:
    return {
        "mode": "peers",
        "ragged_dot": folder_package(ROOT / "kernels/pallas/ragged_dot").request(),
        "flash_attention": folder_package(ROOT / "kernels/pallas/flash_attention").request(),
        "generations": [generation], "moe_models": moe_models, "attention_model": "gpt_oss_20b",
        "dtype": "bfloat16", "phases": phases, "kernels": kernels, "attention_shapes_override": attention_shapes,
        "moe_geometries": moe_geometries,
    }


def _one(req: dict) -> list[dict]:
    events, status, stderr = run_in_worker(tpu_env(), req, timeout=3600)
    refused = refusal(events)
    if refused is not None:
        raise SystemExit(f"the TPU peers worker refused a kernel: {refused}")
    if status != 0 or not any(e.get("event") == "done" for e in events):
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        raise SystemExit(f"the TPU peers worker failed (exit {status}): {' | '.join(tail)}")
    return [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "row"]


def peer_rows(generations: tuple[str, ...], **kwargs) -> list[dict]:
    """Every generation in its own worker, in parallel (as the compile gate runs them)."""
    with ThreadPoolExecutor(max_workers=default_jobs(len(generations))) as pool:
        parts = list(pool.map(lambda g: _one(request(g, **kwargs)), generations))
    return [r for part in parts for r in part]


def _f(v: float | None, scale: float = 1.0, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v * scale, fmt)


def table(rows: list[dict]) -> str:
    head = ("kernel", "shape", "chip", "peer", "modeled ms", "band ms", "ideal ms", "x ideal", "best peer",
            "ours/best", "ours<=best across band", "compiled")
    out = [head]
    for r in rows:
        band = r.get("band_s")
        held = r.get("ours_le_best_across_band")
        out.append((r["kernel"], r["shape"], r["generation"], r["peer"], _f(r["modeled_s"], 1e3),
                    "-" if not band else f"{band[0] * 1e3:.3f}..{band[1] * 1e3:.3f}",
                    _f(r["ideal_s"], 1e3), _f(r["ratio_to_ideal"], 1, ".2f"), r["best_peer"] or "-",
                    _f(r["ours_over_best_peer"], 1, ".2f"), "-" if held is None else ("yes" if held else "no"),
                    str(r["compiled"])[:60]))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out)


KERNELS = ("ragged_dot", "attention", "paged_attention")


def kernel_selection(text: str) -> list[str]:
    """"ragged_dot,attention" -> the worker's kernel names, checked; ValueError naming the known ones."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in KERNELS]
    if unknown or not names:
        raise ValueError(f"unknown --kernels {', '.join(unknown) or repr(text)}; known: {', '.join(KERNELS)}")
    return names


def _family(row: dict) -> str:
    kernel = row.get("kernel")
    if kernel == "ragged_dot":
        return "ragged_dot"
    return "paged_attention" if kernel == "ragged_paged_attention" else "attention"


def kept_rows(path: Path, kernels: list[str], generations: tuple[str, ...] | None = None) -> list[dict]:
    """The rows of kernels or generations not run this time from an earlier record at `path` (none if it is absent),
    so a run of one kernel's rows, or of some generations, replaces only those."""
    if not path.exists():
        return []
    old = json.loads(path.read_text()).get("rows", [])
    return [r for r in old if isinstance(r, dict)
            and (_family(r) not in kernels or (generations is not None and r.get("generation") not in generations))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--generations", default="v5e,v6e,v7x", help="TPU generations (default v5e,v6e,v7x)")
    parser.add_argument("--kernels", default="ragged_dot,attention,paged_attention",
                        help="which rows: ragged_dot, attention, paged_attention (default all)")
    parser.add_argument("--out", type=Path, help="also write the rows and the environment as JSON here; with --kernels "
                        "naming one, the other kernel's rows already in that file are kept")
    parser.add_argument("--quick", action="store_true", help="Qwen3-30B-A3B decode only, one generation")
    args = parser.parse_args(argv)
    gens = parse_generations(args.generations)
    kernels = kernel_selection(args.kernels)
    if args.quick:
        rows = peer_rows(gens[:1], moe_models=["qwen3_30b_a3b"], phases={"decode": 64}, kernels=kernels)
    else:
        rows = peer_rows(gens, moe_models=["qwen3_30b_a3b", "gemma4_26b_a4b"], kernels=kernels)
    print(json.dumps([{**{k: r[k] for k in KEYS}, "detail": r.get("detail", "")} for r in rows], indent=1)
          if args.json else table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        kept = kept_rows(args.out, kernels, tuple(gens))
        args.out.write_text(json.dumps({"benchmark": "tpu_peers", "environment": environment().model_dump(),
                                        "rows": kept + rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
