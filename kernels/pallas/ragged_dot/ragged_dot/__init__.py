"""ragged_dot: grouped matmul (ragged dot) for Mixture-of-Experts layers, JAX entry.

A Pallas TPU kernel (megablox-style group metadata by scalar prefetch), a fast CPU path in plain XLA,
and jax.lax.ragged_dot as oracle / GPU path, behind one function with kernel-hub's kernel contract
(docs/kernel-contract.md). This package never imports kernel_hub; `_vendor/` holds the shared code
kernel-hub vendors into it (kernel.yaml `vendor`).
"""

from ._vendor.interpret import RaceDetectedError, race_checking_params, races_found, run_race_checked
from ._vendor.ragged_reference import reference_ragged_dot
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    implementations_for,
    last_implementation,
    ragged_dot,
    resolve_implementation,
)
from .config import RaggedDotConfig, default_config

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "RaceDetectedError",
    "RaggedDotConfig",
    "default_config",
    "implementations_for",
    "last_implementation",
    "race_checking_params",
    "races_found",
    "ragged_dot",
    "reference_ragged_dot",
    "resolve_implementation",
    "run_race_checked",
]
