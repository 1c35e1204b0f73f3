"""The calibration table (bench/records/tpu_calibration.json): published measured TPU kernel times with full shapes.

Pure functions over the table's data: `check_table` names every schema problem at once (a kind fitted on more than
a third of its rows is one); `compare` turns a modeled time into the row's error, adding the dispatch of the row's
own harness (HARNESSES) where the time is host-timed; `held_out` computes the error per kind on the rows no
constant was fitted on. The modeling itself (our walker on each row's kernel, installed) runs in the TPU
environment (calibration_worker.py); bench/tpu_calibration.py drives it and writes the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_hub.tpu.chips import CHIPS

if TYPE_CHECKING:
    from kernel_hub.json_types import JsonDict, JsonValue

TABLE = Path(__file__).resolve().parents[2] / "bench" / "records" / "tpu_calibration.json"
HELD_OUT = TABLE.with_name("tpu_held_out.json")
MODELED = TABLE.with_name("tpu_calibration_modeled.json")  # bench/tpu_calibration.py --out: every row as modeled
#: Per grid step of a Pallas TPU pipeline on v5e, on top of the step's MXU work (its DMAs run under it): fitted on row
#: "v5e-matmul-128-8192" of bench/records/tpu_calibration.json, (91.836 ms measured - HOST_DISPATCH_S - 5.581 ms of
#: MXU work at peak - the kernel's fixed cost; its vector work runs beside the MXU) / 262144 steps = 0.3286 us; the
#: Pallas TPU docs quote ~0.35 us. Other generations carry a band (rates.py), not this figure.
STEP_OVERHEAD_S = 0.3286e-6

#: The fraction of spec HBM bandwidth the published streamed copy reaches on v7x: 3.21 of 3.685 TB/s on one TPU7x
#: core (row "tpu7x-streamed-copy", a check of the model's fraction, which rates.py fits on a decode
#: row). No other generation's copy is published: they carry a band.
STREAM_FRACTION = 3.21e12 / 3.685e12

#: Host dispatch of one harness only, the jax docs' Pallas matmul tutorial on its v5e (timeit of jit call +
#: block_until_ready): fitted on row "v5e-matmul-512x1024x1024-1024" (127.09 us measured - 19.58 us of modeled
#: device time). Each calibration row names its harness; other harnesses carry their own figure or a band
#: (HARNESSES below), never this one.
HOST_DISPATCH_S = 107.51e-6

#: Every row's modeled time should be within this of its measured time.
TARGET = 0.20
KINDS = ("pallas_matmul", "xla_matmul", "streamed_copy", "gmm_v2", "rpa_v3", "hf_ragged_dot_tpu", "collective_permute",
         "splash_attention", "tokamax_flash_attention", "tokamax_ragged_dot")
#: The kinds the held-out error is reported by (a kind of schedule -> what it is).
GROUPS = {"pallas_matmul": "Pallas matmul", "gmm_v2": "grouped matmul", "hf_ragged_dot_tpu": "grouped matmul",
          "tokamax_ragged_dot": "grouped matmul", "rpa_v3": "attention", "splash_attention": "attention",
          "tokamax_flash_attention": "attention", "xla_matmul": "XLA op", "streamed_copy": "copy",
          "collective_permute": "collective"}
_FIELDS = {"id": str, "source": str, "quote": str, "chip": str, "kernel": str, "shapes": dict, "dtypes": dict,
           "includes": str, "harness": str, "timing": str, "use": str}


@dataclass(frozen=True)
class Harness:
    """What a timing harness adds to a kernel's device time: its host dispatch, a point and a band."""

    dispatch_s: float
    low_s: float
    high_s: float
    source: str


#: Each harness's dispatch: measured where a row pins it, a band where nothing does, nothing for device time.
HARNESSES = {
    "device": Harness(0.0, 0.0, 0.0, "device time: no dispatch"),
    "tokamax-xprof": Harness(0.0, 0.0, 0.0, "tokamax autotuner, hermetic xprof device time of the whole jitted op: "
                             "no dispatch"),
    "jax-docs-timeit": Harness(HOST_DISPATCH_S, HOST_DISPATCH_S, HOST_DISPATCH_S,
                               "fitted on row v5e-matmul-512x1024x1024-1024 (the tutorial's Colab v5e)"),
    "host-unknown": Harness(62.5e-6, 0.0, 125e-6, "not published: from none up to the ~125 us a TPU call's fixed "
                            "dispatch costs in pytorch/helion PR 2632"),
    "torch-tpu-op-by-op": Harness(62.5e-6, 0.0, 125e-6, "not published: torch_tpu op-by-op dispatch, from none up "
                                  "to ~125 us a call"),
}


def load(path: Path | None = None) -> JsonDict:
    data = json.loads(Path(path or TABLE).read_text())
    problems = check_table(data)
    if problems:
        raise ValueError(f"{path or TABLE}: " + "; ".join(problems))
    return data


