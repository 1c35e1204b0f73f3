"""XLA ops outside the Pallas kernels: which ones XLA removes before they run, and the time of the rest.

The rule for one XLA op (an HLO the jaxpr equation becomes) on a generation with constants r (rates.py):

    seconds = max(MXU FLOPs in bf16 passes / (peak x r.xla_efficiency), bytes / streamed-copy bandwidth)
              + r.op_fixed_s

Fitted on a third of the measured XLA rows of bench/records/tpu_calibration.json (the efficiency on v5e's 8192
matmul, the fixed cost on v7x's 1024 matmul), checked on the rest (tests/tpu/test_tpu_calibration.py).

What XLA removes is decided before costing (pure functions, each returning the reason): a pad of zero width, a
transpose undone by the next one, an output aliased to a donated argument. The transpose pairs are tracked by the
outer evaluation (schedule.py), which calls `cancels`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernel_hub.tpu.chips import Chip

from .rates import Rates, dot_key_flops, mxu_passes, rates

if TYPE_CHECKING:
    from jax.extend.core import JaxprEqn


@dataclass
class XlaOp:
    """One op outside the kernels: what it moves and multiplies, and whether it is charged (why not, if not)."""

    name: str
    bytes: int  # read + written
    dots: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (lhs, rhs dtype, precision) -> FLOPs
    free: str | None = None  # the reason XLA removes it; None: charged
    fixed: bool = True  # pays the per-op fixed cost (an async DMA the program only starts does not)

    def mxu_flops_on(self, generation: str | None) -> float:
        return sum(f * mxu_passes(lhs, rhs, prec, generation)[0] for (lhs, rhs, prec), f in self.dots.items())

    def seconds(self, chip: Chip, r: Rates | None = None) -> float:
        """The op's device time by the rule above (0 when XLA removes it)."""
        if self.free is not None:
            return 0.0
        r = r or rates(chip.generation)
        mxu = self.mxu_flops_on(chip.generation) / (chip.bf16_flops_per_s * r.xla_efficiency)
        return max(mxu, self.bytes / (chip.hbm_bytes_per_s * r.stream_fraction)) + (r.op_fixed_s if self.fixed else 0.0)

    def line(self) -> str:
        what = f"{self.name} {self.bytes / 2**20:.1f} MiB"
        if self.dots:
            what += f", {sum(self.dots.values()):.3g} FLOP"
        return what if self.free is None else f"{what} (free: {self.free})"


def zero_width_pad(eqn: JaxprEqn) -> str | None:
    """A pad adding nothing on any side or inside: XLA's simplifier drops it."""
    if eqn.primitive.name != "pad":
        return None
    config = eqn.params.get("padding_config", ())
    if all(int(lo) == 0 and int(hi) == 0 and int(interior) == 0 for lo, hi, interior in config):
        return "a pad of zero width"
    return None


def cancels(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    """Whether transposing by `first` then by `second` gives the array back (XLA folds the pair away)."""
    return len(first) == len(second) and all(first[second[i]] == i for i in range(len(first)))


def dot_flops(eqn: JaxprEqn) -> dict[tuple[str, str, str], float]:
    """A dot_general's FLOPs keyed by its operand dtypes and precision (the MXU pass rule's inputs)."""
    key, flops = dot_key_flops(eqn)
    return {key: flops}
