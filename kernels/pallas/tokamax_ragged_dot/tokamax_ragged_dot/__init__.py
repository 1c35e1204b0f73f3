"""tokamax_ragged_dot: Tokamax's ragged dot (grouped matmul) published through kernel-hub, JAX entry.

Same contract as kernel-hub/ragged-dot-tpu (docs/kernel-contract.md). On TPU and GPU it runs tokamax.ragged_dot
(Mosaic, Triton, XLA, in a declared order); on CPU Tokamax only has "xla", which densifies to G x the work, so the
CPU default is kernel-hub's own grouped matmul ("hub_cpu", vendored shared code), reported as such. This package
never imports kernel_hub.
"""

from ._vendor.ragged_reference import reference_ragged_dot
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    implementations_for,
    last_implementation,
    ragged_dot,
    resolve_implementation,
)

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "implementations_for",
    "last_implementation",
    "ragged_dot",
    "reference_ragged_dot",
    "resolve_implementation",
]
