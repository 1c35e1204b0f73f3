"""The compile worker: runs inside the TPU environment (jax + libtpu), never in the main process.

    python -m kernel_hub.tpu.worker REQUEST.json EVENTS.jsonl

Generic over kernels: it imports the kernel package through kernel_hub's verified loader, with the digests the
parent verified (package.py: a file changed since is refused before anything runs), takes
`<pkg>.tpu_cases.compile_cases()`,
and for each generation and case builds (function, abstract args), lowers for a mock TPU device of that
generation and compiles with libtpu (Mosaic compiles every Pallas kernel inside). Each finished case is one
JSON line appended to EVENTS (a "start" line first), so a compiler crash costs only the case it hit: the
runner sees which case started and did not finish.

Request: {"mode": "compile", "package": VerifiedPackage.request(), "generations": [...],
          "cases": [names] | null, "tags": [tags] | null}  or  {"mode": "model", ...} (see model_worker.py).
A refused package is one "refused" event (kind "integrity" or "import", one line) and exit status 3.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

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


def load_package(package: dict[str, Any] | str | Path, entry: str = "__init__.py") -> Any:
    """Import a kernel package through kernel_hub's verified loader: a request's package (a dict: checked against
    the digests the parent verified, so a file changed since, or not among them, is refused before any of the
    package runs), or a package folder on this machine (hashed now, `entry` as its __init__)."""
    from .package import from_request, import_verified, local_package

    return import_verified(from_request(package) if isinstance(package, dict) else local_package(Path(package), entry))


class MoeKernel(NamedTuple):
    """A request's ragged_dot package with the MoE geometries it vendors (the model workers' common start)."""

    rd: Any  # the package, imported through the verified loader
    shapes: Any  # its _vendor.moe_shapes module (MOE_MODELS, PHASES)
    geos: dict[str, Any]  # model name -> geometry


def load_moe_kernel(package: dict[str, Any] | str | Path) -> MoeKernel:
    """load_package of a ragged_dot package, with its MoE geometries by model name; raises as load_package does."""
    rd = load_package(package)
    shapes = importlib.import_module(f"{rd.__name__}._vendor.moe_shapes")
    return MoeKernel(rd, shapes, {g.model: g for g in shapes.MOE_MODELS})


def compile_cases_of(package: Any) -> list[Any]:
    return list(importlib.import_module(f"{package.__name__}.tpu_cases").compile_cases())


def implementation_of(package: Any) -> str | None:
    """The implementation the last call through the kernel's dispatch ran (the kernel contract's
    `last_implementation()`): what a case that lets the wrapper choose actually compiled."""
    last = getattr(package, "last_implementation", None)
    try:
        name = last()[0] if callable(last) else None
    except Exception:  # a kernel without the contract's hook: nothing to report
        return None
    return name if isinstance(name, str) else None


@contextlib.contextmanager
def tpu_target(generation: str) -> Iterator[Any]:
    """Make the mock TPU device of `generation` the place everything lowers for; yields the device.

    Pallas' TPU lowering reads the default device's kind, and the kernels' dispatch asks
    jax.default_backend(), which stays "cpu" when compiling for a mock TPU: both are pointed at the TPU
    here. (Once every kernel lowers to Mosaic for interpret=False on any backend, the second is moot.)
    """
    import jax

    from .chips import chip
    from .schedule import tpu_dispatch

    device = topology_devices(chip(generation).topology)[0]
    with tpu_dispatch(), jax.default_device(device):
        yield device


@functools.cache
def topology_devices(name: str) -> tuple[Any, ...]:
    """The devices of a mock TPU topology, made once per process (every case of a generation compiles for it)."""
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)


def on_device(args: Any, device: Any) -> Any:
    """Abstract arguments placed on `device` (ShapeDtypeStructs keep shape and dtype)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)


def compile_one(case: Any, device: Any, package: Any = None) -> dict[str, Any]:
    """Lower and compile one case; the compiler's refusal is a failed result, never an exception."""
    import jax

    start, cpu = time.perf_counter(), time.process_time()  # wall, and CPU of every thread (contention-proof)
    try:
        fn, args = case.build()
        lowered = jax.jit(fn).lower(*on_device(args, device))
        implementation = implementation_of(package)
        compiled = lowered.compile()
    except Exception as exc:  # the compiler's message is the result
        text = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        return {"passed": False, "error": first_meaningful_line(text), "compile_seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu, "implementation": implementation_of(package)}
    return {"passed": True, "error": None, "compile_seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu, "implementation": implementation, **memory_bytes(compiled)}


def memory_bytes(compiled: Any) -> dict[str, int]:
    """The compiler's argument, output and temporary bytes of a compiled program (none when it reports none)."""
    mem = compiled.memory_analysis()
    if mem is None:
        return {}
    return {"argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": int(mem.output_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes)}


def refuse(exc: BaseException, emit: Any) -> int:
    """Report a package the worker will not run (one line) and the exit status that ends the request."""
    from ..errors import IntegrityError

    kind = "integrity" if isinstance(exc, IntegrityError) else "import"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    emit({"event": "refused", "kind": kind, "error": text[:400]})
    return 3


def run_compile(request: dict[str, Any], emit: Any) -> int:
    from ..errors import KernelHubError

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
                result = compile_one(case, device, package)
                emit({"event": "result", "generation": generation, "name": case.name, "dtype": case.dtype,
                      "tags": list(case.tags), **result})
    return 0


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
        status = run_compile(request, emit)
    elif request["mode"] == "model":
        from .model_worker import run_model

        status = run_model(request, emit)
    elif request["mode"] == "quant_model":
        from .model_quant import run_quant_model

        status = run_quant_model(request, emit)
    elif request["mode"] == "calibration":
        from .calibration_worker import run_calibration

        status = run_calibration(request, emit)
    elif request["mode"] == "peers":
        from .peers_worker import run_peers

        status = run_peers(request, emit)
    elif request["mode"] == "mesh":
        from .mesh_worker import run_mesh

        status = run_mesh(request, emit)
    else:
        raise SystemExit(f"unknown mode {request['mode']!r}")
    if status == 0:
        emit({"event": "done"})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
