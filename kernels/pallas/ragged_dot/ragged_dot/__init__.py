"""ragged_dot: grouped matmul (ragged dot) for Mixture-of-Experts layers, JAX entry.

A Pallas TPU kernel (megablox-style group metadata by scalar prefetch), a fast CPU path in plain XLA,
and jax.lax.ragged_dot as oracle / GPU path, behind one function. This package never imports kernel_hub.
"""

from .api import (
    IMPLEMENTATIONS,
    implementations_for,
    last_implementation,
    ragged_dot,
    resolve_implementation,
)
from .config import RaggedDotConfig, default_config
from .reference import reference_ragged_dot

__all__ = [
    "IMPLEMENTATIONS",
    "RaggedDotConfig",
    "default_config",
    "implementations_for",
    "last_implementation",
    "ragged_dot",
    "reference_ragged_dot",
    "resolve_implementation",
]
