"""Flash attention for TPU (Pallas) with fast CPU and portable XLA paths; see README.md.

Prefill: `flash_attention(q[B,Hq,Sq,D], k[B,Hkv,Skv,D], v, ...)`, differentiable. Decode:
`decode_attention(q[B,Hq,D], k_cache[B,Hkv,S,D], v_cache, kv_lengths[B], ...)`. Reference:
`reference_attention(...)` in NumPy float64.
"""

from .api import decode_attention, flash_attention, implementations_for
from .config import AttentionConfig, default_config
from .interpret import races_found, tpu_interpret_params
from .reference import reference_attention, reference_decode_attention

__all__ = [
    "AttentionConfig",
    "decode_attention",
    "default_config",
    "flash_attention",
    "implementations_for",
    "races_found",
    "reference_attention",
    "reference_decode_attention",
    "tpu_interpret_params",
]
