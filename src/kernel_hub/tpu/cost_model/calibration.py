"""The calibration table (bench/records/tpu_calibration.json): published measured TPU kernel times with full shapes.

Pure functions over the table's data: `check_table` names every schema problem at once; `compare` turns a modeled
time into the row's error. The modeling itself (our walker on each row's kernel, installed) runs in the TPU
environment (calibration_worker.py); bench/tpu_calibration.py drives it and prints the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..chips import CHIPS, HOST_DISPATCH_S

TABLE = Path(__file__).resolve().parents[4] / "bench" / "records" / "tpu_calibration.json"
#: The target of issue 36: every row's modeled time within this of its measured time.
TARGET = 0.20
KINDS = ("pallas_matmul", "xla_matmul", "streamed_copy", "gmm_v2", "rpa_v3", "hf_ragged_dot_tpu")
_FIELDS = {"id": str, "source": str, "chip": str, "kernel": str, "shapes": dict, "dtypes": dict, "includes": str,
           "timing": str, "use": str}


def load(path: Path | None = None) -> dict[str, Any]:
    data = json.loads(Path(path or TABLE).read_text())
    problems = check_table(data)
    if problems:
        raise ValueError(f"{path or TABLE}: " + "; ".join(problems))
    return data


def check_table(data: Any) -> list[str]:
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
        if not str(row.get("source", "")).startswith("https://"):
            problems.append(f"{where}: source must be an https URL")
        measured = [k for k in ("measured_s", "measured_bytes_per_s") if k in row]
        if len(measured) != 1 or not isinstance(row[measured[0]], (int, float)) or not row[measured[0]] > 0:
            problems.append(f"{where}: exactly one positive measured_s or measured_bytes_per_s")
        if "measured_s" in row and not row.get("shapes"):
            problems.append(f"{where}: a measured time needs its full shapes")
    return problems


def compare(row: dict[str, Any], device_s: float | None) -> dict[str, Any]:
    """The row's modeled time (the model's device time, plus host dispatch where the measurement includes it)
    against its measured time: modeled_s, error (modeled / measured - 1), within (|error| <= TARGET)."""
    if device_s is None or "measured_s" not in row:
        return {"modeled_s": None, "error": None, "within": None}
    modeled = device_s + (HOST_DISPATCH_S if row["includes"] == "host" else 0.0)
    error = modeled / row["measured_s"] - 1.0
    return {"modeled_s": modeled, "error": error, "within": abs(error) <= TARGET}
