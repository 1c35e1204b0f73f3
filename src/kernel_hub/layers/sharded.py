"""Expert blocks that torch.distributed sharded (transformers' tensor- and expert-parallel plans, DistributedConfig).

Their weights are DTensors: each rank holds a slice (an expert-parallel plan keeps E/ep whole experts per rank, with
`num_experts` set to that local count and off-rank routes given the sentinel id; a tensor-parallel plan keeps matching
gate and up columns and all-reduces the partial outputs after the block). transformers runs the block's forward on
the local slices, so kernelize reads the local shapes and validates on the local slices too, which is exactly the
computation the kernel is asked for at run time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def local(tensor: T) -> T:
    """The rank's own slice of a DTensor; any other value as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and hasattr(tensor, "placements") else tensor


@contextlib.contextmanager
def local_parameters(module: torch.nn.Module) -> Iterator[None]:
    """The module's DTensor parameters replaced by their local slices for the duration (what transformers does
    around a sharded block's forward); the DTensors are put back after, even on an exception."""
    originals = {name: p for name, p in module.named_parameters(recurse=False) if hasattr(p, "placements")}
    for name, p in originals.items():
        module._parameters[name] = local(p)
    try:
        yield
    finally:
        module._parameters.update(originals)
