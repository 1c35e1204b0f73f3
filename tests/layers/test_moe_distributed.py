"""kernelize on a model transformers itself sharded: its expert-parallel and tensor-parallel plans
(DistributedConfig(ep_size=2, tp_size=2) and DistributedConfig(tp_size=2)) over torch.distributed with gloo, two CPU
processes (tests/moe_distributed_worker.py). Each rank: the sharded model's logits equal the unsharded model's, the
expert blocks are kernelized (validated on the rank's own weight slices), the kernel really runs in the sharded
forward, the kernelized logits still equal the unsharded ones, and restore() gives back the sharded model's logits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub.verify.numerics import TOLERANCE

HERE = Path(__file__).resolve().parents[1]

WORLD = 2
PLANS = [["ep2", {"ep_size": 2, "tp_size": 2}], ["tp2", {"tp_size": 2}]]
EXPERTS, LAYERS = 8, 2  # tiny_models' qwen3_moe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    from tests.tiny_models import tiny_model

    model_dir = tmp_path_factory.mktemp("qwen3_moe")
    tiny_model("qwen3_moe").save_pretrained(model_dir)
    port = str(_free_port())
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, MODEL_DIR=str(model_dir), PLANS=json.dumps(PLANS), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "moe_distributed_worker.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"rank exited {proc.returncode}:\n{text[-3000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


@pytest.mark.parametrize("plan", [p[0] for p in PLANS])
def test_sharded_model_kernelizes_with_the_unsharded_logits(ranks, plan):
    tol = TOLERANCE["float32"]
    for r in ranks:
        got = r["plans"][plan]
        if plan == "ep2":  # transformers really sharded the experts
            assert got["weight_type"] == "DTensor" and got["local_shape"] != got["global_shape"], got
        else:  # tp2 really ran tensor parallel: attention's q projection is split over the ranks
            assert got["q_proj_local_rows"] * WORLD == got["q_proj_rows"], got
        assert got["sharded_vs_unsharded"] <= tol * got["scale"]
        assert len(got["replaced"]) == LAYERS and got["kept"] == [], got["kept"]
        assert all(e <= tol for e in got["validation_errors"])
        assert got["kernel_calls"] == [1] * LAYERS  # the kernel ran once per block in the sharded forward
        assert got["kernelized_vs_unsharded"] <= tol * got["scale"]
        assert got["restored"] and got["restored_vs_sharded"] == 0.0


@pytest.mark.parametrize("plan", [p[0] for p in PLANS])
def test_sharded_model_quantizes_its_local_slices(ranks, plan):
    """kernelize(quantize="int8") on a sharded model quantizes each rank's own weight slices (what the block computes
    on), each block checked against its own layer within its bound; restore gives back the sharded model exactly."""
    for r in ranks:
        got = r["plans"][plan]
        assert got["int8_kept"] == [] and len(got["int8"]) == LAYERS, got
        for fmt, err, bound, why in got["int8"]:
            assert fmt is not None and "int8" in fmt, why
            assert err is not None and err <= bound, why
        assert got["int8_vs_unsharded"] <= 0.1 * got["scale"]  # int8 weights: close, not equal
        assert got["restored_after_int8_vs_sharded"] == 0.0


def test_expert_parallel_ranks_hold_whole_experts(ranks):
    for r in ranks:
        got = r["plans"]["ep2"]
        assert got["local_shape"][0] == EXPERTS // WORLD and got["num_experts_attr"] == EXPERTS // WORLD


def test_tensor_parallel_ranks_hold_every_expert(ranks):
    """transformers 5.25's Qwen3-MoE tensor-parallel plan splits attention and the dense MLPs, not the experts (5.24
    split each expert's projections): every rank holds every expert whole, and kernelize computes them all."""
    for r in ranks:
        got = r["plans"]["tp2"]
        assert got["local_shape"] == got["global_shape"] and got["local_shape"][0] == EXPERTS, got
        assert got["num_experts_attr"] == EXPERTS
