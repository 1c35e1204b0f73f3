"""The seed decode bench's rows: the HBM floor against bytes worked out by hand, the --json row schema (the worker
replaced by a stand-in, so this runs without the TPU environment), and the op-by-op path's dispatch arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_scripts import load
from tpu_cost_model import decode_models as dm

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load("seed_decode")


def test_qwen3_weights_per_chip_by_hand():
    # per layer on one of 8 chips: q 2048x(4x128), k and v one replicated head each, o (4x128)x2048, two norms of
    # 2048 and two head norms of 128, the router 2048x128; 48 layers + the final norm; bf16
    dense = (48 * (2048 * 512 + 2 * 2048 * 128 + 512 * 2048 + 2 * 2048 + 2 * 128 + 2048 * 128) + 2048) * 2
    experts = 48 * 16 * 3 * 2048 * 768 * 2  # 16 whole experts a chip
    embed = 2 * (151936 // 8) * 2048 * 2  # embedding and untied LM head, vocab-split
    assert dm.weight_bytes_per_device(dm.QWEN3_30B_A3B, 8) == dense + experts + embed
    assert 7.5e9 < dense + experts + embed < 7.8e9  # the issue's ~7.6 GB


def test_floor_by_hand_at_batch_64_and_1():
    m = dm.QWEN3_30B_A3B
    dense = dm.dense_weight_bytes_per_device(m, 8)
    experts = 48 * 16 * 3 * 2048 * 768 * 2
    lm_head = (151936 // 8) * 2048 * 2
    kv = 48 * 2 * 64 * 768 * 128 * 2  # K and V, one head a chip, 768 positions, 64 sequences
    hit64 = 1 - (120 / 128) ** 64  # an expert no token of 64 picks: each misses it with 120/128
    assert dm.floor_bytes_per_device(m, 64, 768, 8) == int(dense + experts * hit64 + lm_head + kv)
    assert dm.floor_bytes_per_device(m, 1, 768, 8) == int(dense + experts * 8 / 128 + lm_head + kv // 64)
    assert dm.floor_seconds(1640e9, 1640e9) == 1.0


def test_gemma_sliding_layers_read_only_their_window():
    m = dm.GEMMA4_26B_A4B
    short, long_ = dm.kv_bytes_read_per_device(m, 1, 1024, 8), dm.kv_bytes_read_per_device(m, 1, 8192, 8)
    # past the window only the 5 global layers (keys = values, one 512-wide head a chip) read more
    assert long_ - short == 5 * (8192 - 1024) * 512 * 2


def test_json_rows_carry_the_schema(monkeypatch, capsys):
    bench = _bench()
    fake = {"model": "qwen3_30b_a3b", "batch": 64, "cache": 768, "chip": "v6e", "mesh": "v6e:2x4",
            "hbm_floor_s": 0.005, "compiled": True, "hbm_per_chip_bytes": 10 * 2**30}

    def decode_rows(models, batches, caches, gens, paths, **kw):
        return [{**fake, "path": p, "modeled_s": 0.01 * (i + 1), "band_s": [0.005, 0.02], "compiled": p == "hub",
                 "argument_bytes": 2**30} for i, p in enumerate(paths)]

    import tpu_cost_model.decode as decode

    monkeypatch.setattr(decode, "decode_rows", decode_rows)
    bench.main(["--json", "--models", "qwen3_30b_a3b", "--batches", "64", "--generations", "v6e"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["path"] for r in rows} == {"hub", "jax_default", "default_compiled", "vllm_tpu", "default_op_by_op",
                                         "hub_op_by_op"}
    for r in rows:
        assert set(bench.FIELDS) <= set(r)
        assert isinstance(r["compiled"], bool) and len(r["band_s"]) == 2
    op = next(r for r in rows if r["path"] == "default_op_by_op")
    compiled = next(r for r in rows if r["path"] == "default_compiled")
    calls = bench.OP_COUNTS["qwen3_30b_a3b"][0]
    assert op["modeled_s"] == pytest.approx(compiled["modeled_s"] + calls * 62.5e-6)
    assert op["band_s"] == pytest.approx([compiled["band_s"][0], compiled["band_s"][1] + calls * 125e-6])
    assert op["compiled"] is False and op["hbm_per_chip_bytes"] is None and "argument_bytes" not in op


def test_step_gate_names_what_does_not_compile():
    from tpu_cost_model.decode_gate import GATE_GENERATIONS, GATE_MODELS, step_gate

    def run(env, request, **kw):
        assert request["groups"] == 1 and request["compile_only"] and request["paths"] == ["hub"]
        rows = [{"event": "row", "model": m, "mesh": f"{g}-8", "compiled": not (m.startswith("gemma") and g == "v7x"),
                 "error": "Mosaic failed to compile TPU kernel"} for g in request["generations"]
                for m in request["models"]]
        return rows, 0, ""

    folders = {k: ROOT / "kernels" / "pallas" / k for k in ("rms_norm", "flash_attention", "ragged_dot")}
    rows, failed = step_gate(folders, run=run, env=object())
    assert len(rows) == len(GATE_MODELS) * len(GATE_GENERATIONS)
    assert failed == ["gemma4_26b_a4b on v7x-8: Mosaic failed to compile TPU kernel"]
    _, short = step_gate(folders, run=lambda env, request, **kw: ([], 0, ""), env=object())
    assert short == [f"only 0 of {len(rows)} gate compiles reported"]


def test_merge_replaces_rows_of_the_same_key_and_keeps_the_rest():
    bench = _bench()
    row = lambda path, batch, ms, **kw: {"model": "qwen3_30b_a3b", "batch": batch, "cache": 768, "chip": "v6e",
                                         "path": path, "modeled_s": ms, **kw}
    old = [row("hub", 64, 1.0), row("jax_default", 64, 2.0), row("hub", 1, 3.0)]
    new = [row("hub", 1, 0.5, step="stacked"), row("hub", 64, 0.9, step="stacked"), row("vllm_tpu", 64, 0.8)]
    out = bench.merged(old, new)
    assert [(r["path"], r["batch"], r["modeled_s"]) for r in out] == [
        ("hub", 64, 0.9), ("jax_default", 64, 2.0), ("hub", 1, 0.5), ("vllm_tpu", 64, 0.8)]
    assert "step" not in out[1] and out[0]["step"] == "stacked"


def test_restating_the_collectives_shifts_a_row_by_their_change_alone():
    bench = _bench()
    row = {"model": "qwen3_30b_a3b", "batch": 64, "modeled_s": 10e-3, "band_s": [8e-3, 13e-3], "collectives_s": 1e-3,
           "modeled_jaxpr_s": 12e-3, "band_jaxpr_s": [9e-3, 15e-3], "kernels_s": 5e-3, "xla_s": 4e-3}
    new = {None: 1.5e-3, "fast": 1.2e-3, "slow": 1.7e-3}
    out = bench.restated(row, new.get)
    assert out["collectives_s"] == 1.5e-3 and out["modeled_s"] == pytest.approx(10.5e-3)
    assert out["band_s"] == pytest.approx([8.2e-3, 13.7e-3])  # each end moves by its own end's change
    assert out["modeled_jaxpr_s"] == pytest.approx(12.5e-3) and out["band_jaxpr_s"] == pytest.approx([9.2e-3, 15.7e-3])
    assert out["kernels_s"] == row["kernels_s"] and out["xla_s"] == row["xla_s"] and row["modeled_s"] == 10e-3
    assert out["collectives_band_s"] == [1.2e-3, 1.7e-3]
    assert bench.restated(out, new.get) == out  # restating again with the same model moves nothing
    later = bench.restated(out, {None: 1.5e-3, "fast": 1.0e-3, "slow": 1.7e-3}.get)
    assert later["band_s"] == pytest.approx([8.0e-3, 13.7e-3]) and later["modeled_s"] == out["modeled_s"]
    unmodeled = {"model": "qwen3_30b_a3b", "batch": 64, "modeled_s": None, "collectives_s": None}
    assert bench.restated(unmodeled, new.get) is unmodeled


def test_kernel_breakdown_counts_each_kernel_per_step():
    """kernel_top: the walk covers one layer group with the embedding and LM head (`first`) and those ends alone
    (`ends`); a step is ends + groups x (first - ends), so a layer kernel runs groups times and an end kernel once."""
    from types import SimpleNamespace

    from kernel_hub.tpu.chips import chip
    from tpu_cost_model.decode_worker import kernel_top

    c = chip("v6e")
    call = lambda name, s, b: SimpleNamespace(name=name, seconds=lambda _c, s=s: s, hbm_bytes=b)
    ends = SimpleNamespace(calls=[call("norm", 2e-6, 1000)])
    first = SimpleNamespace(calls=[call("norm", 2e-6, 1000), call("norm", 3e-6, 3000), call("gmm", 50e-6, 10**8),
                                   call("gmm", 40e-6, 8 * 10**7)])
    top = {row[0]: row for row in kernel_top(first, ends, 48, c)}
    assert top["gmm"][1] == 96 and top["gmm"][2] == pytest.approx(48 * 90e-6)
    assert top["gmm"][3] == 48 * 18 * 10**7 and top["gmm"][4] == pytest.approx(48 * 18e7 / c.hbm_bytes_per_s)
    assert top["norm"][1] == 49 and top["norm"][2] == pytest.approx(48 * 3e-6 + 2e-6)  # the final norm once
    assert [row[0] for row in kernel_top(first, ends, 48, c)] == ["gmm", "norm"]  # costliest first


def test_a_shared_mlp_riding_the_experts_all_reduce_is_one_collective_of_both():
    """Gemma 4 with its router in the experts' call: per layer the attention's all-reduce and one all-reduce of the
    experts' and the shared MLP's outputs side by side (twice the bytes), where apart it is three; Qwen3 (no shared
    MLP) is the same either way."""
    from types import SimpleNamespace

    from tpu_cost_model.decode_worker import collectives

    def plan_dispatch(batch, hidden, top_k, experts, expert_devices, itemsize):
        return ("psum", batch * top_k, "psum")

    def moe_collectives(scheme, sizes):
        return [("all_reduce", sizes.expert_devices, 2 * 7 / 8 * sizes.tokens * sizes.hidden * sizes.itemsize)]

    rd = SimpleNamespace(plan_dispatch=plan_dispatch, collectives=moe_collectives,
                         MoeSizes=lambda t, h, k, e, n, tn, item: SimpleNamespace(tokens=t, hidden=h, expert_devices=n,
                                                                                   itemsize=item))
    gemma, qwen = dm.MODELS["gemma4_26b_a4b"], dm.MODELS["qwen3_30b_a3b"]
    act = 2 * 7 / 8 * 64 * gemma.hidden * 2  # one [64, H] bf16 ring all-reduce's bytes a device sends
    apart, _ = collectives(gemma, rd, 64, 8)
    riding, ends = collectives(gemma, rd, 64, 8, shared_rides=True)
    assert apart == [("all_reduce", 8, act)] * 3
    assert riding == [("all_reduce", 8, act), ("all_reduce", 8, 2 * act)]
    assert collectives(qwen, rd, 64, 8, shared_rides=True) == collectives(qwen, rd, 64, 8)
    assert ends == collectives(gemma, rd, 64, 8)[1]
