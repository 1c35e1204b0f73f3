"""What every mode of the TPU worker (worker.py) does the same way, whichever side it serves: import the kernel
package through the verified loader, report a package it will not run, and read the compiler's message and memory.
Runs in the TPU environment only.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    import jax

    from ..json_types import JsonDict

#: Where a worker mode writes its events: one JSON object per event, in order.
Emit: TypeAlias = "Callable[[JsonDict], None]"

_NOISE = ("Traceback", "The above exception", "---", "For simplicity", "jax._src", "File ", "During handling")


def first_meaningful_line(text: str) -> str:
    """The compiler's message without the wrapping: first line that says something, common prefixes off."""
    lines = [raw.strip() for raw in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(_NOISE)]
    for i, line in enumerate(lines):
        line = re.sub(r"^(jaxlib\.\S+|jax\.errors\.\S+|XlaRuntimeError|JaxRuntimeError)[:]\s*", "", line)
        line = re.sub(r"^(INTERNAL|INVALID_ARGUMENT|UNIMPLEMENTED|RESOURCE_EXHAUSTED|UNKNOWN):\s*", "", line)
        if line.endswith(":") and i + 1 < len(lines):  # "E1001: CompileTimeScopedVmemOom:" + the detail line
            line = f"{line} {lines[i + 1]}"
        return line[:300]
    return text.strip()[:300]


def load_package(package: JsonDict | str | Path, entry: str = "__init__.py") -> ModuleType:
    """Import a kernel package through kernel_hub's verified loader: a request's package (a dict: checked against
    the digests the parent verified, so a file changed since, or not among them, is refused before any of the
    package runs), or a package folder on this machine (hashed now, `entry` as its __init__)."""
    from .package import from_request, import_verified, local_package

    return import_verified(from_request(package) if isinstance(package, dict) else local_package(Path(package), entry))


def memory_bytes(compiled: jax.stages.Compiled) -> dict[str, int]:
    """The compiler's argument, output and temporary bytes of a compiled program (none when it reports none)."""
    mem = compiled.memory_analysis()
    if mem is None:
        return {}
    return {"argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": int(mem.output_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes)}


def refuse(exc: BaseException, emit: Emit) -> int:
    """Report a package the worker will not run (one line) and the exit status that ends the request."""
    from ..errors import IntegrityError

    kind = "integrity" if isinstance(exc, IntegrityError) else "import"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    emit({"event": "refused", "kind": kind, "error": text[:400]})
    return 3


#: Seconds between "working" events while one step (a compile) runs: the client stops a worker that writes nothing
#: for its stall limit (worker_client.STALL_ENV), and one compile of a large Mosaic kernel can take minutes.
HEARTBEAT_SECONDS = 30.0


@contextlib.contextmanager
def working(emit: Emit, what: JsonDict, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Around one long step: a "working" event (with `what` and the seconds so far) every `every` seconds until it
    returns, so a slow compile is not taken for a hung worker; outside such a step nothing is written, so a worker
    that hangs anywhere else is still stopped at the stall limit."""
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            emit({"event": "working", **what, "seconds": round(time.monotonic() - start, 1)})

    thread = threading.Thread(target=beat, name="kernel-hub-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
