"""tokamax_attention: Tokamax's dot_product_attention published through kernel-hub, JAX entry.

Same contract as kernel-hub/flash-attention-tpu (q[B,Hq,Sq,D], bottom-right causal, sliding window,
logits soft-cap, per-sequence lengths; no attention sinks). Mosaic on TPU, Triton or Mosaic on GPU,
Tokamax's xla / xla_chunked on CPU. This package never imports kernel_hub.
"""

from .api import (
    IMPLEMENTATIONS,
    ORDER,
    decode_attention,
    flash_attention,
    implementations_for,
    last_implementation,
    resolve_implementation,
)
from .reference import reference_attention, reference_decode_attention

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
