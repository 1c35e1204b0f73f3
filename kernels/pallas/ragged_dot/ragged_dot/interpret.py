"""TPU interpret mode with race detection: run a Pallas call under a simulated TPU and fail on races.

jax 0.10 reports detected races by printing and setting `races.races_found` in its interpret module
(there is no public accessor yet), and leaves simulator state behind after an exception, which must be
reset before the next interpreted kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu


class RaceDetectedError(RuntimeError):
    """The TPU interpreter saw a data race while running the kernel."""


def race_checking_params(seed: int = 0) -> pltpu.InterpretParams:
    """Simulated TPU: NaN-filled uninitialised memory, randomised parallel axes, race detector on."""
    return pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan", random_seed=seed)


def races_found() -> bool:
    """Whether the last TPU-interpreted kernel reported a race."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as _ipc
    except ImportError as e:  # a jax without the module: cannot tell, so do not claim a clean run
        raise RuntimeError("this jax does not expose TPU interpret race state") from e
    state = getattr(_ipc, "races", None)
    return bool(state is not None and state.races_found)


def run_race_checked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), waited for; raises RaceDetectedError if the interpreter found a race."""
    pltpu.reset_tpu_interpret_mode_state()
    try:
        out = jax.block_until_ready(fn(*args, **kwargs))
    except BaseException:
        pltpu.reset_tpu_interpret_mode_state()
        raise
    if races_found():
        pltpu.reset_tpu_interpret_mode_state()
        raise RaceDetectedError("TPU interpret mode detected a data race in the ragged_dot kernel")
    return out
