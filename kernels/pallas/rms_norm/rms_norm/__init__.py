"""RMSNorm for TPU (Pallas) with an XLA path for CPU/GPU; see README.md.

`rms_norm(x[..., H], weight[H], *, eps, zero_centered=False, scale_after_cast=False)` normalises over the last
axis in float32 and returns x's dtype; differentiable in x and weight. `qk_norm_rope(qkv, q_weight, k_weight, cos,
sin, *, q_heads, kv_heads, eps, ...)` is the attention front of a q/k-normed model (per-head norms and the rotary
embedding of a fused projection's output) in one call; `attention_front(x, norm_weight, wqkv, ...)` runs the input
norm, the projection and qk_norm_rope (and the residual add) in one; `rope_tables` builds their tables. References:
`reference_rms_norm(...)`, `reference_qk_norm_rope(...)` in NumPy float64. The entry keeps kernel-hub's kernel
contract (docs/kernel-contract.md); `_vendor/` holds the shared code kernel-hub vendors in (kernel.yaml `vendor`).
"""

from ._vendor.interpret import RaceDetectedError, race_checking_params, races_found, run_race_checked
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    implementations_for,
    last_implementation,
    qk_norm_rope,
    resolve_implementation,
    rms_norm,
)
from .config import RMSNormConfig
from .front import attention_front
from .reference import reference_qk_norm_rope, reference_rms_norm, reference_rms_norm_grads
from .rope import rope_tables

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "RMSNormConfig",
    "RaceDetectedError",
    "attention_front",
    "implementations_for",
    "last_implementation",
    "qk_norm_rope",
    "race_checking_params",
    "races_found",
    "reference_qk_norm_rope",
    "reference_rms_norm",
    "reference_rms_norm_grads",
    "resolve_implementation",
    "rms_norm",
    "rope_tables",
    "run_race_checked",
]