def check_table(data: JsonValue) -> list[str]:
    """Every schema problem of the table, one line each (empty: valid)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return ["the table must be an object with a list 'rows'"]
    problems, seen = [], set()
    for i, row in enumerate(data["rows"]):
        where = f"row {i} ({row.get('id', '?') if isinstance(row, dict) else '?'})"
        if not isinstance(row, dict):
            problems.append(f"{where}: not an object")
            continue
        for key, kind in _FIELDS.items():
            if not isinstance(row.get(key), kind):
                problems.append(f"{where}: '{key}' must be a {kind.__name__}")
        if row.get("id") in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(row.get("id"))
        if row.get("chip") not in CHIPS:
            problems.append(f"{where}: chip must be one of {', '.join(CHIPS)}")
        if row.get("kernel") not in KINDS:
            problems.append(f"{where}: kernel must be one of {', '.join(KINDS)}")
        if row.get("includes") not in ("device", "host"):
            problems.append(f"{where}: includes must be 'device' or 'host'")
        if row.get("use") not in ("fit", "check"):
            problems.append(f"{where}: use must be 'fit' or 'check'")
        if row.get("harness") not in HARNESSES:
            problems.append(f"{where}: harness must be one of {', '.join(HARNESSES)}")
        elif (HARNESSES[row["harness"]].high_s == 0.0) != (row.get("includes") == "device"):
            problems.append(f"{where}: a device time has a device harness (no dispatch), a host time a host harness")
        if not str(row.get("source", "")).startswith("https://"):
            problems.append(f"{where}: source must be an https URL")
        measured = [k for k in ("measured_s", "measured_bytes_per_s") if k in row]
        if len(measured) != 1 or not isinstance(row[measured[0]], (int, float)) or not row[measured[0]] > 0:
            problems.append(f"{where}: exactly one positive measured_s or measured_bytes_per_s")
        if "measured_s" in row and not row.get("shapes"):
            problems.append(f"{where}: a measured time needs its full shapes")
    rows = [r for r in data["rows"] if isinstance(r, dict)]
    for group in sorted(set(GROUPS.values())):
        members = [r for r in rows if GROUPS.get(r.get("kernel")) == group]
        fitted = [r["id"] for r in members if r.get("use") == "fit"]
        if len(fitted) * 3 > len(members):
            problems.append(f"{group}: {len(fitted)} of {len(members)} rows fitted ({', '.join(map(str, fitted))}); "
                            "at most a third may be")
    return problems


def compare(row: JsonDict, device_s: float | None,
            band_s: tuple[float, float] | list[float] | None = None) -> JsonDict:
    """The row's modeled time (the model's device time, plus its harness's dispatch where the measurement is
    host-timed) against its measured time: modeled_s, error (modeled / measured - 1), within (|error| <= TARGET),
    and with the device time's band (fast, slow): band_s (the harness's dispatch band added) and in_band (the
    measurement inside it)."""
    if device_s is None or "measured_s" not in row:
        return {"modeled_s": None, "error": None, "within": None, "band_s": None, "in_band": None}
    harness = HARNESSES[row["harness"]]
    modeled = device_s + harness.dispatch_s
    error = modeled / row["measured_s"] - 1.0
    out = {"modeled_s": modeled, "error": error, "within": abs(error) <= TARGET, "band_s": None, "in_band": None}
    if band_s is not None:
        lo, hi = band_s[0] + harness.low_s, band_s[1] + harness.high_s
        out.update(band_s=[lo, hi], in_band=lo <= row["measured_s"] <= hi)
    return out


def compare_bandwidth(row: JsonDict, modeled_bps: float | None) -> JsonDict:
    """A bandwidth row: the model's bandwidth against the measured one (error: modeled / measured - 1)."""
    if modeled_bps is None or "measured_bytes_per_s" not in row:
        return {"modeled_bytes_per_s": None, "error": None, "within": None}
    error = modeled_bps / row["measured_bytes_per_s"] - 1.0
    return {"modeled_bytes_per_s": modeled_bps, "error": error, "within": abs(error) <= TARGET}


def held_out(results: list[JsonDict]) -> JsonDict:
    """The error per kind (GROUPS) on the held-out ("check") rows the model times: rows, modeled, median and largest
    |error|, the rows past TARGET, and the rows not modeled (their ids: the reason is in the table)."""
    out: JsonDict = {}
    for group in dict.fromkeys(GROUPS.values()):
        checks = [r for r in results if GROUPS.get(r["kernel"]) == group and r["use"] == "check"]
        errors = sorted(abs(r["error"]) for r in checks if r.get("error") is not None)
        out[group] = {
            "check_rows": len(checks), "modeled": len(errors),
            "median_abs_error": errors[len(errors) // 2] if errors else None,
            "max_abs_error": errors[-1] if errors else None,
            "outside_target": [r["id"] for r in checks if r.get("within") is False],
            "not_modeled": [r["id"] for r in checks if r.get("error") is None],
            "fit_rows": [r["id"] for r in results if GROUPS.get(r["kernel"]) == group and r["use"] == "fit"],
        }
    return out


def by_kind_and_chip(results: list[JsonDict]) -> list[JsonDict]:
    """Per kind (GROUPS) and chip: rows, fitted rows, rows modeled, the median and worst |error| with the XLA ops
    as compiled (after: `error`) and as the jaxpr walk charges them (before: `jaxpr_rule_error`, the row's own error
    where the rule made no difference), and the rows past TARGET after."""
    def stats(values: list[float]) -> tuple[float | None, float | None]:
        v = sorted(abs(x) for x in values)
        return (v[len(v) // 2], v[-1]) if v else (None, None)

    out = []
    keys = dict.fromkeys((GROUPS.get(r["kernel"], r["kernel"]), r["chip"]) for r in results)
    for kind, chip_name in keys:
        rows = [r for r in results if GROUPS.get(r["kernel"], r["kernel"]) == kind and r["chip"] == chip_name]
        after = [r["error"] for r in rows if r.get("error") is not None]
        before = [r["jaxpr_rule_error"] if r.get("jaxpr_rule_error") is not None else r["error"]
                  for r in rows if r.get("error") is not None]
        (ma, wa), (mb, wb) = stats(after), stats(before)
        out.append({"kind": kind, "chip": chip_name, "rows": len(rows), "fitted": sum(r["use"] == "fit" for r in rows),
                    "modeled": len(after), "median_after": ma, "worst_after": wa, "median_before": mb,
                    "worst_before": wb, "outside_target": [r["id"] for r in rows if r.get("within") is False]})
    return out
