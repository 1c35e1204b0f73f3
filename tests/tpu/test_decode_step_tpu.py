"""A two-group tiny decode step of each seed model (a group: Qwen3 one layer; Gemma 4 a sliding and a global layer)
on kernel-hub's Pallas kernels, compiled whole by libtpu (.venv-tpu, a subprocess) for a mock v6e-8 and modeled:
every device holds its shard (the compiler's argument bytes cover the weights and caches worked out by hand), the
caches are updated in place (no second copy of them), and the modeled time sits above the HBM floor.
Skips, with the reason, only where the TPU environment is missing."""

from __future__ import annotations

import pytest

from kernel_hub.tpu.env import TpuEnvironmentError, tpu_env
from tpu_cost_model import decode_models as dm
from tpu_cost_model.decode import decode_rows

BATCH, CACHE, GROUPS = 8, 256, 2


@pytest.fixture(scope="module")
def rows():
    try:
        env = tpu_env()
    except TpuEnvironmentError as exc:
        pytest.skip(str(exc))
    found = decode_rows(("tiny_qwen3_30b_a3b", "tiny_gemma4_26b_a4b"), (BATCH,), (CACHE,), ("v6e",), ("hub",),
                        env=env, groups=GROUPS, timeout=900)
    return {r["model"]: r for r in found}


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "gemma4_26b_a4b"])
def test_tiny_step_compiles_with_its_shard_on_every_chip(rows, name):
    r = rows[f"tiny_{name}"]
    assert r["compiled"], r["error"]
    assert r["mesh"] == "v6e:2x4" and r["devices"] == 8
    m = dm.tiny(dm.MODELS[name], groups=GROUPS, head_dim=128)
    # the weights' and caches' shards, bf16; the routing metadata and tokens are a few KiB more
    shard = dm.weight_bytes_per_device(m, 8) + dm.kv_cache_bytes_per_device(m, BATCH, CACHE, 8)
    if any(k.k_eq_v for k in m.pattern):  # the step stores keys = values twice (the kernel takes two caches)
        shard += m.groups * sum(BATCH * 2 * dm.PAGE * k.head_dim * 2 for k in m.pattern if k.k_eq_v)
    # the caches are laid out as the attention kernel reads them (the compiler's choice): bf16 tiles of (2, 128)
    # over (KV heads, head dim), so one KV head a device (2 over 8 devices here) takes the room of two
    shard += sum(2 * m.groups * BATCH * 2 * dm.PAGE * k.head_dim * 2 for k in m.pattern
                 if dm.kv_heads_per_device(k.kv_heads, 8) == 1)
    assert shard <= r["argument_bytes"] < shard + 2**20
    assert r["alias_bytes"] > 0  # the donated caches come back in place
    assert r["temp_bytes"] < 0.75 * dm.kv_cache_bytes_per_device(m, BATCH, CACHE, 8)  # one group's, not all


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "gemma4_26b_a4b"])
def test_tiny_step_is_modeled_above_its_floor(rows, name):
    r = rows[f"tiny_{name}"]
    assert r["modeled_s"] is not None, r.get("model_error")
    lo, hi = r["band_s"]
    assert r["hbm_floor_s"] < lo <= r["modeled_s"] <= hi
    # a norm, the attention and the experts per layer at least
    assert r["kernel_calls"] >= 3 * dm.tiny(dm.MODELS[name], groups=GROUPS).layers


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "gemma4_26b_a4b"])
def test_tiny_step_glue_is_charged_from_its_compiled_program(rows, name):
    """The compiled step's loop over layer groups is read (its trip count) and its kernels match the walk's; the
    jaxpr rule's figure stays beside it, over the same kernels and collectives."""
    r = rows[f"tiny_{name}"]
    assert r["xla_rule"] == "compiled", r["xla_rule"]
    assert r["xla_ops"] > 0 and r["xla_ops_jaxpr"] > 0
    same = r["kernels_s"] + r["collectives_s"]
    assert r["modeled_s"] == pytest.approx(same + r["xla_s"])
    assert r["modeled_jaxpr_s"] == pytest.approx(same + r["xla_jaxpr_s"])
    lo, hi = r["band_jaxpr_s"]
    assert lo <= r["modeled_jaxpr_s"] <= hi
