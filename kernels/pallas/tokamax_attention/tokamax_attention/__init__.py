"""tokamax_attention: Tokamax's dot_product_attention published through kernel-hub, JAX entry.

Same contract as kernel-hub/flash-attention-tpu (q[B,Hq,Sq,D], bottom-right causal, sliding window,
logits soft-cap, per-sequence lengths; no attention sinks). Mosaic on TPU, Triton or Mosaic on GPU,
Tokamax's xla / xla_chunked on CPU. Kernel contract: docs/kernel-contract.md. This package never imports
kernel_hub; `_vendor/` holds the shared code kernel-hub vendors in (kernel.yaml `vendor`).
"""

from ._vendor.attention_reference import reference_attention, reference_decode_attention
from .api import (
    IMPLEMENTATIONS,
    ORDER,
    decode_attention,
    flash_attention,
    implementations_for,
    last_implementation,
    resolve_implementation,
)

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "decode_attention",
    "flash_attention",
    "implementations_for",
    "last_implementation",
    "reference_attention",
    "reference_decode_attention",
    "resolve_implementation",
]
