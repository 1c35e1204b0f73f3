"""Flash attention for TPU (Pallas) with fast CPU and portable XLA paths; see README.md.

Prefill: `flash_attention(q[B,Hq,Sq,D], k[B,Hkv,Skv,D], v, ...)`, differentiable. Decode:
`decode_attention(q[B,Hq,D], k_cache[B,Hkv,S,D], v_cache, kv_lengths[B], ...)`. Reference:
`reference_attention(...)` in NumPy float64. Serving: `ragged_paged_attention(queries, keys, values, k_cache,
v_cache, kv_lens, page_indices, cu_q_lens, num_seqs)` over a paged KV cache (prefill and decode mixed, the cache
update inside; reference: `reference_ragged_paged_attention`), and `ragged_paged_attention_v3` with vLLM TPU's
argument order and fused cache layout. Both entries keep kernel-hub's kernel contract
(docs/kernel-contract.md); `_vendor/` holds the shared code kernel-hub vendors in (kernel.yaml `vendor`).
"""

from ._vendor.attention_reference import reference_attention, reference_decode_attention
from ._vendor.interpret import RaceDetectedError, race_checking_params, races_found, run_race_checked
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    decode_attention,
    flash_attention,
    implementations_for,
    last_implementation,
    resolve_implementation,
)
from .config import AttentionConfig, default_config
from .paged import last_tuning, ragged_paged_attention
from .paged_reference import reference_ragged_paged_attention
from .paged_v3 import ragged_paged_attention_v3

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "AttentionConfig",
    "RaceDetectedError",
    "decode_attention",
    "default_config",
    "flash_attention",
    "implementations_for",
    "last_implementation",
    "last_tuning",
    "race_checking_params",
    "races_found",
    "ragged_paged_attention",
    "ragged_paged_attention_v3",
    "reference_attention",
    "reference_decode_attention",
    "reference_ragged_paged_attention",
    "resolve_implementation",
    "run_race_checked",
]
