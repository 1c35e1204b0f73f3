"""Ragged paged attention on the paged peers' rows (tpu_cost_model/paged_peers.py: Qwen3-30B-A3B, Gemma 4 26B-A4B
sliding and global; decode 64 x 8k, and 4 prefill chunks of 496 tokens over 4096 beside 60 decode steps), modeled
per pallas_call (the cache write and the attention apart), with the blocks a call on that chip runs (the trace sees
the mock chip as its default device, so the chip's tuned table applies), beside vLLM's RPA v3 on the same rows.

    python bench/paged_mixed_modeled.py [--json] [--generations v5e,v6e,v7x] [--phases mixed,decode]
                                        [--kernel-root PATH] [--no-peer]

Modeled, not measured: tpu_cost_model.kernel_cost, calibrated (docs/tpu-cost-model.md); band = both ends of the
constants' bands. Ours is traced under `jax.jit(..., donate_argnums=(3, 4))` (caches donated, as a server does).
RPA v3: paged_peers' candidates, the faster by the model that libtpu compiles. `--kernel-root` reads ours from
another checkout (a before / after comparison); `--no-peer` skips RPA v3 (its compiles take minutes). Runs in the
TPU environment (make setup-tpu), in a subprocess of it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path

from tpu_rows import rows_from_tpu_env

ROOT = Path(__file__).resolve().parents[1]


def model_rows(generations: list[str], phases: list[str], kernel_root: Path, peer: bool) -> None:
    """Runs inside the TPU environment: one JSON line per (generation, geometry, phase, kernel)."""
    import jax
    import numpy as np

    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import topology_devices
    from kernel_hub.tpu.worker_common import load_package
    from tpu_cost_model import paged_peers as pp
    from tpu_cost_model.schedule import kernel_cost

    fa = load_package(folder_package(kernel_root / "kernels/pallas/flash_attention").request())
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    geos = {g.model: g for g in shapes.ATTENTION_MODELS}
    sds = jax.ShapeDtypeStruct
    for gen in generations:
        c = chip(gen)
        jax.config.update("jax_default_device", topology_devices(c.topology)[0])  # the chip's tuned blocks
        for model in pp.PAGED_MODELS:
            geo = geos[model]
            for phase in phases:
                seqs = pp.batch(phase)
                meta = pp._metadata(seqs)
                tokens, b = sum(q for q, _ in seqs), len(seqs)
                scale = 1.0 / math.sqrt(geo.d)
                cache = sds((b * (pp.CACHE // pp.PAGE), pp.PAGE, geo.hkv, geo.d), "bfloat16")
                args = (sds((tokens, geo.hq, geo.d), "bfloat16"), sds((tokens, geo.hkv, geo.d), "bfloat16"),
                        sds((tokens, geo.hkv, geo.d), "bfloat16"), cache, cache, meta["kv_lens"], meta["table"],
                        meta["cu"], np.int32(b))
                fn = jax.jit(lambda *a, g=geo, s=scale: fa.ragged_paged_attention(
                    *a, sm_scale=s, sliding_window=g.window, implementation="pallas", interpret=False),
                    donate_argnums=(3, 4))
                base = {"generation": gen, "model": f"{model} {geo.hq}/{geo.hkv}x{geo.d}", "phase": phase}
                start = time.perf_counter()
                cost = kernel_cost(fn, *args, generation=gen)
                lo, hi = cost.band(c)
                calls = [{"name": k.name, "ms": k.seconds(c) * 1e3, "dmas": k.dmas, "stages": k.stages}
                         for k in cost.calls]
                print(json.dumps({**base, "kernel": "ours", "ms": cost.seconds(c) * 1e3,
                                  "band_ms": [lo * 1e3, hi * 1e3], "calls": calls, "blocks": fa.last_tuning(clear=True),
                                  "model_s": round(time.perf_counter() - start, 1)}), flush=True)
                if peer:
                    rpa = pp._rpa_v3(geo, seqs, meta, "bfloat16", gen, scale)
                    row = {**base, "kernel": "RPA v3", "detail": rpa.detail}
                    if rpa.fn is None:
                        row["refused"] = rpa.refused
                    else:
                        cost = kernel_cost(rpa.fn, *rpa.args, generation=gen)
                        lo, hi = cost.band(c)
                        row.update(ms=cost.seconds(c) * 1e3, band_ms=[lo * 1e3, hi * 1e3])
                    print(json.dumps(row), flush=True)


def table(rows: list[dict]) -> str:
    lines = ["chip | geometry | phase | kernel | modeled ms (band) | per call ms (DMAs, stages) | blocks"]
    for r in rows:
        if "ms" not in r:
            lines.append(f"{r['generation']} | {r['model']} | {r['phase']} | {r['kernel']} | refused: {r['refused']}")
            continue
        calls = "; ".join(f"{k['name']} {k['ms']:.3f} ({k['dmas']:.0f}, {k['stages']:.0f})" for k in r.get("calls", []))
        lines.append(f"{r['generation']} | {r['model']} | {r['phase']} | {r['kernel']} | {r['ms']:.3f} "
                     f"({r['band_ms'][0]:.3f}-{r['band_ms'][1]:.3f}) | {calls or r.get('detail', '')} | "
                     f"{r.get('blocks') or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--phases", default="mixed,decode")
    parser.add_argument("--kernel-root", type=Path, default=ROOT, help="the checkout whose flash_attention to model")
    parser.add_argument("--no-peer", action="store_true", help="ours only (no RPA v3 compiles)")
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if args.in_tpu_env:
        model_rows(gens, phases, args.kernel_root.resolve(), not args.no_peer)
        return 0
    forward = ["--generations", args.generations, "--phases", args.phases, "--kernel-root", str(args.kernel_root)]
    rows, failed = rows_from_tpu_env(__file__, forward + (["--no-peer"] if args.no_peer else []))
    if failed:
        return failed
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
