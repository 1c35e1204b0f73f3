"""ragged_dot: grouped matmul (ragged dot) for Mixture-of-Experts layers, JAX entry.

`moe_experts` is a whole Mixture-of-Experts expert block on it, on one device or expert-parallel over a mesh;
`moe_route` the router that feeds it (logits, top k, softmax over the k) in one call; `moe_routed_experts` both
as one op (one kernel at decode where nearly every expert is picked).
A Pallas TPU kernel (megablox-style group metadata by scalar prefetch), a fast CPU path in plain XLA,
and jax.lax.ragged_dot as oracle / GPU path, behind one function with kernel-hub's kernel contract
(docs/kernel-contract.md). This package never imports kernel_hub; `_vendor/` holds the shared code
kernel-hub vendors into it (kernel.yaml `vendor`).
"""

from ._vendor.interpret import RaceDetectedError, race_checking_params, races_found, run_race_checked
from ._vendor.moe_reference import reference_moe_experts
from ._vendor.ragged_reference import reference_ragged_dot
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    implementations_for,
    last_implementation,
    ragged_dot,
    resolve_implementation,
)
from .moe.experts import ACTIVATIONS, moe_device_work, moe_experts, partition_specs, plan_dispatch, plan_formulation
from .moe.plan import SCHEMES, MoeSizes, choose_scheme, collective_bytes, collectives, rows_per_device
from .moe.route import moe_route
from .moe.routed import moe_routed_experts, plan_routing
from .pallas.config import RaggedDotConfig, default_config

__all__ = [
    "ACTIVATIONS",
    "IMPLEMENTATIONS",
    "ORDER",
    "SCHEMES",
    "MoeSizes",
    "RaceDetectedError",
    "RaggedDotConfig",
    "choose_scheme",
    "collective_bytes",
    "collectives",
    "default_config",
    "implementations_for",
    "last_implementation",
    "moe_device_work",
    "moe_experts",
    "moe_route",
    "moe_routed_experts",
    "partition_specs",
    "plan_dispatch",
    "plan_formulation",
    "plan_routing",
    "race_checking_params",
    "races_found",
    "ragged_dot",
    "reference_moe_experts",
    "reference_ragged_dot",
    "resolve_implementation",
    "rows_per_device",
    "run_race_checked",
]
