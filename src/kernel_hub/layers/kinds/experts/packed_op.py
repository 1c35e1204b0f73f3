"""torch.compile for expert blocks whose weights kernelize packed: the packed call as one opaque custom op.

Why: packed weights are Python objects (a kernel's PackedExperts: oneDNN-blocked bytes or native-layout stacks, with
the block's gate, activation and post-norm beside them), which no custom-op schema can carry, and tracing the packed
entry itself meets host-side routing (group sizes read as Python ints). So a packed block is given an integer handle
when it is packed, and under torch.compile its call is `kernel_hub::packed_experts(hidden, index, weights, handle)`:
the graph holds the int, the op's eager body finds the block by it (a weak registry: a freed block is never kept
alive by a compiled graph) and calls the block eagerly, so compiled and eager calls run the same code.
The fake implementation gives the experts' output shape: one row of width hidden per token, in the hidden dtype.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

_BLOCKS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_NEXT = itertools.count(1)


def register(module: torch.nn.Module) -> int:
    """A new handle for the packed block `module` (eager, at pack time: tracing only reads it)."""
    handle = next(_NEXT)
    _BLOCKS[handle] = module
    return handle


def block(handle: int) -> Any:
    """The block a compiled graph's handle names; a clear error when it is gone."""
    module = _BLOCKS.get(handle)
    if module is None:
        raise RuntimeError(f"the packed expert block (handle {handle}) this compiled graph calls no longer exists "
                           "(the model was freed or restored): compile the model again")
    return module


@torch.library.custom_op("kernel_hub::packed_experts", mutates_args=())
def packed_experts(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                   handle: int) -> torch.Tensor:
    with torch.no_grad():  # packed weights are inference-only; the block's own eager forward picks its path
        return block(handle)(hidden_states, top_k_index, top_k_weights)


@packed_experts.register_fake
def _(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
      handle: int) -> torch.Tensor:
    return hidden_states.new_empty(hidden_states.shape)
