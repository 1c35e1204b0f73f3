"""Attention prefill (GPT-OSS-20B heads 64/8 x 64, sinks, 4096 causal, bf16): ours beside every candidate of the
peers bench's jax splash_attention and flash_attention sweeps, each modeled at the point and both band ends.

    /work/main/.venv-tpu/bin/python bench/attention_prefill_sweep.py --generation v5e [--peers splash,flash]
                                    [--out bench/records/attention_prefill_sweep.json]

Runs in the TPU environment (PYTHONPATH=src, ALLOW_MULTIPLE_LIBTPU_LOAD=1). Unlike bench/tpu_peers.py nothing is
compiled: the minimum over all candidates, legal or not, bounds the best legal one from below, so ours <= that
minimum at an end means ours <= the best legal peer there. The row per generation replaces that generation's row in
--out. Modeled (tpu_cost_model), never measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import tpu_cost_model.peers_worker as pw  # noqa: E402
from kernel_hub.tpu.chips import chip  # noqa: E402
from kernel_hub.tpu.package import folder_package  # noqa: E402
from kernel_hub.tpu.target import tpu_target  # noqa: E402
from tpu_cost_model.schedule import kernel_cost  # noqa: E402
from tpu_cost_model.workload import load_package  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", required=True)
    parser.add_argument("--peers", default="splash,flash", help="sweeps to model: splash, flash")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    gen, wanted, c = args.generation, args.peers.split(","), chip(args.generation)
    fa = load_package(folder_package(ROOT / "kernels/pallas/flash_attention").request())
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    geo = {g.model: g for g in shapes.ATTENTION_MODELS}["gpt_oss_20b"]
    row: dict = {"generation": gen, "shape": f"gqa {geo.hq}/{geo.hkv}x{geo.d} prefill 4096 causal"}

    def ends(fn, fn_args) -> list[float]:
        cost = kernel_cost(fn, *fn_args, generation=gen)
        fast, slow = cost.band(c)
        return [cost.seconds(c), fast, slow]

    def sweep(name, candidates, fn_args, generation, tries=4):  # replaces best_legal: every candidate, no compile
        key = "splash" if "splash" in name else "flash"
        if key in wanted:
            modeled = []
            for label, fn in candidates:
                try:
                    modeled.append((ends(fn, fn_args), label))
                except Exception:  # a configuration the kernel refuses at trace, skipped as best_legal does
                    continue
            best = min(modeled, key=lambda t: t[0][0])
            row[key] = {"candidates": len(modeled), "best_at_point": best[1], "best_at_point_s": best[0],
                        "min_s": [min(m[0][i] for m in modeled) for i in range(3)]}
        return pw.Peer(name, None, refused="modeled only")

    pw.best_legal = sweep
    with tpu_target(gen):
        ours = pw.prefill_peers(fa, geo, 4096, "bfloat16", gen)[0]
        row["ours_s"] = ends(ours.fn, ours.args)
    peers = [row[k]["min_s"] for k in ("splash", "flash") if k in row]
    best = [min(p[i] for p in peers) for i in range(3)]
    row["ours_over_min_peer"] = [o / b for o, b in zip(row["ours_s"], best, strict=True)]  # point, fast, slow
    print(json.dumps(row))
    if args.out:
        rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
        rows = [r for r in rows if r["generation"] != gen] + [row]
        args.out.write_text(json.dumps({"benchmark": "attention_prefill_sweep", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
