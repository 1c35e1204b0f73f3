"""Which way a device runs its experts, as a pure function of the call's sizes and the chip; returns the reason.

  "sorted"  the (token, slot) rows sorted by expert, gathered, two ragged dots, the rows summed back per token:
            the work is each row once, around two kernels sit a sort, a gather, the group metadata and a scatter.
  "dense"   every token through each expert of the device that some token picked, weighted by its routing weight
            (0 where the token did not pick it): one kernel (pallas/dense_experts.py) and one small op.

Dense is chosen where it costs the MXU nothing more: while the tokens fit the MXU's rows, each weight tile goes
through the array once whether 4 rows or all T ride along, and the weights are read once either way. Sorted stays
for large T (prefill, training), off a known TPU, for quantized weights and for schemes that move rows between
devices. Pure Python, no jax (the tile helpers it shares with the ragged dot are jax-free too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pallas.config import lane_tiles

FORMULATIONS: tuple[str, ...] = ("sorted", "dense")
#: Rows one pass of a generation's MXU takes with a weight tile loaded (128 x 128 arrays on v4/v5e/v5p, 256 x 256
#: on v6e and v7x: Google Cloud's TPU system architecture pages).
MXU_ROWS: dict[str, int] = {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "v7x": 256}
#: Gate activations the dense kernel computes in VMEM: gelu_exact's erf has no Mosaic lowering (jax 0.10.2:
#: "Unimplemented primitive in Pallas TPU lowering: erfc"), so it stays with the ragged dots, which apply it in XLA.
KERNEL_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu")
#: The dense kernel's rows are padded to this (its f32 accumulator's sublane tile, twice: bf16 packs 16 rows).
ROW_ALIGN = 16


@dataclass(frozen=True)
class DenseCall:
    """What the dense formulation needs decided about one call: its sizes on one device and the chip."""

    tokens: int  # T on this device (every token: the psum scheme replicates them)
    hidden: int
    inter: int  # I of this device's experts (after a tensor split)
    itemsize: int  # of x and the weights
    chip: str | None  # generation name ("v6e"), None off a known TPU
    vmem_budget: int  # bytes the kernel's blocks may fill on that chip
    gate_first: bool  # w_gate_up as one [E, H, 2I] array (else a (gate, up) pair)
    quantized: bool
    scheme: str  # the dispatch scheme (plan.py)
    pallas: bool  # the call runs the Pallas implementation
    mixed_dtypes: bool = False  # x and the weights differ in dtype (f32 activations, bf16 weights)
    activation: str = "silu"  # the gate activation's name (experts.ACTIVATIONS)


def padded_rows(tokens: int) -> int:
    return -(-tokens // ROW_ALIGN) * ROW_ALIGN


def column_tiles(i: int, gate_first: bool) -> list[int]:
    """I tiles the dense kernel's weight blocks may take, largest first: the ragged dot's lane tiles of I (I, then
    the multiples of 128 dividing it); a gate-first array whose I is not a multiple of 128 only whole (its up columns
    start off a lane tile)."""
    return [i] if gate_first and i % 128 else lane_tiles(i)


def block_bytes(t: int, h: int, ti: int, itemsize: int) -> int:
    """VMEM one grid step of the dense kernel holds: double-buffered gate, up and down tiles; x and the output,
    double-buffered; the gate weights; the f32 accumulator and the step's f32 temporaries (gate, up, activation)."""
    weights = 2 * 3 * h * ti * itemsize
    rows = 2 * 2 * t * h * itemsize + t * h * 4 + 3 * t * ti * 4 + 2 * t * 128 * 4
    return weights + rows


def dense_tile(call: DenseCall) -> int | None:
    """The largest I tile whose blocks fit the chip's budget, None when none does."""
    t = padded_rows(call.tokens)
    return next((ti for ti in column_tiles(call.inter, call.gate_first)
                 if block_bytes(t, call.hidden, ti, call.itemsize) <= call.vmem_budget), None)


def choose_formulation(call: DenseCall, requested: str | None = None) -> tuple[str, str]:
    """(formulation, why) for one call; `requested` ("sorted" / "dense") is kept where the call allows it, and a
    request the call cannot run is a ValueError naming why."""
    if requested is not None and requested not in FORMULATIONS:
        raise ValueError(f"unknown formulation {requested!r}; known: {', '.join(FORMULATIONS)}")
    refusal = None
    if call.quantized:
        refusal = "quantized weights run through the ragged dot"
    elif call.pallas and call.activation not in KERNEL_ACTIVATIONS:
        refusal = f"the {call.activation!r} activation does not lower into the kernel (its erf has no Mosaic lowering)"
    elif call.scheme != "psum":
        refusal = f"the {call.scheme!r} dispatch moves rows between devices; dense needs every token on each device"
    if requested == "dense" and refusal:
        raise ValueError(f"formulation='dense' cannot run here: {refusal}")
    if requested is not None:
        return requested, f"{requested}: requested"
    if refusal:
        return "sorted", refusal
    if not call.pallas or call.chip is None:
        return "sorted", "not the Pallas kernel on a known TPU: the rows once each"
    if call.mixed_dtypes:
        return "sorted", "x and the weights differ in dtype: dense would widen every weight tile in the kernel"
    t, rows = padded_rows(call.tokens), MXU_ROWS.get(call.chip, 128)
    if t > rows:
        return "sorted", f"{t} token rows exceed {call.chip}'s {rows} MXU rows: dense would multiply MXU passes"
    if dense_tile(call) is None:
        return "sorted", f"the dense kernel's smallest blocks exceed {call.chip}'s VMEM budget"
    return "dense", (f"{t} token rows fit {call.chip}'s {rows} MXU rows: every token through each routed expert "
                     "costs no more MXU passes, one kernel instead of sort, gather, two ragged dots and a scatter")
