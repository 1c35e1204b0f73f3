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
from collections.abc import Callable, Mapping
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

#: Seconds a worker may go without writing an event before it is stopped as hung. Every case writes a "start" and a
#: "result" event, and a "working" event every worker_common.HEARTBEAT_SECONDS while its compile runs (a large
#: Mosaic kernel takes minutes), so the limit scales with the job by itself: a long job that keeps reporting runs to
#: its end, a worker that stops reporting outside a compile is stopped after this long.
STALL_ENV = "KERNEL_HUB_TPU_WORKER_STALL"
DEFAULT_STALL_SECONDS = 300.0
#: The most of a worker's stderr kept (its last bytes: what a crash said).
STDERR_TAIL = 64 << 10
#: JAX's persistent compilation cache folder, read from the environment by every JAX process.
PERSISTENT_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def stall_seconds(environ: Mapping[str, str] | None = None) -> float:
    """The stall limit: $KERNEL_HUB_TPU_WORKER_STALL seconds (a positive number), else DEFAULT_STALL_SECONDS.

    Raises:
        TpuEnvironmentError: the variable is set to anything but a positive number of seconds.
    """
    raw = (os.environ if environ is None else environ).get(STALL_ENV, "").strip()
    if not raw:
        return DEFAULT_STALL_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0 < value < 1e7):
        raise TpuEnvironmentError(f"{STALL_ENV}={raw[:40]!r}: expected seconds (a positive number)")
    return value


def _follow(proc: subprocess.Popen, events_path: Path, on_event: Callable[[JsonDict], None] | None,
            timeout: float | None, stall: float) -> str | None:
    """Hand each event to `on_event` as the worker writes it (whole lines only) until it exits -> None, or the
    reason it was killed: no new event for `stall` seconds, or past `timeout` seconds in all."""
    start = last = time.monotonic()
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
        now = time.monotonic()
        if chunk:
            last = now
        offset += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines if on_event is not None else ():
            try:
                on_event(json.loads(line))
            except ValueError:
                continue
        if finished:
            return None
        problem = None
        if now - last > stall:
            problem = f"stopped: no progress for {stall:.0f} s (set {STALL_ENV} to allow longer)"
        elif timeout is not None and now - start > timeout:
            problem = f"timed out after {timeout:.0f} s"
        if problem is not None:
            proc.kill()
            proc.wait()
            return problem


def _tail(path: Path, size: int = STDERR_TAIL) -> str:
    """The last `size` bytes of a file, as text."""
    with path.open("rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - size, 0))
        return f.read().decode(errors="replace")


#: The worker module run_worker starts unless told another.
WORKER = "kernel_hub.tpu.worker"


def run_worker(env: TpuEnv, request: JsonDict, *, timeout: float | None = None,
               on_event: Callable[[JsonDict], None] | None = None,
               worker: str = WORKER, stall: float | None = None) -> tuple[list[JsonDict], int, str]:
    """(events, exit status, stderr) of one worker run for `request`; `on_event` (live progress) gets each event
    as it is written; `worker` is the module run with `python -m` (one whose modes include the request's).

    A worker that writes no event for `stall` seconds (None: stall_seconds()) or runs past `timeout` seconds in all
    (None: no overall limit) is killed: exit status -1, and the last line of stderr says why. stderr keeps its last
    STDERR_TAIL bytes only."""
    stall = stall_seconds() if stall is None else stall
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
        # a compile-only TPU client cannot load an executable back from JAX's persistent cache ("PjRtCompiler must
        # be constructed with a Client"): with a cache set, every compile would write an entry no run can read and
        # warn on each repeat, so the worker compiles without one
        child_env.pop(PERSISTENT_CACHE_ENV, None)
        command = [str(env.python), "-m", worker, str(req_path), str(events_path)]
        return _run(command, child_env, tmp, events_path, on_event, timeout, stall, env)


def _run(command: list[str], child_env: dict[str, str], cwd: str, events_path: Path,
         on_event: Callable[[JsonDict], None] | None, timeout: float | None, stall: float,
         env: TpuEnv) -> tuple[list[JsonDict], int, str]:
    """Start the worker, follow its events, return (events, status, stderr). Its stderr goes to a file (a pipe
    could fill and block it) and only its tail is read back; stdout is discarded."""
    stderr_path = Path(cwd) / "stderr.txt"
    with stderr_path.open("w") as err:
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    env=child_env, cwd=cwd)
        except OSError as exc:
            raise TpuEnvironmentError(f"cannot run the TPU environment's Python {env.python}: {exc}") from None
        problem = _follow(proc, events_path, on_event, timeout, stall)
    stderr = _tail(stderr_path)
    if problem is not None:
        return _read_events(events_path), -1, stderr + f"\n{problem}"
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
