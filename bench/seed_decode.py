"""The seed's headline, end to end: one decode step of Qwen3-30B-A3B and Gemma 4 26B-A4B on an 8-device TPU slice
(TP 8 + EP 8), compiled whole by libtpu for the mock slice and modeled op by op, beside Hugging Face's measurements.

    python bench/seed_decode.py [--json] [--models qwen3_30b_a3b,gemma4_26b_a4b] [--batches 64,1]
        [--caches 768] [--generations v6e,v5e,v7x] [--paths hub,jax_default,default_compiled,default_op_by_op]
        [--compile hub|all|none] [--write | --merge]
    python bench/seed_decode.py --gate [--generations v6e,v5e,v7x]
    python bench/seed_decode.py --restate-collectives

Paths: hub (kernel-hub's Pallas kernels: ragged paged attention, moe_experts on the ragged dot, RMSNorm),
jax_default (the same step on JAX's own ops), default_compiled (transformers' math compiled whole: K/V repeated to
every query head over the static cache, experts by XLA's ragged dot), default_op_by_op (default_compiled's modeled
device time plus one dispatch per op a transformers decode step issues, counted by bench/decode_op_count.py, at the
calibration table's torch-tpu-op-by-op dispatch band), hub_op_by_op (the hub path's device time plus one
dispatch per call of HF's run (the experts block one call, the rest op by op: what HF's hub number is), vllm_tpu
(the hub step with vLLM TPU's attention and gmm swapped in, modeled only). Every time is modeled (tpu_cost_model),
never measured.
--write stores the rows in bench/records/seed_decode.json; --merge puts them in place of the record's rows of the
same model, batch, cache, chip and path and keeps the rest. --gate compiles one layer group of each model's step on
the hub path for each slice (tpu_cost_model.decode_gate) and exits 1 naming what does not compile.
--restate-collectives charges the record's collectives again with the current ICI model (tpu_cost_model.ici), in
place: the worker adds them after the walk, so no compile is needed for that term alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RECORD = ROOT / "bench" / "records" / "seed_decode.json"
#: Hugging Face's kernels-community/ragged-dot-tpu card, v6e-8, TP 8 + EP: (model, batch) -> (default grouped_mm,
#: ragged-dot-tpu) decode-step seconds.
HF = {("qwen3_30b_a3b", 64): (1.2159, 0.0566), ("qwen3_30b_a3b", 1): (0.0300, 0.0265),
      ("gemma4_26b_a4b", 64): (4.8583, 0.3794), ("gemma4_26b_a4b", 1): (0.3440, 0.3226)}
#: Device calls of one transformers decode step op by op (bench/decode_op_count.py, tiny models scaled to depth):
#: (default; HF's run: only the experts block one call (default - 15 ops x layers + layers); after kh.kernelize on
#: TorchTPU: each experts block, RMSNorm and attention call one kernel call).
OP_COUNTS = {"qwen3_30b_a3b": (3184, 3184 - 14 * 48, 1547), "gemma4_26b_a4b": (3531, 3531 - 14 * 30, 1516)}
#: The row fields every consumer may rely on.
FIELDS = ("model", "batch", "chip", "mesh", "path", "modeled_s", "band_s", "hbm_floor_s", "compiled",
          "hbm_per_chip_bytes")


def op_by_op(row: dict, calls: int, path: str = "default_op_by_op") -> dict:
    """A compiled path's modeled device time, each of `calls` ops dispatched on its own at the calibration table's
    torch-tpu-op-by-op band (none .. 125 us a call, point 62.5 us)."""
    from tpu_cost_model.calibration import HARNESSES

    h = HARNESSES["torch-tpu-op-by-op"]
    compiled_only = ("compile_seconds", "argument_bytes", "temp_bytes", "output_bytes", "alias_bytes", "error")
    out = {k: v for k, v in row.items() if k not in compiled_only}
    out |= {"path": path, "compiled": False, "hbm_per_chip_bytes": None, "device_calls": calls}
    if row.get("modeled_s") is None:
        return out
    out["modeled_s"] = row["modeled_s"] + calls * h.dispatch_s
    out["band_s"] = [row["band_s"][0] + calls * h.low_s, row["band_s"][1] + calls * h.high_s]
    return out


def rows(args: argparse.Namespace) -> list[dict]:
    from tpu_cost_model.decode import decode_rows

    paths = args.paths.split(",")
    worker_paths = [p for p in paths if not p.endswith("_op_by_op")]
    if "default_op_by_op" in paths and "default_compiled" not in worker_paths:
        worker_paths.append("default_compiled")
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    caches, gens = [int(c) for c in args.caches.split(",")], args.generations.split(",")
    keys = None
    if args.compile != "all":
        keys = [] if args.compile == "none" else [[m, b, c, g, "hub"] for m in models for b in batches
                                                   for c in caches for g in gens]
    out = []
    for gen in gens:  # one worker per generation: jit caches keyed by a mesh of the same device ids are per process
        out += decode_rows(tuple(models), tuple(batches), tuple(caches), (gen,), tuple(worker_paths),
                           compile_keys=keys, model_only=args.compile == "none")
    return derive(out, paths)


def derive(out: list[dict], paths: list[str]) -> list[dict]:
    """The worker's rows kept where asked, plus the op-by-op rows derived from the compiled ones: default_op_by_op
    (transformers' default, op by op: HF's "default") and hub_op_by_op (the hub kernels for the experts, the rest op
    by op, as HF's hub run)."""
    extra = []
    for r in out:
        calls = OP_COUNTS.get(r["model"])
        if calls and r["path"] == "default_compiled" and "default_op_by_op" in paths:
            extra.append(op_by_op(r, calls[0]))
        if calls and r["path"] == "hub" and "hub_op_by_op" in paths:
            extra.append(op_by_op(r, calls[1], "hub_op_by_op"))
    return [r for r in out if r["path"] in paths] + extra


def row_key(r: dict) -> tuple:
    return r["model"], r["batch"], r.get("cache"), r["chip"], r["path"]


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """The record's rows with `new` in place of the rows of the same model, batch, cache, chip and path (in their
    places), the other new rows appended. Pure."""
    fresh = {row_key(r): r for r in new}
    out = [fresh.pop(row_key(r), r) for r in old]
    return out + [r for r in new if row_key(r) in fresh]


def write_record(found: list[dict], merge: bool = False) -> None:
    if merge and RECORD.exists():
        found = merged(json.loads(RECORD.read_text())["rows"], found)
    RECORD.write_text(json.dumps({"about": __doc__.strip().splitlines()[0] + " (modeled, not measured)",
                                  "hf": {f"{m}:{b}": v for (m, b), v in HF.items()}, "rows": found},
                                 indent=1) + "\n")


def restated(row: dict, coll_at) -> dict:
    """A recorded row with its collectives charged again: `coll_at(end)` is the step's collectives at the point
    (None) and at the band's "fast" and "slow" ends. The decode worker adds the collectives after the walk, so the
    rest of the row (kernels, compiled glue, dispatch) stands; the band's ends carried `collectives_band_s` (rows
    recorded before it carried the point at both). A row with no modeled time is returned as it is."""
    if row.get("modeled_s") is None or row.get("collectives_s") is None:
        return row
    old = row["collectives_s"]
    old_ends = row.get("collectives_band_s") or [old, old]
    d = {None: coll_at(None) - old, "fast": coll_at("fast") - old_ends[0], "slow": coll_at("slow") - old_ends[1]}
    shift = lambda band: [band[0] + d["fast"], band[1] + d["slow"]]
    out = {**row, "collectives_s": coll_at(None), "collectives_band_s": [coll_at("fast"), coll_at("slow")],
           "modeled_s": row["modeled_s"] + d[None], "band_s": shift(row["band_s"])}
    if row.get("modeled_jaxpr_s") is not None:
        out |= {"modeled_jaxpr_s": row["modeled_jaxpr_s"] + d[None], "band_jaxpr_s": shift(row["band_jaxpr_s"])}
    return out


def restate_collectives(found: list[dict]) -> list[dict]:
    """Every row's collectives by the current ICI model (tpu_cost_model.ici), from the ragged-dot package's
    dispatch plan as the worker builds it."""
    from kernel_hub.tpu.package import folder_package
    from tpu_cost_model.decode_models import MODELS
    from tpu_cost_model.decode_worker import step_collectives
    from tpu_cost_model.workload import load_moe_kernel

    rd = load_moe_kernel(folder_package(ROOT / "kernels/pallas/ragged_dot").request()).rd
    return [restated(r, step_collectives(MODELS[r["model"]], rd, r["batch"], r["devices"], r["chip"],
                                         r.get("shared_rides_experts_all_reduce", False)).get)
            for r in found]


def table(found: list[dict]) -> str:
    head = ("model", "batch", "cache", "chip", "path", "modeled ms (band)", "floor ms", "x floor", "compiled",
            "HBM/chip GiB", "HF default / hub ms")
    body = []
    for r in found:
        ms = lambda s: "-" if s is None else f"{s * 1e3:.1f}"
        band = "" if r.get("modeled_s") is None else f" ({ms(r['band_s'][0])}-{ms(r['band_s'][1])})"
        hf = HF.get((r["model"], r["batch"]))
        ratio = "-" if r.get("modeled_s") is None else f"{r['modeled_s'] / r['hbm_floor_s']:.1f}"
        mem = r.get("hbm_per_chip_bytes")
        body.append((r["model"], str(r["batch"]), str(r.get("cache", "")), r["chip"], r["path"],
                     ms(r.get("modeled_s")) + band, ms(r["hbm_floor_s"]), ratio,
                     "yes" if r["compiled"] else ("no: " + r["error"][:40] if r.get("error") else "no"),
                     "-" if mem is None else f"{mem / 2**30:.2f}",
                     "-" if hf is None or r["chip"] != "v6e" else f"{hf[0] * 1e3:.1f} / {hf[1] * 1e3:.1f}"))
    widths = [max(len(x[c]) for x in [head, *body]) for c in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(x, widths, strict=True)).rstrip() for x in [head, *body])


