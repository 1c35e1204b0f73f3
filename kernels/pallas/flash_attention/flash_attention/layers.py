"""Layer classes in Hugging Face kernels' convention (`kernels.kernelize` with a LayerRepository pointing here):
none, on purpose, and this module says why so that HF kernels reports "Layer `NAME` not found" instead of "does not
define any layers".

transformers (5.24 and 5.25) marks one attention layer with a hub name, "MultiScaleDeformableAttention" (Deformable DETR
and its copies): bilinear sampling of multi-scale feature maps at learned offsets, which is not softmax(QK^T)V and which
this kernel does not compute, so serving it would mean wrong numbers. Its attention layers (LlamaAttention and the
rest) carry no hub name: they call an attention *function* through transformers' AttentionInterface, and
transformers' own hook for a hub attention kernel (`attn_implementation="org/repo"`) takes functions, not a layer:
this build's `flash_attn_func` / `flash_attn_varlen_func` (flash_attn_api.py) are those, and kernel-hub's
`kh.kernelize` serves the same layers with per-layer validation and per-call fallback.
"""

from __future__ import annotations

__all__: list[str] = []
