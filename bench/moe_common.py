"""What the MoE decode benches share (bench/moe_decode.py, bench/moe_quantized.py): one Qwen3-30B-A3B expert layer
with random weights, its routing at a decode batch, the bytes its active experts hold, and the timing constants of the
memory floor. Both scripts import this one module, so neither imports the other for it."""

from __future__ import annotations

from typing import Any

import torch

GEOMETRY = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
#: Bytes each floor round copies (scaled to the active bytes): large enough to leave every cache.
FLOOR_COPY_BYTES = 256 << 20
#: Idle time before each timed call: torch's OpenMP workers (eager, grouped_mm, the threads copy) spin-wait for
#: milliseconds after each parallel region, and would otherwise take the cores from whatever runs next.
GAP_S = 0.05
#: The three ways the floor is measured each round (moe_decode.FloorCopy); the round's floor is the fastest.
FLOOR_KINDS = ("floor_pool", "floor_threads", "floor_read")


def build_layer(dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """A Qwen3-MoE experts block with random weights, inside a container module (kernelize's target)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(**GEOMETRY, hidden_act="silu")
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    with torch.device("cpu"):
        experts = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in (experts.gate_up_proj, experts.down_proj):
            p.normal_(0.0, 0.02)
    container = torch.nn.Module()
    container.experts = experts.to(dtype).requires_grad_(False)
    return container, config


def routing(batch: int, dtype: torch.dtype, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, GEOMETRY["hidden_size"], generator=g).to(dtype)
    probs = torch.softmax(torch.randn(batch, GEOMETRY["num_experts"], generator=g), dim=-1)
    weights, index = torch.topk(probs, GEOMETRY["num_experts_per_tok"], dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype)
    return hidden, index, weights


def expert_bytes(dtype: torch.dtype) -> int:
    h, i = GEOMETRY["hidden_size"], GEOMETRY["moe_intermediate_size"]
    return 3 * h * i * torch.tensor([], dtype=dtype).element_size()


def active_bytes(index: torch.Tensor, dtype: torch.dtype) -> int:
    return int(torch.unique(index).numel()) * expert_bytes(dtype)
