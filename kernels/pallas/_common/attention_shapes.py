"""Attention head geometries of real models: the shapes the TPU compile cases and kernel-hub's TPU cost model
use. Vendored into the attention kernels (kernel.yaml `vendor:`). Never imports kernel_hub.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HeadGeometry:
    model: str
    hq: int
    hkv: int
    d: int
    window: int | None = None
    sinks: bool = False


#: Query heads, kv heads, head dim (from the models' config.json). GPT-OSS-20B has attention sinks and a
#: 128-token window on every other layer; Gemma 4 26B-A4B alternates sliding layers (head dim 256) with
#: global ones (head dim 512, 2 kv heads).
ATTENTION_MODELS = (
    HeadGeometry("qwen3_30b_a3b", hq=32, hkv=4, d=128),
    HeadGeometry("gemma4_26b_a4b_sliding", hq=16, hkv=8, d=256, window=1024),
    HeadGeometry("gemma4_26b_a4b_global", hq=16, hkv=2, d=512),
    HeadGeometry("gpt_oss_20b", hq=64, hkv=8, d=64, sinks=True),
    HeadGeometry("gpt_oss_20b_sliding", hq=64, hkv=8, d=64, window=128, sinks=True),
    HeadGeometry("mixtral_8x7b", hq=32, hkv=8, d=128),
)
PREFILL_TOKENS = 4096
DECODE_BATCH, DECODE_CACHE = 64, 8192
