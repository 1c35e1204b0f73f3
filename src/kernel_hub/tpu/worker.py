"""The TPU worker: one process in the TPU environment (jax + libtpu), never the main process, that runs one request.

    python -m kernel_hub.tpu.worker REQUEST.json EVENTS.jsonl

The request's "mode" picks, from a table, the function that serves it: here the compile gate's one mode
("compile", compile_gate/compile_worker.py). Another worker built on this one (the checkout's cost model,
tpu_cost_model/worker.py) hands `serve` its own table. Every event is one JSON line appended to EVENTS and flushed
(a "hello" line first, with the jax and libtpu versions), so a crash loses nothing written. A refused package is one
"refused" event (kind "integrity" or "import", one line) and exit status 3 (worker_common.refuse).
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelHubError
from ..json_types import JsonDict

Emit = Callable[[JsonDict], None]
#: A mode's function: (the request, the event writer) -> the worker's exit status.
ModeFunction = Callable[[JsonDict, Emit], int]


class UnknownModeError(KernelHubError):
    """A request names a mode the worker it was sent to does not serve."""


@dataclass(frozen=True)
class WorkerMode:
    """Where a mode's function lives: imported only when a request asks for that mode, so a worker loads one side.

    Attributes:
        module: the absolute module name (a literal in the table, so the import graph sees the edge).
        function: the function's name in it, a ModeFunction.
    """

    module: str
    function: str

    def load(self) -> ModeFunction:
        return getattr(importlib.import_module(self.module), self.function)


#: The modes this worker serves.
MODES: dict[str, WorkerMode] = {
    "compile": WorkerMode("kernel_hub.tpu.compile_gate.compile_worker", "run_compile"),
}


def mode_for(request: JsonDict, modes: Mapping[str, WorkerMode], worker: str) -> WorkerMode:
    """The table entry that serves `request` (pure).

    Args:
        request: the worker's request; its "mode" is looked up.
        modes: the worker's table.
        worker: the worker's module name, for the error.

    Returns:
        The mode's entry.

    Raises:
        UnknownModeError: the mode is missing or not in `modes` (the message names the ones served).
    """
    mode = request.get("mode")
    if isinstance(mode, str) and mode in modes:
        return modes[mode]
    raise UnknownModeError(f"unknown mode {mode!r} for the TPU worker {worker}: it serves {', '.join(sorted(modes))}")


def versions() -> dict[str, str | None]:
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    # libtpu ships as libtpu (jax[tpu], torch-tpu) or, on nightly installs, libtpu-nightly: same compiler either way.
    return {"jax": version("jax"), "libtpu": version("libtpu") or version("libtpu-nightly")}


def serve(argv: list[str], modes: Mapping[str, WorkerMode], worker: str) -> int:
    """Run one request with the function its mode names in `modes`.

    Args:
        argv: [program, REQUEST.json, EVENTS.jsonl].
        modes: the worker's table.
        worker: the worker's module name, for the unknown-mode message.

    Returns:
        The mode function's exit status ("done" is appended to the events when it is 0). An unknown mode exits with
        status 1 and its one-line message, after the "hello" event.
    """
    request = json.loads(Path(argv[1]).read_text())
    events_path = Path(argv[2])

    lock = threading.Lock()  # the heartbeat thread writes too: one whole line at a time

    def emit(record: JsonDict) -> None:  # one line per event, flushed: a crash loses nothing written
        with lock, events_path.open("a") as events:
            events.write(json.dumps(record) + "\n")

    emit({"event": "hello", **versions()})
    try:
        run = mode_for(request, modes, worker).load()
    except UnknownModeError as exc:
        raise SystemExit(str(exc)) from None
    status = run(request, emit)
    if status == 0:
        emit({"event": "done"})
    return status


def main(argv: list[str]) -> int:
    return serve(argv, MODES, "kernel_hub.tpu.worker")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
