"""The cost model against published measured TPU times (bench/records/tpu_calibration.json).

The table's schema; every model parameter recomputed from the row it is fitted on; one row per kind of schedule
modeled end to end and held to the 20% target (the BlockSpec pipeline: jax's Pallas matmul, both tiling regimes, in
this environment; a kernel that streams with its own DMAs: tpu-inference's RPA v3, in the TPU environment); and the
walker on the tpu-inference kernels as installed in the TPU environment (no copy of them in this tree).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.tpu.matmul import matmul

from kernel_hub.tpu.chips import HOST_DISPATCH_S, STEP_OVERHEAD_S, STREAM_FRACTION, chip
from kernel_hub.tpu.cost_model import calibration
from kernel_hub.tpu.cost_model.schedule import kernel_cost
from tests.client_env import child_env
from tests.tpu_toys import env_or_skip

ROOT = Path(__file__).resolve().parents[1]
ROWS = {r["id"]: r for r in calibration.load()["rows"]}


def test_the_table_keeps_its_schema():
    data = json.loads(calibration.TABLE.read_text())
    assert calibration.check_table(data) == []
    assert {r["kernel"] for r in data["rows"]} == set(calibration.KINDS)
    fitted = {r["id"] for r in data["rows"] if r["use"] == "fit"}
    assert fitted == {"v5e-matmul-128-8192", "v5e-xla-matmul-1024", "tpu7x-streamed-copy"}
    for r in data["rows"]:
        if "measured_s" in r:  # a time comes with what it includes and the shapes it was measured at
            assert r["shapes"] and r["dtypes"] and r["includes"] in ("device", "host")


def test_a_broken_table_names_every_problem():
    data = json.loads(calibration.TABLE.read_text())
    bad = copy.deepcopy(data)
    bad["rows"][0]["source"] = "ftp://elsewhere"
    bad["rows"][1]["chip"] = "v9"
    bad["rows"][2]["id"] = bad["rows"][3]["id"]
    del bad["rows"][4]["measured_s"]
    bad["rows"][5]["shapes"] = {}
    problems = calibration.check_table(bad)
    assert len(problems) == 5, problems
    assert any("source" in p for p in problems) and any("chip" in p for p in problems)
    assert any("duplicate id" in p for p in problems) and any("measured" in p for p in problems)
    assert any("full shapes" in p for p in problems)
    assert calibration.check_table({"rows": "no"}) == ["the table must be an object with a list 'rows'"]


def test_each_parameter_comes_from_its_row():
    """The fitted figures, recomputed here from the published numbers (not from the model)."""
    copy_row = ROWS["tpu7x-streamed-copy"]
    assert pytest.approx(copy_row["measured_bytes_per_s"], rel=0.003) == STREAM_FRACTION * 7.37e12 / 2
    xla = ROWS["v5e-xla-matmul-1024"]
    mxu_s = 2 * 1024**3 / 197e12
    assert pytest.approx(xla["measured_s"] - mxu_s, rel=1e-3) == HOST_DISPATCH_S
    mm = ROWS["v5e-matmul-128-8192"]
    steps = (8192 // 128) ** 3
    assert pytest.approx((mm["measured_s"] - HOST_DISPATCH_S - 2 * 8192**3 / 197e12) / steps,
                                            rel=1e-3) == STEP_OVERHEAD_S


@pytest.mark.parametrize("row_id", [r for r in ROWS if ROWS[r]["kernel"] == "pallas_matmul"])
def test_pallas_matmul_rows_are_modeled_within_target(row_id):
    """Both tiling regimes of the v5e tutorial table (step-bound 128 tiles, MXU-bound 512x1024x1024), walked on
    jax's own matmul kernel at the row's shapes: each within 20% of its measured time (the fitted one too)."""
    row = ROWS[row_id]
    s = row["shapes"]
    x, y = jax.ShapeDtypeStruct((s["m"], s["k"]), jnp.bfloat16), jax.ShapeDtypeStruct((s["k"], s["n"]), jnp.bfloat16)
    cost = kernel_cost(lambda a, b: matmul(a, b, block_shape=(s["bm"], s["bn"]), block_k=s["bk"]), x, y,
                       generation="v5e")
    (call,) = cost.calls
    assert call.grid == (s["m"] // s["bm"], s["n"] // s["bn"], s["k"] // s["bk"])
    result = calibration.compare(row, cost.seconds(chip("v5e")))
    assert result["within"], (row_id, result)
    assert abs(result["error"]) < 0.07


def test_the_uncalibrated_model_missed_the_step_bound_regime():
    """What the calibration fixed: spec bandwidth with steps added to the bound put the 128-tile 8192 row 23% high
    (and without host dispatch the 1024 rows 25-90% low)."""
    s = ROWS["v5e-matmul-128-8192"]["shapes"]
    x = jax.ShapeDtypeStruct((s["m"], s["k"]), jnp.bfloat16)
    (call,) = kernel_cost(lambda a, b: matmul(a, b, block_shape=(128, 128), block_k=128), x, x,
                          generation="v5e").calls
    v5e = chip("v5e")
    old = max(call.hbm_bytes / v5e.hbm_bytes_per_s, call.flops / v5e.bf16_flops_per_s) + call.steps * 0.35e-6
    assert old / ROWS["v5e-matmul-128-8192"]["measured_s"] - 1 > 0.2


_WALK = r"""
import json, sys
from kernel_hub.tpu.cost_model import calibration
from kernel_hub.tpu.cost_model.calibration_worker import _rpa_v3, model_row
from kernel_hub.tpu.cost_model.schedule import kernel_cost, Unmodeled
from kernel_hub.tpu.cost_model.tpu_inference_peers import PeerUnavailable, import_kernel, installed_version
from kernel_hub.tpu.target import tpu_target
import jax, numpy as np
out = {"version": installed_version()}
rpa = import_kernel("rpa_v3")
out["rpa_file"] = rpa.__file__
row = [r for r in calibration.load()["rows"] if r["id"] == "tpu7x-rpa_v3-decode-128seq"][0]
small = dict(row, shapes=dict(row["shapes"], seqs=4, kv_len=1024))
with tpu_target("v7x"):
    fn, args = _rpa_v3(small)
    cost = kernel_cost(fn, *args, generation="v7x")
