"""Drive a worker (worker.py, or one built on its `serve`) in the TPU environment's Python and read its events
back: one subprocess per request, for the compile gate (compile_gate/worker_pool.py) and the checkout's cost model
(tpu_cost_model/worker.py) alike.

A worker that refuses the kernel package (a file differs from the digests the parent verified) reports it as one
"refused" event; `refusal` turns it back into the error.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from ..errors import IntegrityError, KernelHubError, KernelImportError
from .env import CHECKOUT, TpuEnv, TpuEnvironmentError

if TYPE_CHECKING:
    from ..json_types import JsonDict


def _read_events(path: Path) -> list[JsonDict]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut by a crash
            continue
    return events


def last_line(text: str) -> str:
    """The last line a worker wrote to stderr (what a crash said), cut to 300 characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


Runner: TypeAlias = "Callable[..., tuple[list[JsonDict], int, str]]"


def _follow(proc: subprocess.Popen, events_path: Path, on_event: Callable[[JsonDict], None],
            timeout: float) -> bool:
    """Hand each event to `on_event` as the worker writes it (whole lines only); False when `timeout` passed
    (the worker is killed)."""
    deadline = time.monotonic() + timeout
    offset, pending = 0, b""
    while True:
        try:
            proc.wait(timeout=0.25)
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        with events_path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            try:
                on_event(json.loads(line))
            except ValueError:
                continue
        if finished:
            return True
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return False


#: The worker module run_worker starts unless told another.
WORKER = "kernel_hub.tpu.worker"


def run_worker(env: TpuEnv, request: JsonDict, *, timeout: float = 1800,
               on_event: Callable[[JsonDict], None] | None = None,
               worker: str = WORKER) -> tuple[list[JsonDict], int, str]:
    """(events, exit status, stderr) of one worker run for `request`; `on_event` (live progress) gets each event
    as it is written; `worker` is the module run with `python -m` (one whose modes include the request's)."""
    with tempfile.TemporaryDirectory(prefix="kernel_hub_tpu_") as tmp:
        req_path, events_path = Path(tmp) / "request.json", Path(tmp) / "events.jsonl"
        req_path.write_text(json.dumps(request))
        events_path.touch()
        child_env = dict(os.environ)
        if CHECKOUT is not None:  # the checkout's kernel_hub importable where the TPU Python has not installed it
            rest = child_env.get("PYTHONPATH")
            child_env["PYTHONPATH"] = str(CHECKOUT / "src") + (os.pathsep + rest if rest else "")
        child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) meant for real chips; compiling for mock
        # ones needs no exclusivity, so two validations (or a test and a bench) may run at once
        child_env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        command = [str(env.python), "-m", worker, str(req_path), str(events_path)]
        if on_event is not None:
            return _run_following(command, child_env, tmp, events_path, on_event, timeout, env)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=child_env, cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return _read_events(events_path), -1, stderr + f"\ntimed out after {timeout:.0f} s"
        except OSError as exc:
            raise TpuEnvironmentError(f"cannot run the TPU environment's Python {env.python}: {exc}") from None
        return _read_events(events_path), done.returncode, done.stderr


def _run_following(command: list[str], child_env: dict[str, str], cwd: str, events_path: Path,
                   on_event: Callable[[JsonDict], None], timeout: float,
                   env: TpuEnv) -> tuple[list[JsonDict], int, str]:
    """run_worker's streaming path: the worker's stderr goes to a file (a pipe could fill and block it)."""
    stderr_path = Path(cwd) / "stderr.txt"
    with stderr_path.open("w") as err:
        try:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True, env=child_env,
                                    cwd=cwd)
        except OSError as exc:
            raise TpuEnvironmentError(f"cannot run the TPU environment's Python {env.python}: {exc}") from None
        finished = _follow(proc, events_path, on_event, timeout)
    stderr = stderr_path.read_text(errors="replace")
    if not finished:
        return _read_events(events_path), -1, stderr + f"\ntimed out after {timeout:.0f} s"
    return _read_events(events_path), proc.returncode, stderr


def refusal(events: list[JsonDict]) -> KernelHubError | None:
    """The error a worker reported for a package it refused to run (tampered files, a failing import)."""
    for e in events:
        if e.get("event") == "refused":
            kind = IntegrityError if e.get("kind") == "integrity" else KernelImportError
            return kind(str(e.get("error") or "the TPU worker refused the kernel package")[:400])
    return None


def default_jobs(generations: int) -> int:
    """Compiler processes at once: one per generation, at most one per CPU (libtpu compiles a case on one
    thread)."""
    return max(1, min(generations, os.cpu_count() or 1))
