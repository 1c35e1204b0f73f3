"""Layer classes in Hugging Face kernels' convention (`kernels.kernelize` with a LayerRepository pointing here):
none, on purpose, and this module says why so that HF kernels reports "Layer `NAME` not found" instead of "does not
define any layers".

transformers 5.24 marks one attention layer with a hub name, "MultiScaleDeformableAttention" (Deformable DETR and
its copies): bilinear sampling of multi-scale feature maps at learned offsets, which is not softmax(QK^T)V and which
this kernel does not compute, so serving it would mean wrong numbers. Its attention layers (LlamaAttention and the
rest) carry no hub name: they call an attention *function* through transformers' AttentionInterface, and
transformers' own hook for a hub attention kernel (`attn_implementation="org/repo:function"`) takes a function, not
a layer: this build's `attention_forward` (hf_attention.py) is that function, and kernel-hub's `kh.kernelize` serves
the same path with per-layer validation and per-call fallback.
"""

from __future__ import annotations

__all__: list[str] = []