out["rpa_small"] = {"hbm": cost.hbm_bytes, "outside": cost.outside_bytes, "calls": [c.name for c in cost.calls],
                    "dmas": sum(c.dmas for c in cost.calls)}
gmm = import_kernel("megablox_gmm")
out["gmm_file"] = gmm.__file__
gs = np.array([128, 0, 256, 128], np.int32)
sds = jax.ShapeDtypeStruct
with tpu_target("v6e"):
    c = kernel_cost(lambda a, b, s: gmm.gmm(a, b, s, preferred_element_type=jax.numpy.bfloat16,
                                            tiling=(128, 256, 256)),
                    sds((512, 256), "bfloat16"), sds((4, 256, 512), "bfloat16"), gs, generation="v6e")
out["gmm"] = {"read": c.calls[0].read_bytes, "flops": c.flops}
fm = import_kernel("fused_moe_v1")
out["fused_moe_file"] = fm.__file__
refused = {}
for name in ("rpa_v3_hd64", "gmm_v2_gather_scatter"):
    try:
        import_kernel(name)
        refused[name] = None
    except PeerUnavailable as exc:
        refused[name] = str(exc)
out["refused"] = refused
out["row"] = model_row(row) if "--row" in sys.argv else None
print(json.dumps(out))
"""


def _walk(*flags: str) -> dict:
    env = env_or_skip()
    done = subprocess.run([str(env.python), "-c", _WALK, *flags], capture_output=True, text=True, timeout=600,
                          env=child_env(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3",
                                        ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def walked() -> dict:
    return _walk("--row")


def test_the_walker_reads_the_installed_tpu_inference_kernels(walked):
    """RPA v3 and megablox gmm come from the TPU environment's tpu-inference 0.32.0, never from this tree; the
    walker reads RPA v3's own DMAs (sized per sequence from its scalar data) to exactly the cache it attends over;
    gmm's BlockSpec pipeline to the visited groups' weights; the modules that do not import say why."""
    assert walked["version"] == "0.32.0"
    for key in ("rpa_file", "gmm_file", "fused_moe_file"):
        assert "site-packages/tpu_inference/kernels/" in walked[key]
        assert not walked[key].startswith(str(ROOT) + "/src")
    kv = 4 * 1024 * 4 * 256 * 2 * 2  # 4 sequences x 1024 cached tokens x 4 kv heads x 256 x (K, V) x bf16
    small = walked["rpa_small"]
    assert small["calls"][0].startswith("RPAd") and small["dmas"] > 0
    assert kv <= small["hbm"] - small["outside"] <= kv * 1.05  # + q, the new k/v, the output, the metadata
    rhs_visited = 3 * 256 * 512 * 2  # three groups with rows, each [256, 512] bf16 once (k fits one tile)
    assert walked["gmm"]["read"] >= rhs_visited + 512 * 256 * 2
    assert walked["gmm"]["flops"] >= 2 * 512 * 256 * 512
    for name, why in walked["refused"].items():
        assert why and "torchax" in why, (name, why)


def test_rpa_v3_decode_row_is_modeled_within_target(walked):
    """A kernel that streams with its own DMAs inside one grid step, end to end at the published shape."""
    row = ROWS["tpu7x-rpa_v3-decode-128seq"]
    result = calibration.compare(row, walked["row"]["device_s"])
    assert result["within"], result
    assert walked["row"]["hbm_bytes"] >= 128 * 15360 * 4 * 256 * 2 * 2


def test_no_copy_of_tpu_inference_kernels_in_the_tree():
    markers = ("def ragged_paged_attention(", "def fused_ep_moe(", "_fused_ep_moe_kernel", "RPAd-p_")
    for folder in ("src", "kernels", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(errors="replace")
            hits = [m for m in markers if m in text]
            assert not hits, (path, hits)
