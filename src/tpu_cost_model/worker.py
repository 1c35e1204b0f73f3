"""The cost model's TPU worker: the same process as kernel_hub's (kernel_hub.tpu.worker `serve`: one request, its
events as JSON lines), serving the cost model's modes.

    python -m tpu_cost_model.worker REQUEST.json EVENTS.jsonl

`run_in_worker` is the parent's side: kernel_hub.tpu.worker_client.run_worker pointed at this module.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from kernel_hub.tpu.worker import WorkerMode, serve
from kernel_hub.tpu.worker_client import STALL_ENV, run_worker

if TYPE_CHECKING:
    from kernel_hub.tpu.env import TpuEnv

WORKER = "tpu_cost_model.worker"

#: The modes this worker serves.
MODES: dict[str, WorkerMode] = {
    "model": WorkerMode("tpu_cost_model.model_worker", "run_model"),
    "quant_model": WorkerMode("tpu_cost_model.model_quant", "run_quant_model"),
    "calibration": WorkerMode("tpu_cost_model.calibration_worker", "run_calibration"),
    "peers": WorkerMode("tpu_cost_model.peers_worker", "run_peers"),
    "mesh": WorkerMode("tpu_cost_model.mesh_worker", "run_mesh"),
    "decode": WorkerMode("tpu_cost_model.decode_worker", "run_decode"),
}


def run_in_worker(env: TpuEnv, request: dict[str, Any], **kwargs: Any) -> tuple[list[dict[str, Any]], int, str]:
    """(events, exit status, stderr) of one cost-model request run by this worker in the TPU environment.

    Args:
        env: the TPU environment (kernel_hub.tpu.env.tpu_env()).
        request: the request; its "mode" is one of MODES.
        **kwargs: run_worker's (timeout, on_event, stall). Without `stall`, a request given a `timeout` may go
            quiet for all of it: one cost-model row (a long prefill walk, a whole-model compile) can take many
            minutes on a loaded machine between two events, where the compile gate's cases never do.

    Returns:
        run_worker's triple.
    """
    if kwargs.get("timeout") is not None and "stall" not in kwargs and STALL_ENV not in os.environ:
        kwargs["stall"] = kwargs["timeout"]
    return run_worker(env, request, worker=WORKER, **kwargs)


def main(argv: list[str]) -> int:
    return serve(argv, MODES, WORKER)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
