"""bench/tpu_peers_tokamax.py: its rows set into the peers record (only the Tokamax rows and their workloads' best
peer change) and written row by row into a record that runs split by model share."""

from __future__ import annotations

import copy
import json

import numpy as np

from tests.bench_scripts import load

TOKAMAX = "tokamax mosaic ragged_dot"


def _bench():
    return load("tpu_peers_tokamax")


def _row(peer, shape, gen, modeled, band=None, kernel="ragged_dot"):
    return {"kernel": kernel, "peer": peer, "shape": shape, "generation": gen, "xla": False, "modeled_s": modeled,
            "band_s": band, "ideal_s": 1e-3, "ratio_to_ideal": None if modeled is None else modeled / 1e-3,
            "compiled": "yes", "how": "refused" if modeled is None else "1 call(s)", "detail": ""}


def test_set_into_changes_only_the_tokamax_rows_and_their_best_peer(tmp_path):
    rng = np.random.default_rng()
    ours_s, gmm_s = rng.uniform(1e-3, 2e-3), rng.uniform(1.5e-3, 3e-3)
    fast = rng.uniform(0.5e-3, 0.9e-3)  # faster than both: becomes the best peer
    rows = []
    for shape in ("a decode", "b prefill"):
        rows += [_row("kernel-hub", shape, "v5e", ours_s, [ours_s * 0.9, ours_s * 1.1]),
                 _row("megablox gmm (best of sweep)", shape, "v5e", gmm_s, [gmm_s * 0.9, gmm_s * 1.1]),
                 _row(TOKAMAX, shape, "v5e", None)]
    rows.append(_row("kernel-hub", "attn", "v5e", 1e-3, kernel="flash_attention prefill"))
    path = tmp_path / "peers.json"
    path.write_text(json.dumps({"benchmark": "tpu_peers", "environment": {"commit": "x"}, "rows": rows}))
    before = copy.deepcopy(rows)
    tokamax = [{"kernel": "ragged_dot", "peer": TOKAMAX, "shape": "a decode", "generation": "v5e", "modeled_s": fast,
                "band_s": [fast * 0.95, fast * 1.05], "how": "1 call(s), 1 steps"},
               {"kernel": "ragged_dot", "peer": TOKAMAX, "shape": "a decode", "generation": "v6e", "modeled_s": 1.0,
                "band_s": [1.0, 1.0], "how": "no such workload in the record"}]
    out, done = _bench().set_into(path, tokamax)
    assert done == 1
    got = {(r["shape"], r["peer"]): r for r in out}
    tk = got[("a decode", TOKAMAX)]
    assert tk["modeled_s"] == fast and tk["band_s"] == [fast * 0.95, fast * 1.05]
    assert np.isclose(tk["ratio_to_ideal"], fast / 1e-3)
    for peer in ("kernel-hub", "megablox gmm (best of sweep)", TOKAMAX):
        r = got[("a decode", peer)]
        assert r["best_peer"] == TOKAMAX and np.isclose(r["ours_over_best_peer"], ours_s / fast)
        assert r["ours_le_best_across_band"] is False  # ours is slower at every end
    assert out[3:] == before[3:]  # the other workload and the other kernel's rows, untouched
    assert [r["modeled_s"] for r in out[:3]] == [ours_s, gmm_s, fast]


def test_rows_written_one_by_one_keep_the_rows_another_run_wrote(tmp_path):
    bench = _bench()
    path = tmp_path / "tokamax.json"
    a = {"shape": "s1", "generation": "v5e", "modeled_s": 1.0}
    b = {"shape": "s2", "generation": "v5e", "modeled_s": 2.0}
    bench._write_row(path, a)
    bench._write_row(path, b)  # as another process sharing the record would
    bench._write_row(path, {**a, "modeled_s": 3.0})
    rows = json.loads(path.read_text())["rows"]
    assert [(r["shape"], r["modeled_s"]) for r in rows] == [("s1", 3.0), ("s2", 2.0)]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