def markdown(found: list[dict]) -> str:
    """The docs page's table: ms per step per path beside HF's, our ratio against the default, the floor."""
    ms = lambda s: f"{s * 1e3:.1f}"
    by = {(r["model"], r["batch"], r["chip"], r.get("cache"), r["path"]): r for r in found}
    lines = ["| model | batch | cache | chip | path | step | modeled ms (band) | XLA glue charged | jaxpr rule ms | "
             "kernels + collectives ms | floor ms | x floor (band) | compiled | HBM per chip GiB | "
             "default / this (modeled) | HF ms (default / hub) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        if r.get("modeled_s") is None:
            continue
        hf = HF.get((r["model"], r["batch"])) if r["chip"] == "v6e" else None
        default = by.get((r["model"], r["batch"], r["chip"], r.get("cache"), "default_op_by_op"))
        ratio = "" if default is None or default.get("modeled_s") is None else \
            f"{default['modeled_s'] / r['modeled_s']:.1f}x"
        core = "" if "kernels_s" not in r else ms(r["kernels_s"] + r["collectives_s"])
        mem = r.get("hbm_per_chip_bytes")
        rule = "compiled" if r.get("xla_rule") == "compiled" else "jaxpr"
        jaxpr = ms(r["modeled_jaxpr_s"]) if r.get("modeled_jaxpr_s") is not None else ms(r["modeled_s"])
        x = lambda s, f=r['hbm_floor_s']: f"{s / f:.1f}"
        step = r.get("step", "sliced")  # rows recorded before the stacked step sliced each layer's experts and caches
        lines.append(f"| {r['model']} | {r['batch']} | {r.get('cache', '')} | {r['chip']} | {r['path']} | {step} | "
                     f"{ms(r['modeled_s'])} ({ms(r['band_s'][0])}-{ms(r['band_s'][1])}) | {rule} | {jaxpr} | {core} | "
                     f"{ms(r['hbm_floor_s'])} | {x(r['modeled_s'])} ({x(r['band_s'][0])}-{x(r['band_s'][1])}) | "
                     f"{'yes' if r['compiled'] else 'no'} | {'-' if mem is None else f'{mem / 2**30:.2f}'} | "
                     f"{ratio} | {'' if hf is None else f'{ms(hf[0])} / {ms(hf[1])}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON row per model x batch x chip x path")
    ap.add_argument("--models", default="qwen3_30b_a3b,gemma4_26b_a4b")
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--caches", default="768")
    ap.add_argument("--generations", default="v6e,v5e,v7x")
    ap.add_argument("--paths", default="hub,jax_default,default_compiled,vllm_tpu,default_op_by_op,hub_op_by_op")
    ap.add_argument("--compile", default="hub", choices=("hub", "all", "none"), help="which paths compile")
    ap.add_argument("--write", action="store_true", help=f"store the rows in {RECORD.relative_to(ROOT)}")
    ap.add_argument("--merge", action="store_true", help="store the rows in the record in place of the rows of the "
                    "same model, batch, cache, chip and path, keeping the others")
    ap.add_argument("--markdown", action="store_true", help="print the docs page's table of the recorded rows")
    ap.add_argument("--gate", action="store_true", help="the release check: one layer group compiled per slice")
    ap.add_argument("--restate-collectives", action="store_true",
                    help="charge every recorded row's collectives again with the current ICI model, in place (they "
                    "are added after the walk: nothing else in a row depends on them)")
    args = ap.parse_args(argv)
    if args.restate_collectives:
        record = json.loads(RECORD.read_text())
        write_record(restate_collectives(record["rows"]))
        return 0
    if args.markdown:
        print(markdown(json.loads(RECORD.read_text())["rows"]))
        return 0
    if args.gate:
        from tpu_cost_model.decode_gate import step_gate

        found, failed = step_gate(generations=tuple(args.generations.split(",")))
        for r in found:
            print(f"{r['model']:16} {r['mesh']:12} {'compiles' if r['compiled'] else 'REFUSED'} "
                  f"{r.get('compile_seconds', 0):.0f} s")
        for line in failed:
            print(f"gate: {line}", file=sys.stderr)
        return 1 if failed else 0
    found = rows(args)
    if args.write or args.merge:
        write_record(found, merge=args.merge)
    if args.json:
        for r in found:
            print(json.dumps(r))
    else:
        print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
