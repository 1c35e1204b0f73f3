"""The cost model against published measured TPU kernel times: bench/records/tpu_calibration.json, row by row.

    python bench/tpu_calibration.py [--json] [--rows ID,ID...] [--out PATH] [--held-out PATH] [--peer-source DIR ...]
    python bench/tpu_calibration.py --show ID [--hlo] [--peer-source DIR ...]
    python bench/tpu_calibration.py --tables [bench/records/tpu_held_out.json]

Each row's kernel is modeled at its shapes by our walker on the measured kernel's own code as installed in the TPU
environment (jax's Pallas ops; tpu-inference 0.32.0 with --no-deps), tpu_cost_model.calibration_worker; the
grouped-matmul rows' kernels (newer than any wheel that installs here) from the source of the checkouts or git
mirrors given with --peer-source, whose repository and commit each such row records; a row the walker cannot read
says which primitive or why. modeled = the model's device time at the points of its
constants' bands, plus the dispatch of the row's harness where the measurement is host-timed (calibration.HARNESSES);
band = the same at both ends of the bands; error = modeled / measured - 1 (target: within 20%). `uncalibrated` is
the model before calibration (spec bandwidth, steps added to the bound, f32 dots at six passes) at the same shapes.
--held-out writes the error per kind on the rows no constant was fitted on (calibration.held_out). --show prints
the program the model reads for a row and what it charges for each op, and the XLA ops outside the kernels side by
side as the jaxpr walk charges them and as libtpu's compiled program keeps them (--hlo: and the lowered StableHLO).
The table per kind and chip gives each row's error with the compiled program's XLA ops (after) and with the jaxpr
walk's (before).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernel_hub.tpu.env import tpu_env  # noqa: E402
from kernel_hub.tpu.package import folder_package  # noqa: E402
from tpu_cost_model import calibration  # noqa: E402
from tpu_cost_model.peer_source import read_peer_sources  # noqa: E402
from tpu_cost_model.worker import run_in_worker  # noqa: E402


def model_rows(rows: list[dict], hf: list[dict] | None = None, peers: dict | None = None) -> list[dict]:
    """Each table row with its modeled time and error (one TPU-env worker for all); with a list `hf`, our ragged
    dot modeled at the HF ragged-dot-tpu rows' shapes is appended to it; `peers`: the peer kernels' source
    (peer_source.read_peer_sources) for the rows whose kernel no installable wheel has."""
    request: dict = {"mode": "calibration", "rows": rows, "peer_sources": peers or {}}
    if hf is not None:
        request["ragged_dot"] = folder_package(ROOT / "kernels/pallas/ragged_dot").request()
    events, status, stderr = run_in_worker(tpu_env(), request, timeout=3600)
    if status != 0 or not any(e.get("event") == "done" for e in events):
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        raise SystemExit(f"the TPU calibration worker failed (exit {status}): {' | '.join(tail)}")
    modeled = {e["id"]: e for e in events if e.get("event") == "row"}
    if hf is not None:
        hf += [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "ours_hf"]
    out = []
    for row in rows:
        m = modeled[row["id"]]
        if "measured_bytes_per_s" in row:
            out.append({**row, **calibration.compare_bandwidth(row, m.get("modeled_bytes_per_s")), "modeled_s": None,
                        "band_bytes_per_s": m.get("band_bytes_per_s"), "how": m["how"], "uncalibrated_error": None})
            continue
        before = m["uncalibrated_s"]  # device time only, as the model stated it before calibration
        jaxpr = m.get("jaxpr_device_s")  # the XLA ops around the kernels charged per traced op
        out.append({**row, **calibration.compare(row, m["device_s"], m.get("band_s")), "how": m["how"],
                    "xla_rule": m.get("xla_rule"), "scalar_ops": m.get("scalar_ops"), "eup_elems": m.get("eup_elems"),
                    **{k: m.get(k) for k in ("steps", "stages", "vpu_elems")},
                    **{k: m[k] for k in ("peer_source", "shims") if k in m},
                    "jaxpr_rule_error": None if jaxpr is None else calibration.compare(row, jaxpr)["error"],
                    "uncalibrated_error": None if before is None else before / row["measured_s"] - 1.0})
    return out


def show(rows: list[dict], hlo: bool, peers: dict | None = None) -> str:
    """The program the model reads for each row and what it charges (one TPU-env worker)."""
    events, status, stderr = run_in_worker(tpu_env(), {"mode": "calibration", "rows": rows, "show": True, "hlo": hlo,
                                                       "peer_sources": peers or {}}, timeout=3600)
    texts = [f"== {e['id']}\n{e['text']}" for e in events if e.get("event") == "show"]
    if status != 0 or not texts:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        raise SystemExit(f"the TPU calibration worker failed (exit {status}): {' | '.join(tail)}")
    return "\n".join(texts)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e6:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def _band(r: dict) -> str:
    if r.get("band_bytes_per_s"):
        lo, hi = r["band_bytes_per_s"]
        return f"{lo / 1e12:.2f}..{hi / 1e12:.2f} TB/s"
    if not r.get("band_s"):
        return "-"
    lo, hi = r["band_s"]
    return f"{lo * 1e6:.1f}..{hi * 1e6:.1f}" + ("" if r.get("in_band") else " (outside)")


def _source(r: dict) -> str:
    url = r["source"].split(" ")[0]
    return url.replace("https://", "").replace("github.com/", "gh:")[:48]


def table(rows: list[dict]) -> str:
    head = ("row", "source", "timing", "use", "modeled us", "measured us", "error", "band us", "uncalibrated",
            "how / why not")
    out = [head]
    for r in rows:
        if "measured_s" in r:
            measured, modeled = _us(r.get("measured_s")), _us(r["modeled_s"])
        else:
            measured = f"{r['measured_bytes_per_s'] / 1e12:.2f} TB/s"
            modeled = "-" if r.get("modeled_bytes_per_s") is None else f"{r['modeled_bytes_per_s'] / 1e12:.2f} TB/s"
        out.append((r["id"], _source(r), f"{r['includes']}/{r['harness']}", r["use"], modeled, measured,
                    _pct(r["error"]), _band(r), _pct(r["uncalibrated_error"]), r["how"][:110]))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out)


def hf_table(hf: list[dict]) -> str:
    """Hugging Face's ragged-dot-tpu as measured on a v6e beside ours modeled at the same shapes."""
    head = ("tokens (one EP8 rank, 16 local experts)", "HF ragged-dot-tpu measured ms", "ours modeled ms",
            "ours ideal ms", "ours/HF")
    out = [head]
    for r in hf:
        out.append((str(r["tokens"]), f"{r['measured_s'] * 1e3:.3f}", f"{r['ours_device_s'] * 1e3:.3f}",
                    f"{r['ideal_s'] * 1e3:.3f}", f"{r['ours_device_s'] / r['measured_s']:.2f}"))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    note = ("HF: measured on a v6e, op by op (host-timed, a whole experts layer incl. routing); ours: the calibrated "
            "model's device time of gate_up + down, measured vs modeled, not like for like")
    return "\n".join(["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out]
                     + [note])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--rows", default="", help="only these row ids (comma-separated)")
    parser.add_argument("--out", type=Path, help="also write the modeled rows as JSON here")
    parser.add_argument("--held-out", type=Path, help="also write the held-out error per kind as JSON here (and "
                        "its table beside it, .txt)")
    parser.add_argument("--show", default="", help="print what the model reads and charges for these row ids")
    parser.add_argument("--hlo", action="store_true", help="with --show: also the lowered StableHLO")
    parser.add_argument("--peer-source", type=Path, action="append", default=[], metavar="DIR",
                        help="a checkout or git mirror of a peer whose kernel no installable wheel has "
                        "(vllm-project/tpu-inference: megablox gmm_v2; openxla/tokamax: its v2 grouped matmul); read "
                        "at run time, never copied here; its repository and commit go into the modeled rows "
                        "(repeatable)")
    parser.add_argument("--tables", type=Path, nargs="?", const=ROOT / "bench" / "records" / "tpu_held_out.json",
                        help="print the tables of a held-out record written by --held-out (default "
                        "bench/records/tpu_held_out.json), as text and as Markdown for the docs; run nothing")
    args = parser.parse_args(argv)
    if args.tables:
        record = json.loads(args.tables.read_text())
        print("\n\n".join([held_out_table(record["kinds"]), chip_table(record["by_kind_and_chip"]),
                            markdown_kinds(record["kinds"]), markdown_chips(record["by_kind_and_chip"])]))
        return 0
    rows = calibration.load()["rows"]
    wanted = [t.strip() for t in (args.show or args.rows).split(",") if t.strip()]
    unknown = sorted(set(wanted) - {r["id"] for r in rows})
    if unknown:
        raise SystemExit(f"unknown row ids {', '.join(unknown)}; see {calibration.TABLE}")
    peers = read_peer_sources(args.peer_source)
    if args.show:
        print(show([r for r in rows if r["id"] in wanted], args.hlo, peers))
        return 0
    hf: list[dict] = []
    rows = model_rows([r for r in rows if not wanted or r["id"] in wanted], hf, peers)
    print(json.dumps({"rows": rows, "hf_ragged_dot_tpu": hf}, indent=1) if args.json
          else table(rows) + ("\n\n" + hf_table(hf) if hf else ""))
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "tpu_calibration", "rows": rows, "hf_ragged_dot_tpu": hf},
                                       indent=1))
    print("\n" + chip_table(calibration.by_kind_and_chip(rows)))
    if args.held_out:
        errors = calibration.held_out(rows)
        per_chip = calibration.by_kind_and_chip(rows)
        args.held_out.write_text(json.dumps({"benchmark": "tpu_held_out", "target": calibration.TARGET,
                                             "kinds": errors, "by_kind_and_chip": per_chip}, indent=1) + "\n")
        args.held_out.with_suffix(".txt").write_text(held_out_table(errors) + "\n\n" + chip_table(per_chip) + "\n")
        print("\n" + held_out_table(errors))
    return 0


