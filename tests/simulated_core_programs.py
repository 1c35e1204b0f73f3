"""The TPU simulator's per-core programs, compiled once per test module instead of once per core per call.

jax 0.10.2's TPU interpret mode (`pltpu.InterpretParams` with more than one core, as `race_checking_params` gives)
runs each simulated call's cores as an io_callback that starts one thread per core, and each thread traces, lowers
and compiles the core's program afresh (`thread_map._run_jaxpr`: a new `jax.jit` of a new function each time, so no
JAX cache ever hits), runs it once and drops it. So every simulated call costs two compiles of its largest program,
made on two threads at once, and frees both executables on those threads while the other may still be compiling.

Here `_run_jaxpr` keeps, per core program (the jaxpr object, the argument types and the CPU optimisation setting),
the executable the first thread compiled; the cores of that call and every later call of the same traced kernel
run it. What runs is unchanged: the same jaxpr, traced, lowered and compiled the same way, called with the same
arguments on the same per-core threads at once, so the simulator's memory model, its race detector and its shuffled
grid see what they saw before. The executables are released by `clear()` on the main thread at the end of each
test module (conftest.py), when no simulated call is running.
"""

from __future__ import annotations

import threading
from typing import Any

_programs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_lock = threading.Lock()
_installed = False


def _run(jaxpr: Any, consts: Any, *args: Any) -> None:
    from jax import core as jax_core

    jax_core.eval_jaxpr(jaxpr, consts, *args)


def _run_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> None:
    """thread_map._run_jaxpr (compile jax.jit(_run, static_argnums=(0,)) for these arguments, then call it), with
    the executable kept per (jaxpr, argument types, optimisation setting)."""
    import jax

    key = (id(jaxpr), len(consts), tuple(jax.typeof(x) for x in (*consts, *args)),
           jax.config.read("jax_disable_most_optimizations"))
    with _lock:  # one compile per program: the other core's thread waits for it instead of compiling it again
        entry = _programs.get(key)
        if entry is None:
            traced = jax.jit(_run, static_argnums=(0,)).trace(jaxpr, consts, *args)
            entry = _programs[key] = (jaxpr, traced.lower().compile())  # the jaxpr held: its id stays its own
    entry[1](consts, *args)


def install() -> None:
    """Route jax's TPU-simulator core threads through _run_jaxpr (once per process; jax 0.10.2 only, the version
    whose thread_map this replaces)."""
    global _installed
    if _installed:
        return
    import jax

    _installed = True
    if jax.__version__ != "0.10.2":  # the jax read above; another one keeps its own behaviour
        return
    from jax._src.pallas.mosaic.interpret import thread_map

    thread_map._run_jaxpr = _run_jaxpr


def clear() -> None:
    """Release the kept executables (call it where no simulated kernel is running)."""
    with _lock:
        _programs.clear()
