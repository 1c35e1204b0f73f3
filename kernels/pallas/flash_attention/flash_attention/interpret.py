"""Running the Pallas kernels off-TPU: which interpret mode, and turning a detected race into an error.

`interpret=True` is Pallas' fast functional interpreter. `tpu_interpret_params()` is the TPU simulator
(memory spaces, DMAs, semaphores) with the race detector on and uninitialised memory filled with NaN, so
a read of a never-written buffer poisons the result. The detector only records races (and prints them);
`raise_if_races()` makes them fail loudly.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu


def tpu_interpret_params(seed: int | None = 0, num_cores: int = 2) -> pltpu.InterpretParams:
    """TPU interpret mode with race detection, NaN-filled fresh memory, shuffled parallel grid axes, and
    `num_cores` simulated TensorCores (v4/v5p/v7x megacore split the parallel axes: two cores writing one
    block is a race the detector sees)."""
    return pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan", random_seed=seed,
                                 num_cores_or_threads=num_cores)


def resolve_interpret(interpret: Any) -> Any:
    """None means compile for the TPU when on one, else the fast interpreter."""
    if interpret is None:
        return jax.default_backend() != "tpu"
    return interpret


def races_found() -> bool:
    """Whether the last TPU-interpreted kernel saw a race (jax keeps this in interpreter-global state)."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    except ImportError:  # pragma: no cover - layout of a future jax
        return False
    state = getattr(ipc, "races", None)
    return bool(state is not None and state.races_found)


def raise_if_races(interpret: Any, result: Any) -> Any:
    """After an eager TPU-interpret call with detection on: wait for it and raise if it raced."""
    if not isinstance(interpret, pltpu.InterpretParams) or not interpret.detect_races:
        return result
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(result)):
        return result  # inside someone's jit: the caller checks races_found() after running it
    jax.block_until_ready(result)
    if races_found():
        pltpu.reset_tpu_interpret_mode_state()
        raise RuntimeError("TPU interpret mode detected a data race in the attention kernel")
    return result