def chip_table(groups: list[dict]) -> str:
    """Rows, fitted rows, and the median and worst |error| per kind and chip: with the XLA ops around the kernels
    as libtpu compiled them (after) and as the jaxpr walk charges each traced op (before)."""
    head = ("kind", "chip", "rows", "fitted", "modeled", "median |err| after", "worst |err| after",
            "median |err| before", "worst |err| before", "past 20% after")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"
    out = [head]
    for g in groups:
        out.append((g["kind"], g["chip"], str(g["rows"]), str(g["fitted"]), str(g["modeled"]), pct(g["median_after"]),
                    pct(g["worst_after"]), pct(g["median_before"]), pct(g["worst_before"]),
                    _past(g["outside_target"])))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out)


def _past(ids: list[str]) -> str:
    """The rows past the target: their ids while a few, else how many (the record lists every one)."""
    if len(ids) > 2:
        return f"{len(ids)} rows"
    return ", ".join(ids) or "-"


def _md_pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def markdown_kinds(errors: dict) -> str:
    """The held-out error per kind as a Markdown table (rows no constant was fitted on)."""
    out = ["| kind | check rows modeled | median error | max error | past 20% |", "|---|---|---|---|---|"]
    for kind, e in errors.items():
        modeled = f"{e['modeled']}" if e["modeled"] == e["check_rows"] else f"{e['modeled']} of {e['check_rows']}"
        out.append(f"| {kind} | {modeled} | {_md_pct(e['median_abs_error'])} | {_md_pct(e['max_abs_error'])} | "
                   f"{_past(e['outside_target'])} |")
    return "\n".join(out)


