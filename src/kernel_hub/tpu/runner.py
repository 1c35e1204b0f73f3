"""Drive the worker (worker.py) in the TPU environment's Python and read its events back.

One subprocess per request. A compiler that kills the process (abort, segfault) fails only the case it was
compiling: the runner marks that case failed with the exit status and the last line of stderr, then starts
a fresh worker for the cases left.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .env import CHECKOUT, TpuEnv, TpuEnvironmentError

#: Restarts after a crash before the rest of the request is given up (each costs one case).
MAX_RESTARTS = 8


def _read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut by a crash
            continue
    return events


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_worker(env: TpuEnv, request: dict[str, Any], *, timeout: float = 1800) -> tuple[list[dict[str, Any]], int, str]:
    """(events, exit status, stderr) of one worker run for `request`."""
    with tempfile.TemporaryDirectory(prefix="kernel_hub_tpu_") as tmp:
        req_path, events_path = Path(tmp) / "request.json", Path(tmp) / "events.jsonl"
        req_path.write_text(json.dumps(request))
        events_path.touch()
        child_env = dict(os.environ)
        src = str(CHECKOUT / "src")  # kernel_hub importable even where the TPU Python has not installed it
        child_env["PYTHONPATH"] = src + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
        child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) meant for real chips; compiling for mock
        # ones needs no exclusivity, so two validations (or a test and a bench) may run at once
        child_env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        try:
            done = subprocess.run(
                [str(env.python), "-m", "kernel_hub.tpu.worker", str(req_path), str(events_path)],
                capture_output=True, text=True, timeout=timeout, env=child_env, cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return _read_events(events_path), -1, stderr + f"\ntimed out after {timeout:.0f} s"
        except OSError as exc:
            raise TpuEnvironmentError(f"cannot run the TPU environment's Python {env.python}: {exc}") from None
        return _read_events(events_path), done.returncode, done.stderr


def compile_in_worker(
    env: TpuEnv,
    package_dir: Path,
    entry: str,
    generations: tuple[str, ...],
    *,
    names: list[str] | None = None,
    tags: list[str] | None = None,
    run: Callable[..., tuple[list[dict[str, Any]], int, str]] = run_worker,
) -> list[dict[str, Any]]:
    """Result records ({"generation", "name", "passed", ...}) for every (generation, case) selected by
    `names` / `tags` (None: all), in generation then case order."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    order = list(names) if names is not None else None
    for _ in range(MAX_RESTARTS + 1):
        todo: dict[tuple[str, ...] | None, list[str]] = {}
        for g in generations:
            left = None if order is None else tuple(n for n in order if (g, n) not in results)
            if left is None or left:
                todo.setdefault(left, []).append(g)
        if not todo:
            break
        for left, gens in todo.items():
            request = {"mode": "compile", "package_dir": str(package_dir), "entry": entry, "generations": gens,
                       "cases": None if left is None else list(left), "tags": tags}
            events, status, stderr = run(env, request)
            for e in events:
                if e.get("event") == "cases" and order is None:
                    order = list(e["names"])
                elif e.get("event") == "result":
                    results[(e["generation"], e["name"])] = e
            if status == 0 and any(e.get("event") == "done" for e in events):
                continue
            started = [e for e in events if e.get("event") == "start"]
            if not started:  # died before any case: the environment or the package is broken
                raise TpuEnvironmentError(
                    f"the TPU compile worker failed (exit {status}) before compiling anything: {_last_line(stderr)}"
                )
            key = (started[-1]["generation"], started[-1]["name"])
            results.setdefault(key, {"event": "result", "generation": key[0], "name": key[1], "passed": False,
                                     "compile_seconds": None,
                                     "error": f"compiler process died (exit {status}): {_last_line(stderr)}"})
    return [results[(g, n)] for g in generations for n in (order or []) if (g, n) in results]
