"""The Tokamax Mosaic ragged-dot peer rows alone (modeled; TPU env): its walk is long (its whole grid is a pipeline
inside one kernel step), so these rows are produced apart from bench/tpu_peers.py and set beside our kernel's rows
read from an earlier record.

    .venv-tpu/bin/python bench/tpu_peers_tokamax.py [--generations v5e,v6e,v7x] [--phases decode,prefill]
                                                    [--models qwen3_30b_a3b,gemma4_26b_a4b] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "kernels" / "pallas")]


def table(rows: list[dict]) -> str:
    """shape | chip | modeled us (band) | ours / tokamax, every number modeled."""
    out = ["shape | chip | tokamax modeled us (band) | ours modeled us | ours / tokamax | walk s",
           "---|---|---|---|---|---"]
    for r in rows:
        band = r["band_s"]
        t = "-" if r["modeled_s"] is None else f"{r['modeled_s'] * 1e6:.1f} ({band[0] * 1e6:.1f}..{band[1] * 1e6:.1f})"
        ours = "-" if r["ours_s"] is None else f"{r['ours_s'] * 1e6:.1f}"
        ratio = "-" if r["ours_over_peer"] is None else f"{r['ours_over_peer']:.3f}"
        out.append(f"{r['shape']} | {r['generation']} | {t} | {ours} | {ratio} | {r.get('walk_s', '-')}")
    return "\n".join(out)


def _write_row(path: Path, row: dict) -> list[dict]:
    """Sets one row in the record at `path` as it stands now (another run may be filling other rows of it: runs
    split by --models or --generations share one record), in the record's order; returns its rows."""
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    key = (row["shape"], row["generation"])
    at = next((i for i, r in enumerate(rows) if (r["shape"], r["generation"]) == key), None)
    if at is None:
        rows.append(row)
    else:
        rows[at] = row
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"benchmark": "tokamax mosaic ragged_dot peer (modeled)", "rows": rows}, indent=1) + "\n")
    tmp.replace(path)
    return rows


def set_into(peers_path: Path, rows: list[dict]) -> tuple[list[dict], int]:
    """The record of bench/tpu_peers.py at `peers_path` with its Tokamax rows set to `rows` (modeled time, band,
    ratio to the ideal and how, for each workload and chip both hold) and those workloads' best peer set again;
    every other row is kept as it is. Returns the record's rows and how many were set."""
    from tpu_cost_model.peer_rows import set_best_peer

    record = json.loads(peers_path.read_text())
    mine = {(r["shape"], r["generation"]): r for r in rows}
    workloads: dict[tuple[str, str], list[dict]] = {}
    for r in record["rows"]:
        if r["kernel"] == "ragged_dot":
            workloads.setdefault((r["shape"], r["generation"]), []).append(r)
    done = 0
    for key, group in workloads.items():
        new = mine.get(key)
        old = next((r for r in group if r["peer"] == (new or {}).get("peer")), None)
        if new is None or old is None:
            continue
        old.update({"modeled_s": new["modeled_s"], "band_s": new["band_s"], "how": new["how"],
                    "ratio_to_ideal": None if new["modeled_s"] is None or not old["ideal_s"]
                    else new["modeled_s"] / old["ideal_s"]})
        set_best_peer(group)
        done += 1
    return record["rows"], done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--phases", default="decode,prefill")
    parser.add_argument("--models", default="qwen3_30b_a3b,gemma4_26b_a4b")
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "records" / "tpu_peers.json",
                        help="earlier record whose kernel-hub rows the peer is set beside")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "records" / "tpu_peers_tokamax.json")
    parser.add_argument("--show", action="store_true", help="print the rows already in --out as a table; run nothing")
    parser.add_argument("--into", type=Path, help="set the rows already in --out into this bench/tpu_peers.py "
                        "record (its Tokamax rows and their workloads' best peer; every other row kept) and its .txt "
                        "table beside it; run nothing")
    args = parser.parse_args()
    if args.into:
        sys.path.insert(0, str(ROOT / "bench"))
        from tpu_peers import table as peers_table

        rows, done = set_into(args.into, json.loads(args.out.read_text())["rows"])
        record = json.loads(args.into.read_text())
        source = args.out.resolve().relative_to(ROOT) if args.out.resolve().is_relative_to(ROOT) else args.out
        args.into.write_text(json.dumps({**record, "tokamax_rows_from": str(source), "rows": rows}, indent=2))
        # the .txt holds the ragged dot and attention rows; the paged ones are apart (tpu_peers_paged.txt)
        args.into.with_suffix(".txt").write_text(
            peers_table([r for r in rows if r["kernel"] != "ragged_paged_attention"]) + "\n")
        print(f"{done} Tokamax rows set into {args.into}")
        return 0
    if args.show:
        print(table(json.loads(args.out.read_text())["rows"]))
        return 0
    sys.argv[1:] = []  # tokamax parses the command line as its own flags when imported

    import numpy as np
    from _common.moe_shapes import MOE_MODELS, PHASES

    from kernel_hub.tpu.target import tpu_target
    from tpu_cost_model.peer_rows import OURS, _modeled
    from tpu_cost_model.peers_worker import _tokamax_peer
    from tpu_cost_model.workload import routing

    old = json.loads(args.record.read_text())["rows"]
    ours = {(r["shape"], r["generation"]): r for r in old if r["kernel"] == "ragged_dot" and r["peer"] == OURS}
    ideal = {(r["shape"], r["generation"]): r["ideal_s"] for r in old if r["kernel"] == "ragged_dot"}
    geos = {g.model: g for g in MOE_MODELS}
    rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    done = {(r["shape"], r["generation"]) for r in rows if r["modeled_s"] is not None}
    for gen in args.generations.split(","):
        with tpu_target(gen):
            for model in args.models.split(","):
                geo = geos[model]
                for phase in args.phases.split(","):
                    tokens = PHASES[phase]
                    gs = routing(tokens, geo.experts, geo.top_k)
                    for proj, m, k, n, g in geo.projections(tokens):
                        shape = f"{geo.model} {proj} {phase} {tokens} tok (m={m} k={k} n={n})"
                        if (shape, gen) in done:
                            continue
                        t0 = time.time()
                        peer = _tokamax_peer(m, k, n, g, np.asarray(gs), "bfloat16")
                        modeled, band, how = _modeled(peer, None, gen) if peer.fn else (None, None, peer.refused)
                        mine = ours.get((shape, gen), {}).get("modeled_s")
                        row = {"kernel": "ragged_dot", "peer": peer.name, "shape": shape, "generation": gen,
                               "modeled_s": modeled, "band_s": None if band is None else list(band),
                               "ideal_s": ideal.get((shape, gen)), "how": how, "ours_s": mine,
                               "ours_over_peer": None if not (mine and modeled) else mine / modeled,
                               "walk_s": round(time.time() - t0, 1)}
                        rows = _write_row(args.out, row)
                        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
