"""Quantized expert weights in moe_experts: their scales checked, split and sharded the way the weights are.

w_gate_up int8 [E, H, 2I] takes w_gate_up_scale [E, 1, 2I]; float8_e4m3fn takes [E, ceil(H/128), ceil(2I/128)]
(the ragged dot's layouts, quant.py); the (w_gate, w_up) pair of [E, H, I] takes a pair of scales. w_down [E, I, H]
takes w_down_scale [E, 1, H] or [E, ceil(I/128), ceil(H/128)]. A scale shards with its weight: over the expert axis
always; over the tensor axis along I, which for block scales needs I / tensor devices to be a multiple of 128 (a
block must not straddle two devices), and int8 down scales (one per output channel H) are replicated over it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..quant import BLOCK, check_scale

#: (w_gate_up scale, w_down scale): None entries where a weight is not quantized.
Scales = tuple[Any, Any]


def check_scales(x: Any, w_gu: Any, w_down: Any, gu_scale: Any, down_scale: Any) -> Scales:
    """The scales as f32 arrays (a pair where w_gate_up is a pair), or one ValueError naming the argument."""
    if isinstance(w_gu, tuple):
        if gu_scale is not None and not (isinstance(gu_scale, (tuple, list)) and len(gu_scale) == 2):
            raise ValueError("w_gate_up_scale must be a (gate_scale, up_scale) pair when w_gate_up is a "
                             "(w_gate, w_up) pair")
        pair = (None, None) if gu_scale is None else tuple(gu_scale)
        s_gu = tuple(check_scale(x, w, s, (f"w_gate_up[{i}]", f"w_gate_up_scale[{i}]"))
                     for i, (w, s) in enumerate(zip(w_gu, pair, strict=True)))
        s_gu = None if all(s is None for s in s_gu) else s_gu
        if s_gu is not None and any(s is None for s in s_gu):
            raise ValueError("w_gate_up_scale: quantize both halves of the (w_gate, w_up) pair or neither")
    else:
        if isinstance(gu_scale, (tuple, list)):
            raise ValueError("w_gate_up_scale must be one array when w_gate_up is one [E, H, 2I] array")
        s_gu = check_scale(x, w_gu, gu_scale, ("w_gate_up", "w_gate_up_scale"))
    return s_gu, check_scale(x, w_down, down_scale, ("w_down", "w_down_scale"))


def split_gate_up_scale(scale: Any, w_gu: Any, i: int) -> Any:
    """The fused [E, ., 2I] scale as the (gate, up) pair its weight is split into. Block scales split only where
    I is a multiple of 128 (else a block holds both gate and up columns)."""
    if scale is None or isinstance(scale, tuple):
        return scale
    if w_gu.dtype == jnp.int8:
        return scale[..., :i], scale[..., i:]
    if i % BLOCK:
        raise ValueError(f"fp8 w_gate_up_scale cannot follow a gate/up split at I={i} (not a multiple of {BLOCK}: "
                         "a block would hold gate and up columns); pass w_gate_up and its scales as pairs")
    return scale[..., : i // BLOCK], scale[..., i // BLOCK:]


def check_tensor_split(w_gu: Any, w_down: Any, scales: Scales, tensor_devices: int) -> None:
    """Block scales split over the tensor axis only at whole blocks: I / tensor devices a multiple of 128."""
    first = w_gu[0] if isinstance(w_gu, tuple) else w_gu
    fp8 = [w for w, s in ((first, scales[0]), (w_down, scales[1])) if s is not None and w.dtype != jnp.int8]
    i = w_down.shape[1]
    if tensor_devices > 1 and fp8 and (i // tensor_devices) % BLOCK:
        raise ValueError(f"fp8 block scales split over tensor_axis need I / {tensor_devices} = "
                         f"{i / tensor_devices:g} to be a multiple of {BLOCK}")


def scale_specs(scales: Scales, w_down: Any, expert_axis: str | None, tensor_axis: str | None) -> Scales:
    """PartitionSpecs of (w_gate_up scale, w_down scale), matching partition_specs' weight specs."""
    gu = None
    if scales[0] is not None:
        gu = P(expert_axis, None, None) if tensor_axis is None else (P(expert_axis, None, tensor_axis),) * 2
    down = None
    if scales[1] is not None:
        down = P(expert_axis, None, None) if w_down.dtype == jnp.int8 else P(expert_axis, tensor_axis, None)
    return gu, down
