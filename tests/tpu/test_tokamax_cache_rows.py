"""bench/tokamax_cache_rows.py: rows built from a tokamax autotuning cache file at the commit the table's rows cite,
only the inference entries the table lacks, each in the form the table's tokamax rows keep."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tests.bench_scripts import load


def _bench():
    return load("tokamax_cache_rows")


def _key(b, t, h, d, causal, *, kv=None, residuals=False, dtype="bf16", cap=None):
    shape = f"{dtype}[{b},{t},{h},{d}]"
    kshape = f"{dtype}[{b},{t},{kv or h},{d}]"
    return json.dumps({"q": shape, "k": kshape, "v": kshape, "logits_scale": d ** -0.5, "bias": None,
                       "logits_soft_cap": cap, "mask": {"is_causal": causal}, "dropout_rate": 0.0,
                       "return_residuals": residuals}, separators=(",", ":"))


def _config(bq):
    return json.dumps({"block_q": bq, "block_kv": bq, "block_kv_compute": bq // 2, "q_layout": 1, "k_layout": 2,
                       "v_layout": 1, "use_experimental_scheduler": False, "use_base2_exp": True},
                      separators=(",", ":"))


@pytest.fixture
def cache_repo(tmp_path):
    """A git repository holding one cache file (two commits: the rows cite the first), and a table citing it."""
    rng = np.random.default_rng()
    times = {name: [round(float(x), 3) for x in rng.uniform(0.2, 3.0, 5)] for name in "abcdef"}
    cache = {
        _key(32, 512, 16, 128, True): {_config(512): {"evaluation_times_ms": times["a"]}},  # held
        _key(32, 512, 16, 128, False): {_config(512): {"evaluation_times_ms": times["b"]}},
        _key(4, 4096, 32, 128, True, kv=8): {_config(1024): {"evaluation_times_ms": times["c"]}},
        _key(4, 4096, 16, 128, True, residuals=True): {_config(1024): {"evaluation_times_ms": times["d"]}},
        _key(4, 4096, 16, 128, True, dtype="f16"): {_config(1024): {"evaluation_times_ms": times["e"]}},
        _key(4, 4096, 16, 128, False, cap=30.0): {_config(1024): {"evaluation_times_ms": times["f"]}},
        _key(8, 2048, 16, 128, False): {},  # no timing
    }
    repo = tmp_path / "tokamax"
    path = repo / "tokamax/data/autotuning/tpu_v5/pallas_mosaic_tpu_flash_attention.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cache))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "cache"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    path.write_text("{}")  # a later commit empties the file: the rows must come from the cited one
    subprocess.run([*git, "commit", "-qam", "later"], check=True)
    held_key, held_cfg = _key(32, 512, 16, 128, True), _config(512)
    held = {"id": "v5p-tokamax-splash-b32-t512-h16-d128-causal", "chip": "v5p", "kernel": "tokamax_flash_attention",
            "source": f"https://github.com/openxla/tokamax/blob/{commit}/{path.relative_to(repo)}",
            "code": "the splash kernel (make_splash_mha with a CausalMask, q_seq_shards=1)", "use": "check",
            "quote": f"{held_key} -> {held_cfg}: {{...}}", "measured_s": 1e-3, "harness": "tokamax-xprof"}
    return repo, {"rows": [held]}, times


def test_rows_are_the_uncited_inference_entries_at_the_cited_commit(cache_repo):
    repo, table, times = cache_repo
    rows = _bench().new_rows(table, repo, "v5p")
    assert [r["id"] for r in rows] == ["v5p-tokamax-splash-b32-t512-h16-d128-full",
                                       "v5p-tokamax-splash-b4-t4096-h32-kv8-d128-causal"]
    full, gqa = rows
    assert full["measured_s"] == pytest.approx(sorted(times["b"])[2] * 1e-3, rel=1e-9)
    assert gqa["measured_s"] == pytest.approx(sorted(times["c"])[2] * 1e-3, rel=1e-9)
    assert "FullMask" in full["code"] and "CausalMask" in gqa["code"]
    assert full["shapes"]["causal"] is False and gqa["shapes"]["k"] == [4, 4096, 8, 128]
    assert gqa["shapes"]["config"]["block_q"] == 1024 and all(r["use"] == "check" for r in rows)
    quoted = json.loads(full["quote"].split('"evaluation_times_ms": ')[1].split("]")[0] + "]")
    assert quoted == times["b"] and _config(512) in full["quote"]
    assert all(r["source"] == table["rows"][0]["source"] for r in rows)


def test_a_table_without_a_cited_cache_or_with_a_clashing_id_is_refused(cache_repo):
    repo, table, _ = cache_repo
    bench = _bench()
    with pytest.raises(SystemExit, match="no tokamax_flash_attention row for v6e"):
        bench.new_rows(table, repo, "v6e")
    clash = {**table["rows"][0], "id": "v5p-tokamax-splash-b32-t512-h16-d128-full", "kernel": "other"}
    with pytest.raises(SystemExit, match="already a row"):
        bench.new_rows({"rows": [*table["rows"], clash]}, repo, "v5p")
