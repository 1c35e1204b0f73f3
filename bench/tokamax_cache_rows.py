"""Calibration rows from a tokamax autotuning cache: every inference (no residuals, no bias, no soft cap) bf16 flash
attention entry the table does not hold yet, as a check row in the form of the table's other rows from that cache.

tokamax's autotuner times each cached config on the device (five calls, each profiled alone by xprof); the cache
file keeps the op's arguments as its key and the config with its evaluation times as the value. A row's measured_s
is the median of the five, its quote the key, the config and the times as the file holds them.

    python bench/tokamax_cache_rows.py --tokamax <checkout> --chip v5p            # the rows it would add (JSON lines)
    python bench/tokamax_cache_rows.py --tokamax <checkout> --chip v5p --add      # appended to the table

Then model them with bench/tpu_calibration.py (see docs/tpu-cost-model.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "bench" / "records" / "tpu_calibration.json"
KERNEL = "tokamax_flash_attention"
_SOURCE = re.compile(r"/blob/(?P<commit>[0-9a-f]{40})/(?P<path>tokamax/data/autotuning/[\w/.-]+\.json)$")


def _shape(text: str) -> list[int]:
    """'bf16[32,512,16,128]' -> [32, 512, 16, 128]."""
    return [int(x) for x in text[text.index("[") + 1:-1].split(",")]


def inference_entries(cache: dict) -> list[tuple[str, dict, str, dict]]:
    """(key text, key, config text, result) of each bf16 inference entry with its evaluation times, in file order."""
    out = []
    for key_text, configs in cache.items():
        key = json.loads(key_text)
        if not key["q"].startswith("bf16[") or key.get("bias") is not None or key.get("return_residuals"):
            continue
        if key.get("logits_soft_cap") is not None or key.get("dropout_rate"):
            continue
        for cfg_text, result in configs.items():
            if len(result.get("evaluation_times_ms") or []) == 5:
                out.append((key_text, key, cfg_text, result))
    return out


def row_id(chip: str, key: dict) -> str:
    b, t, h, d = _shape(key["q"])
    kv = _shape(key["k"])[2]
    heads = f"h{h}" + (f"-kv{kv}" if kv != h else "")
    return f"{chip}-tokamax-splash-b{b}-t{t}-{heads}-d{d}-{'causal' if key['mask']['is_causal'] else 'full'}"


def build_row(template: dict, key_text: str, key: dict, cfg_text: str, result: dict) -> dict:
    """A row shaped as `template` (a held row of the same cache) for one cache entry."""
    times = result["evaluation_times_ms"]
    causal = key["mask"]["is_causal"]
    row = copy.deepcopy(template)
    row["id"] = row_id(template["chip"], key)
    row["code"] = re.sub(r"make_splash_mha with a \w+Mask",
                         f"make_splash_mha with a {'CausalMask' if causal else 'FullMask'}", template["code"])
    row["shapes"] = {"q": _shape(key["q"]), "k": _shape(key["k"]), "v": _shape(key["v"]), "causal": causal,
                     "logits_scale": key["logits_scale"], "return_residuals": False, "config": json.loads(cfg_text)}
    row["measured_s"] = round(sorted(times)[2] * 1e-3, 12)
    row["use"] = "check"
    row["quote"] = f"{key_text} -> {cfg_text}: {{... \"evaluation_times_ms\": {json.dumps(times)}, ...}}"
    return row


def new_rows(table: dict, tokamax: Path, chip: str) -> list[dict]:
    """The rows of `chip`'s flash attention cache (at the commit its held rows cite) that the table lacks."""
    held = [r for r in table["rows"] if r["chip"] == chip and r["kernel"] == KERNEL]
    if not held:
        raise SystemExit(f"the table holds no {KERNEL} row for {chip}: nothing says which cache file and commit")
    match = _SOURCE.search(held[0]["source"])
    if match is None:
        raise SystemExit(f"row {held[0]['id']}: its source names no tokamax cache file at a commit")
    text = subprocess.run(["git", "-C", str(tokamax), "show", f"{match['commit']}:{match['path']}"],
                          capture_output=True, text=True, check=True).stdout
    have = {r["quote"].split(" -> ")[0] for r in held}
    ids = {r["id"] for r in table["rows"]}
    rows = []
    for key_text, key, cfg_text, result in inference_entries(json.loads(text)):
        if key_text in have:
            continue
        row = build_row(held[0], key_text, key, cfg_text, result)
        if row["id"] in ids:
            raise SystemExit(f"{row['id']}: already a row of the table with another key")
        ids.add(row["id"])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokamax", type=Path, required=True, help="a git checkout of openxla/tokamax (with history)")
    p.add_argument("--chip", required=True, help="the chip whose cache the table's rows cite (v5p, v6e)")
    p.add_argument("--add", action="store_true", help="append the rows to bench/records/tpu_calibration.json")
    args = p.parse_args(argv)
    table = json.loads(TABLE.read_text())
    rows = new_rows(table, args.tokamax, args.chip)
    if args.add:
        table["rows"].extend(rows)
        TABLE.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
        print(f"added {len(rows)} rows to {TABLE.relative_to(ROOT)}", file=sys.stderr)
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
