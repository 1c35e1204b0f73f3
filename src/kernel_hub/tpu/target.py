"""The mock TPU device everything lowers for, in the TPU environment: shared by the compile gate and the cost model.

libtpu compiles for a mock topology of a generation (chips.py); jax must lower for that device, and the kernels'
dispatch (which asks jax.default_backend()) must pick its TPU path while tracing, though the process has no TPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from .chips import chip

if TYPE_CHECKING:
    import jax

T = TypeVar("T")


@contextlib.contextmanager
def tpu_dispatch(generation: str | None = None) -> Iterator[None]:
    """Kernels that pick their path from jax.default_backend() pick the TPU one while tracing for a TPU; with a
    generation, Pallas' own chip queries (tpu_info.get_device_kind, which pltpu.emit_pipeline asks while
    tracing) answer for that chip, so the trace needs no TPU device (chip facts injected, not asked)."""
    import jax
    from jax._src.pallas.mosaic import tpu_info

    saved = jax.default_backend, tpu_info.get_device_kind, tpu_info.get_num_device_cores
    jax.default_backend = lambda: "tpu"
    if generation is not None:
        kind = chip(generation).device_kind
        tpu_info.get_device_kind = lambda: kind
        tpu_info.get_num_device_cores = lambda: 1
    try:
        yield
    finally:
        jax.default_backend, tpu_info.get_device_kind, tpu_info.get_num_device_cores = saved


@functools.cache
def topology_devices(name: str) -> tuple[jax.Device, ...]:
    """The devices of a mock TPU topology, made once per process (every case of a generation compiles for it)."""
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)


@contextlib.contextmanager
def tpu_target(generation: str) -> Iterator[jax.Device]:
    """Make the mock TPU device of `generation` the place everything lowers for; yields the device.

    Pallas' TPU lowering reads the default device's kind, and the kernels' dispatch asks
    jax.default_backend(), which stays "cpu" when compiling for a mock TPU: both are pointed at the TPU
    here. (Once every kernel lowers to Mosaic for interpret=False on any backend, the second is moot.)
    """
    import jax

    device = topology_devices(chip(generation).topology)[0]
    with tpu_dispatch(), jax.default_device(device):
        yield device


def on_device(args: T, device: jax.Device) -> T:
    """Abstract arguments placed on `device` (ShapeDtypeStructs keep shape and dtype)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
