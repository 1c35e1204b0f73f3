"""Which implementation runs a ragged dot: the names, their order per platform, and the one Dispatch that both the
unquantized call (dense.py) and the quantized one (quant.py) go through, so last_implementation() reports either.

`CallPath` is the static description of one implementation call (hashable: a jit / custom_vjp static argument);
`target_chip` the TPU whose facts choose a Mosaic call's default tiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._vendor.chips import ChipFacts, chip_for_device_kind
from ._vendor.dispatch import Dispatch
from ._vendor.interpret import pallas_remark
from .pallas.config import RaggedDotConfig

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "cpu", "xla")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas", "xla"),
    "cuda": ("xla", "cpu"),
    "gpu": ("xla", "cpu"),
    "rocm": ("xla", "cpu"),
    "cpu": ("cpu", "xla"),
}


DISPATCH = Dispatch("ragged_dot", IMPLEMENTATIONS, ORDER, ("xla", "cpu"), remark=pallas_remark)
implementations_for, resolve_implementation, last_implementation = DISPATCH.exports()


@dataclasses.dataclass(frozen=True)
class CallPath:
    """Static description of one implementation call: hashable, so it is a jit / custom_vjp static arg."""

    name: str
    out_dtype: Any
    config: RaggedDotConfig | None
    interpret: Any
    chip: ChipFacts | None = None  # the TPU the forward's default tiles are chosen for (target_chip)


def target_chip(interpret: Any) -> ChipFacts | None:
    """The TPU a Mosaic lowering targets (the default device's kind, which an ahead-of-time compile for a mock TPU
    sets too); None when interpreting or off a TPU. Only the device kind is read, never pltpu.get_tpu_info()
    (that raises off a TPU); the facts themselves come from _vendor.chips.CHIPS."""
    if interpret:
        return None
    try:
        from jax._src.pallas.mosaic import tpu_info

        return chip_for_device_kind(tpu_info.get_device_kind())
    except Exception:  # no device kind to read: the conservative default
        return None
