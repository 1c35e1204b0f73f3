"""The compile mode of the TPU worker (worker.py's "compile"): runs inside the TPU environment (jax + libtpu),
never in the main process.

Generic over kernels: it imports the kernel package through kernel_hub's verified loader, with the digests the
parent verified (package.py: a file changed since is refused before anything runs), takes
`<pkg>.tpu_cases.compile_cases()`, and for each generation and case builds (function, abstract args), lowers for a
mock TPU device of that generation and compiles with libtpu (Mosaic compiles every Pallas kernel inside). Each
finished case is one event (a "start" event first), so a compiler crash costs only the case it hit: the worker pool
(worker_pool.py) sees which case started and did not finish.
"""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Protocol

from ..target import on_device, tpu_target
from ..worker_common import first_meaningful_line, load_package, memory_bytes, refuse, working

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    import jax

    from ...json_types import JsonDict
    from ..worker_common import Emit


class CompileCase(Protocol):
    """One case a kernel package's `tpu_cases.compile_cases()` lists: `build()` gives (function, abstract args)."""

    name: str
    dtype: str
    tags: tuple[str, ...]
    build: Callable[[], tuple[Callable[..., object], tuple[jax.ShapeDtypeStruct | jax.Array, ...]]]


def compile_cases_of(package: ModuleType) -> list[CompileCase]:
    return list(importlib.import_module(f"{package.__name__}.tpu_cases").compile_cases())


def implementation_of(package: ModuleType | None) -> str | None:
    """The implementation the last call through the kernel's dispatch ran (the kernel contract's
    `last_implementation()`): what a case that lets the wrapper choose actually compiled."""
    last = getattr(package, "last_implementation", None)
    try:
        name = last()[0] if callable(last) else None
    except Exception:  # a kernel without the contract's hook: nothing to report
        return None
    return name if isinstance(name, str) else None


def tuning_of(package: ModuleType | None, clear: bool = False) -> str | None:
    """The tuned-table entry (or other source of its blocks) the kernel's last call used, where the kernel reports
    one (`last_tuning(clear)`); None otherwise."""
    last = getattr(package, "last_tuning", None)
    try:
        text = last(clear) if callable(last) else None
    except Exception:  # a kernel whose hook fails: nothing to report
        return None
    return text if isinstance(text, str) else None


def compile_one(case: CompileCase, device: jax.Device, package: ModuleType | None = None) -> JsonDict:
    """Lower and compile one case; the compiler's refusal is a failed result, never an exception."""
    import jax

    start, cpu = time.perf_counter(), time.process_time()  # wall, and CPU of every thread (contention-proof)
    tuning_of(package, clear=True)
    try:
        fn, args = case.build()
        lowered = jax.jit(fn).lower(*on_device(args, device))
        implementation = implementation_of(package)
        compiled = lowered.compile()
    except Exception as exc:  # the compiler's message is the result
        text = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        return {"passed": False, "error": first_meaningful_line(text), "compile_seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu, "implementation": implementation_of(package),
                "tuning": tuning_of(package)}
    return {"passed": True, "error": None, "compile_seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu, "implementation": implementation, "tuning": tuning_of(package),
            **memory_bytes(compiled)}


def run_compile(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "compile", "package": VerifiedPackage.request(), "generations": [...],
    "cases": [names] | null, "tags": [tags] | null}; a "cases" event, then "start" and "result" per case."""
    from ...errors import KernelHubError

    try:
        package = load_package(request["package"])
        cases = compile_cases_of(package)
    except KernelHubError as exc:
        return refuse(exc, emit)
    except Exception as exc:  # the verified tpu_cases.py itself fails to import
        return refuse(exc if str(exc) else RuntimeError(type(exc).__name__), emit)
    wanted, tags = request.get("cases"), request.get("tags")
    if wanted is not None:
        cases = [c for c in cases if c.name in set(wanted)]
    if tags:
        cases = [c for c in cases if set(tags) & set(c.tags)]
    emit({"event": "cases", "names": [c.name for c in cases]})
    for generation in request["generations"]:
        with tpu_target(generation) as device:
            for case in cases:
                emit({"event": "start", "generation": generation, "name": case.name})
                with working(emit, {"generation": generation, "name": case.name}):
                    result = compile_one(case, device, package)
                emit({"event": "result", "generation": generation, "name": case.name, "dtype": case.dtype,
                      "tags": list(case.tags), **result})
    return 0
