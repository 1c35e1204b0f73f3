"""The TPU worker: one process in the TPU environment (jax + libtpu), never the main process, that runs one request.

    python -m kernel_hub.tpu.worker REQUEST.json EVENTS.jsonl

The request's "mode" picks the side that serves it: "compile" the compile gate (compile_gate/compile_worker.py);
"model", "quant_model", "calibration", "peers" and "mesh" the cost model (cost_model/*_worker.py, model_quant.py).
Every event is one JSON line appended to EVENTS and flushed (a "hello" line first, with the jax and libtpu
versions), so a crash loses nothing written. A refused package is one "refused" event (kind "integrity" or
"import", one line) and exit status 3 (worker_common.refuse).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def versions() -> dict[str, str | None]:
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    # libtpu ships as libtpu (jax[tpu], torch-tpu) or, on nightly installs, libtpu-nightly: same compiler either way.
    return {"jax": version("jax"), "libtpu": version("libtpu") or version("libtpu-nightly")}


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    events_path = Path(argv[2])

    def emit(record: dict[str, Any]) -> None:  # one line per event, flushed: a crash loses nothing written
        with events_path.open("a") as events:
            events.write(json.dumps(record) + "\n")

    emit({"event": "hello", **versions()})
    if request["mode"] == "compile":
        from .compile_gate.compile_worker import run_compile

        status = run_compile(request, emit)
    elif request["mode"] == "model":
        from tpu_cost_model.model_worker import run_model

        status = run_model(request, emit)
    elif request["mode"] == "quant_model":
        from tpu_cost_model.model_quant import run_quant_model

        status = run_quant_model(request, emit)
    elif request["mode"] == "calibration":
        from tpu_cost_model.calibration_worker import run_calibration

        status = run_calibration(request, emit)
    elif request["mode"] == "peers":
        from tpu_cost_model.peers_worker import run_peers

        status = run_peers(request, emit)
    elif request["mode"] == "mesh":
        from tpu_cost_model.mesh_worker import run_mesh

        status = run_mesh(request, emit)
    else:
        raise SystemExit(f"unknown mode {request['mode']!r}")
    if status == 0:
        emit({"event": "done"})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
