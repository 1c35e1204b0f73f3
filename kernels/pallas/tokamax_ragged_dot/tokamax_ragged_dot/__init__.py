"""tokamax_ragged_dot: Tokamax's ragged dot (grouped matmul) published through kernel-hub, JAX entry.

Same contract as kernel-hub/ragged-dot-tpu. On TPU and GPU it runs tokamax.ragged_dot (Mosaic, Triton,
XLA, in a declared order); on CPU Tokamax only has "xla", which densifies to G x the work, so the CPU
default is kernel-hub's own grouped matmul (_hub_cpu, shared with ragged-dot-tpu), reported as such.
This package never imports kernel_hub.
"""

from .api import (
    IMPLEMENTATIONS,
    ORDER,
    implementations_for,
    last_implementation,
    ragged_dot,
    resolve_implementation,
)
from .reference import reference_ragged_dot

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "implementations_for",
    "last_implementation",
    "ragged_dot",
    "reference_ragged_dot",
    "resolve_implementation",
]
