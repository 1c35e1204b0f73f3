"""The paged tuning sweep's record and the shipped table agree (every compiled row is the entry for its key, nothing
ships that the record lacks), and merging one generation's sweep into the record keeps the others'."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_scripts import PAGED_TUNED_TABLE, load, load_file

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench/records/paged_tune.json"


bench = load("paged_tune")
table = load_file("paged_tuned_table_data", PAGED_TUNED_TABLE)


def _row(gen: str, length: int, block_q: int = 32, ppb: int = 16) -> dict:
    return {"key": [gen, 128, "bfloat16", "bfloat16", 32, 4, 128, length], "block_q": block_q,
            "pages_per_block": ppb, "compiled": {"decode": "yes", "mixed": "yes"}}


def test_every_compiled_row_of_the_record_is_the_shipped_entry_and_nothing_else_ships() -> None:
    record = json.loads(RECORD.read_text())
    compiled = {tuple(r["key"]): (r["block_q"], r["pages_per_block"]) for r in record["rows"]
                if "skipped" not in r and all(v == "yes" for v in r["compiled"].values())}
    shipped = {key: (e.block_q, e.pages_per_block) for key, e in table.TUNED.items()}
    assert shipped == compiled
    assert {key[0] for key in shipped} == {"v5e", "v6e", "v7x"}
    assert set(record["commands"]) == {"v5e", "v6e", "v7x"}


def test_every_entrys_origin_quotes_its_rows_modeled_times() -> None:
    rows = {tuple(r["key"]): r for r in json.loads(RECORD.read_text())["rows"]}
    for key, entry in table.TUNED.items():
        tuned = rows[key]["tuned"]
        assert f"decode {tuned['decode_us'][0]} us (band {tuned['decode_us'][1]}-" in entry.origin, key
        assert f"mixed {tuned['mixed_us'][0]} us (band {tuned['mixed_us'][1]}-" in entry.origin, key


def test_merging_a_generations_sweep_replaces_only_its_rows() -> None:
    v5e, v6e = "python bench/paged_tune.py --generations v5e", "python bench/paged_tune.py --generations v6e"
    record = {"command": v5e, "rows": [_row("v5e", 8192), _row("v6e", 8192)]}
    out = bench.merged(record, [_row("v6e", 8192, 16, 8), _row("v6e", 2048)], v6e)
    assert [(r["key"][0], r["key"][-1], r["block_q"]) for r in out["rows"]] == [
        ("v5e", 8192, 32), ("v6e", 8192, 16), ("v6e", 2048, 32)]
    assert out["commands"] == {"v5e": v5e, "v6e": v6e}
    again = bench.merged(out, [_row("v7x", 8192)], "python bench/paged_tune.py --generations v7x")
    assert set(again["commands"]) == {"v5e", "v6e", "v7x"} and len(again["rows"]) == 4