def markdown_chips(groups: list[dict]) -> str:
    """Every row per kind and chip (fitted ones included) as a Markdown table: the error with XLA's ops as libtpu
    compiled them."""
    out = ["| kind | chip | rows (fitted) | modeled | median / worst error |", "|---|---|---|---|---|"]
    for g in groups:
        err = ("-" if g["median_after"] is None
               else f"{_md_pct(g['median_after'])} / {_md_pct(g['worst_after'])}")
        out.append(f"| {g['kind']} | {g['chip']} | {g['rows']} ({g['fitted']}) | {g['modeled']} | {err} |")
    return "\n".join(out)


def held_out_table(errors: dict) -> str:
    """The held-out error per kind, one line each."""
    head = ("kind", "check rows", "modeled", "median |error|", "max |error|", "past 20%", "not modeled", "fitted on")
    out = [head]
    for kind, e in errors.items():
        out.append((kind, str(e["check_rows"]), str(e["modeled"]),
                    "-" if e["median_abs_error"] is None else f"{e['median_abs_error'] * 100:.1f}%",
                    "-" if e["max_abs_error"] is None else f"{e['max_abs_error'] * 100:.1f}%",
                    _past(e["outside_target"]), str(len(e["not_modeled"])), ", ".join(e["fit_rows"]) or "-"))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in out)


if __name__ == "__main__":
    sys.exit(main())
