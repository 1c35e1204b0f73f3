"""The TPU workers' mode tables: kernel_hub's worker serves the compile gate, the cost model's worker its own modes,
each entry names a function that exists, and a mode a worker does not serve is one error naming the ones it does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub.tpu import worker, worker_client
from kernel_hub.tpu.env import TpuEnv
from kernel_hub.tpu.worker import MODES, UnknownModeError, WorkerMode, mode_for, serve
from tpu_cost_model import worker as cost_worker

SRC = Path(__file__).resolve().parents[2] / "src"


def test_each_mode_is_served_by_one_worker_and_its_function_exists() -> None:
    assert set(MODES).isdisjoint(cost_worker.MODES)
    for mode, entry in {**MODES, **cost_worker.MODES}.items():
        function = entry.load()
        assert callable(function) and function.__name__ == entry.function and function.__module__ == entry.module, mode


@pytest.mark.parametrize("request_", [{"mode": "model"}, {"mode": None}, {}])
def test_an_unknown_mode_names_the_modes_served(request_: dict) -> None:
    with pytest.raises(UnknownModeError, match=r"for the TPU worker w: it serves compile$"):
        mode_for(request_, MODES, "w")
    assert mode_for({"mode": "compile"}, MODES, "w") is MODES["compile"]


def _serve_one(tmp_path: Path, request: dict, modes: dict[str, WorkerMode]) -> tuple[int, list[dict]]:
    req, events = tmp_path / "request.json", tmp_path / "events.jsonl"
    req.write_text(json.dumps(request))
    status = serve(["worker", str(req), str(events)], modes, "w")
    return status, [json.loads(line) for line in events.read_text().splitlines()]


def test_serve_runs_the_table_entry_and_ends_with_done_only_on_success(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "toy_modes.py").write_text(
        "def run(request, emit):\n    emit({'event': 'row', 'x': request['x']})\n    return request['status']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    modes = {"toy": WorkerMode("toy_modes", "run")}
    status, events = _serve_one(tmp_path, {"mode": "toy", "x": 7, "status": 0}, modes)
    assert status == 0 and [e["event"] for e in events] == ["hello", "row", "done"] and events[1]["x"] == 7
    (tmp_path / "events.jsonl").unlink()
    status, events = _serve_one(tmp_path, {"mode": "toy", "x": 1, "status": 3}, modes)
    assert status == 3 and [e["event"] for e in events] == ["hello", "row"]


def test_the_worker_process_refuses_a_cost_model_mode_in_one_line(tmp_path: Path) -> None:
    req, events = tmp_path / "request.json", tmp_path / "events.jsonl"
    req.write_text(json.dumps({"mode": "model"}))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "kernel_hub.tpu.worker", str(req), str(events)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == "unknown mode 'model' for the TPU worker kernel_hub.tpu.worker: it serves compile"
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["hello"]


def test_the_cost_model_runs_its_own_worker_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(command: list[str], *args: object) -> tuple[list, int, str]:
        seen.append(command)
        return [], 0, ""

    monkeypatch.setattr(worker_client, "_run", fake_run)
    env = TpuEnv(Path(sys.executable), "0", "0")
    cost_worker.run_in_worker(env, {"mode": "model"})
    worker_client.run_worker(env, {"mode": "compile"})
    assert [c[1:3] for c in seen] == [["-m", "tpu_cost_model.worker"], ["-m", worker.__name__]]
