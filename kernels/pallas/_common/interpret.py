"""How a Pallas implementation runs, and race checks that fail loudly.

`interpret=` on every entry with Pallas implementations:
  None                     compile with Mosaic on a TPU, Pallas' fast interpreter anywhere else;
  True                     the fast interpreter (a functional check);
  pltpu.InterpretParams    the TPU simulator (memory spaces, DMAs, semaphores; with `detect_races` a race detector);
  False                    always lower to Mosaic, even on a host without a TPU (ahead-of-time TPU compiles).

jax 0.10 records detected races in interpreter-global state with no public accessor, and leaves simulator state
behind after an exception. `races_found()` raises RaceStateUnavailableError when that state cannot be read (a jax
whose internals moved, or no simulated run since the last reset): a check that did not run never reads as clean.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu

from .dispatch import Dispatch
from .platform import platform_of

_RACE_STATE_MODULE = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"


class RaceDetectedError(RuntimeError):
    """The TPU simulator saw a data race while running a kernel."""


class RaceStateUnavailableError(RuntimeError):
    """The TPU simulator's race record cannot be read, so no verdict can be given."""


def resolve_interpret(interpret: Any, platform: str) -> Any:
    """The `interpret` value a Pallas call gets on `platform` (see the module docstring)."""
    if interpret is None:
        return platform != "tpu"
    return interpret


def describe_interpret(interpret: Any, platform: str) -> str:
    """How a Pallas implementation runs with this `interpret` on `platform`, for dispatch traces."""
    mode = resolve_interpret(interpret, platform)
    if mode is False:
        return f"compiled by Mosaic (platform {platform})"
    if mode is True:
        return f"interpreted (fast interpreter, platform {platform})"
    races = " with race detection" if getattr(mode, "detect_races", False) else ""
    return f"interpreted (TPU simulator{races}, platform {platform})"


def pallas_remark(name: str, platform: str, interpret: Any) -> str | None:
    """A Dispatch `remark` for kernels whose Pallas implementation is called "pallas": how it runs, else nothing."""
    return describe_interpret(interpret, platform) if name == "pallas" else None


def race_checking_params(seed: int | None = 0, num_cores: int = 2) -> pltpu.InterpretParams:
    """The TPU simulator with the race detector on, NaN-filled fresh memory (a read of a never-written buffer
    poisons the result), shuffled parallel grid axes and `num_cores` TensorCores (v4/v5p/v7x megacore split
    parallel axes across two: two cores writing one block is a race the detector sees)."""
    return pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan", random_seed=seed,
                                 num_cores_or_threads=num_cores)


def races_found() -> bool:
    """Whether a TPU-simulated kernel saw a race since the last reset; raises RaceStateUnavailableError when the
    simulator's record cannot be read."""
    try:
        module = importlib.import_module(_RACE_STATE_MODULE)
    except ImportError as exc:
        raise RaceStateUnavailableError(f"this jax has no {_RACE_STATE_MODULE}: cannot tell whether races ran") from exc
    state = getattr(module, "races", None)
    flag = getattr(state, "races_found", None)
    if not isinstance(flag, bool):
        raise RaceStateUnavailableError(
            "no TPU-simulator race record to read (no simulated kernel ran since the last reset, or jax's "
            "interpreter changed): cannot report a clean run"
        )
    return flag


def _detects_races(interpret: Any) -> bool:
    return isinstance(interpret, pltpu.InterpretParams) and bool(interpret.detect_races)


def race_checked(interpret: Any, args: Any, fn: Callable[[], Any], what: str) -> Any:
    """fn(), and when `interpret` runs the race detector on concrete `args`: a fresh simulator before, a wait and
    a RaceDetectedError after a race. Traced calls (under jit or grad) are checked by the caller, around the whole
    computation, with `run_race_checked`."""
    if not _detects_races(interpret) or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        return fn()
    return run_race_checked(fn, what=what)


def run_race_checked(fn: Callable[..., Any], *args: Any, what: str = "the kernel", **kwargs: Any) -> Any:
    """fn(*args, **kwargs) on a fresh simulator, waited for; RaceDetectedError if the race detector fired."""
    pltpu.reset_tpu_interpret_mode_state()
    try:
        out = jax.block_until_ready(fn(*args, **kwargs))
        raced = races_found()
    except BaseException:
        pltpu.reset_tpu_interpret_mode_state()
        raise
    if raced:
        pltpu.reset_tpu_interpret_mode_state()
        raise RaceDetectedError(f"TPU interpret mode detected a data race in {what}")
    return out


def run_dispatch(dispatch: Dispatch, implementation: Any, interpret: Any, operands: Any,
                 run: Callable[[str, Any], Any], what: str) -> Any:
    """`dispatch` over the platform where `operands` live, the contract's interpret policy applied: run(name,
    mode) gets the resolved interpret mode for "pallas" (race checked when it detects races) and False otherwise."""
    platform = platform_of(operands)

    def call(name: str) -> Any:
        if name != "pallas":
            return run(name, False)
        mode = resolve_interpret(interpret, platform)
        return race_checked(mode, operands, lambda: run(name, mode), what)

    return dispatch.run(platform, implementation, interpret, call)
