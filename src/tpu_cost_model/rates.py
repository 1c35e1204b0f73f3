"""What the cost model assumes per TPU generation beyond the spec sheet: each constant a point and a band.

A constant measured on a generation (bench/records/tpu_calibration.json, the row named in `source`) is a point whose
band is the point itself. A constant no measurement pins for a generation is never borrowed from another one as a
point: it is a band (low, high) of plausible values, and its point is the band's middle. `rates(generation, end)`
gives the set the model runs with: "point", or the band's "fast" or "slow" end (every constant at the end that
makes a kernel faster or slower), so every modeled time has a band (ScheduleCost.band) and a comparison can say
whether it holds at both ends.

Also here, because they are per generation too: the MXU pass count of a dot (`mxu_passes`, from its precision and
operand dtypes) and the vector/transcendental rates of the softmax-heavy kernels.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with NumPy: np.dtype("bfloat16"))
import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    from jax.extend.core import JaxprEqn
    from jax.lax import PrecisionLike

    from kernel_hub.tpu.chips import Chip

#: What each end of a band means for the time: the "fast" end makes every kernel at least as fast as the point.
ENDS = ("point", "fast", "slow")


@dataclass(frozen=True)
class Constant:
    """One assumed figure: its point, its band and where it comes from."""

    point: float
    low: float
    high: float
    source: str

    @staticmethod
    def measured(value: float, source: str) -> Constant:
        return Constant(value, value, value, source)

    @staticmethod
    def unmeasured(low: float, high: float, source: str) -> Constant:
        return Constant((low + high) / 2, low, high, source)

    @property
    def is_band(self) -> bool:
        return self.low != self.high


@dataclass(frozen=True)
class Rates:
    """The constants the model runs with on one generation (one end of each band, or the points)."""

    generation: str
    stream_fraction: float  # of spec HBM bandwidth, what a streamed copy reaches
    step_overhead_s: float  # per grid step of a Pallas pipeline, on top of its MXU work
    xla_efficiency: float  # of MXU peak, what an XLA dot reaches on its passes
    op_fixed_s: float  # per op the device runs (an XLA op, or a kernel's custom call), its fixed cost
    vpu_ops_per_cycle: float  # vector element operations per cycle, as the walker counts them (jaxpr ops)
    eup_ops_per_cycle: float  # transcendental element operations per cycle (exp, log, tanh, ...)
    scalar_op_s: float  # per scalar-core op of a loop that does nothing else (a kernel's metadata pass)
    ici_link_efficiency: float  # of a link's spec one-way ICI rate, what a collective's payload reaches
    collective_fixed_s: float  # per collective, before its payload moves (launch, synchronisation)


_V5E_DOCS = "row v5e-matmul-128-8192 (jax docs Pallas matmul tutorial, v5e)"
_XLA_EFF = "row v5e-xla-matmul-8192 (jax docs Pallas matmul tutorial, XLA's own matmul, v5e)"
_XLA_FIXED = "row tpu7x-xla-matmul-1024 (pytorch/helion PR 2632, JAX's matmul device time on TPU v7)"
_ATTN = "row tpu7x-rpa_v3-prefill-32-32-8k (heavyball-research/flywheel-tpu README_v7x.md)"
_DECODE = "row tpu7x-rpa_v3-decode-128seq (heavyball-research/flywheel-tpu README_v7x.md)"
_SCALAR = "row tpu7x-gmm_v2-e512-4096x256-bf16-72x1 (vllm-project/tpu-inference issue 3520, gmm_v2's metadata pass)"
_EUP_V6E = ("row v6e-tokamax-splash-b1-t16384-h8-d256-full (openxla/tokamax's autotuning cache, splash attention "
            "timed by xprof on v6e)")
_PERMUTE = "rows *-ppermute-* (marin-community/marin issue 6736: barriered lax.ppermute on v5p-8 and v6e-8)"
_STEP_V5P = ("row v5p-tokamax-splash-b4-t4096-h8-d256-full (openxla/tokamax's autotuning cache, splash attention "
             "timed by xprof on v5p), jointly with the VPU rate's row")
_VPU_V5P = ("row v5p-tokamax-splash-b4-t4096-h16-d128-causal (openxla/tokamax's autotuning cache, splash attention "
            "timed by xprof on v5p), jointly with the step cost's row")

#: Fitted figures, each recomputed in tests/tpu/test_tpu_calibration.py from its row's published numbers.
#: v7x's streamed fraction: the one that puts RPA v3's 128-sequence decode (7693.6 MiB streamed, 18.6 us of other
#: work) on its measured 2.574 ms; the published streamed copy (3.21 TB/s, row tpu7x-streamed-copy) checks it.
STREAM_FRACTION_V7X = 0.8562
STEP_OVERHEAD_V5E_S = 0.3286e-6
XLA_EFFICIENCY_V5E = 0.9402
OP_FIXED_V7X_S = 3.353e-6
VPU_OPS_PER_CYCLE_V7X = 6599.0
#: v6e's transcendentals a cycle: the rate that puts tokamax's splash attention at 16384 positions, 8 heads of 256
#: (heads that fill v6e's 256-wide MXU, so no padding is in question) on its measured 3.754 ms; at the band's middle
#: (768) every v6e splash row was modeled 7-24% fast, at this figure its exp2 work is the kernel's longest unit.
EUP_OPS_PER_CYCLE_V6E = 476.3
#: v7x's scalar op: measured minus modeled of gmm_v2 at 512 groups of one row (71.8 - 51.84 us) over the 16064 jaxpr
#: scalar ops its metadata pass runs (31 per group: SMEM loads and stores, offsets, a tile count): about two cycles
#: of the scalar core each.
SCALAR_OP_V7X_S = 1.2425e-9
#: v5p's step cost and vector rate, fitted together on two of its 44 attention rows (each the figure that puts its
#: row on its measured time at the other's): a step of a full (unmasked) splash at heads of 256, whose vector work
#: hides under the MXU, gives the step cost; a causal splash at heads of 128, whose mask and softmax element work is
#: its longest unit at that rate, gives the vector rate. The rows say a v5p step costs less than the band's middle
#: (full 512 x 512 blocks at 512 positions measure 639 us where 0.35 us a step models 783) and that a block's mask
#: does not hide under the MXU (the causal twin of that row measures 785 us at the same grid, FLOPs and bytes): at
#: ~2000 jaxpr element ops a cycle the mask's iota / compare / select work on each diagonal block is what adds.
STEP_OVERHEAD_V5P_S = 0.2789e-6
VPU_OPS_PER_CYCLE_V5P = 1959.3

#: One collective's fixed cost where permutes are measured (v5p, v6e): point 5.0 us, between their small-payload
#: times (v5p ~4.5-5.5 us, v6e ~5.6-5.9 us for 1-16 KiB); band from the lowest intercept of the source's
#: large-payload fits (v6e 2.29 us) to the highest small-payload time.
COLLECTIVE_FIXED_S = Constant(5.0e-6, 2.29e-6, 5.9e-6, _PERMUTE)
#: The fraction of a link's spec one-way rate a payload reaches: fitted on row "v6e-ppermute-64MiB" (64 MiB in
#: 776.34 us, less the fixed cost's point, over one 100 GB/s link); v5p's link has the same spec rate and its two
#: rows check the figure.
LINK_EFFICIENCY = 64 * 2**20 / ((776.34e-6 - COLLECTIVE_FIXED_S.point) * 100e9)
_PERMUTE_MEASURED = ("v5p", "v6e")

_GENERATIONS = ("v4", "v5e", "v5p", "v6e", "v7x")


def _table() -> dict[str, dict[str, Constant]]:
    out: dict[str, dict[str, Constant]] = {}
    for g in _GENERATIONS:
        out[g] = {
            "stream_fraction": (Constant.measured(STREAM_FRACTION_V7X, _DECODE) if g == "v7x" else
                                Constant.unmeasured(0.75, 0.95, "no published streamed copy on this generation: "
                                                    "a band around v7x's 0.87")),
            "step_overhead_s": (Constant.measured(STEP_OVERHEAD_V5E_S, _V5E_DOCS) if g == "v5e" else
                                Constant.measured(STEP_OVERHEAD_V5P_S, _STEP_V5P) if g == "v5p" else
                                Constant.unmeasured(0.25e-6, 0.45e-6, "not measured on this generation: the Pallas "
                                                    "TPU docs quote ~0.35 us a step")),
            "xla_efficiency": (Constant.measured(XLA_EFFICIENCY_V5E, _XLA_EFF) if g == "v5e" else
                               Constant.unmeasured(0.65, 1.0, "XLA's dot efficiency is measured on v5e only "
                                                   "(0.95): a band from 65% of peak up to peak")),
            "op_fixed_s": (Constant.measured(OP_FIXED_V7X_S, _XLA_FIXED) if g == "v7x" else
                           Constant.unmeasured(1.0e-6, 6.0e-6, "no device-timed small op on this generation: "
                                               "a band around v7x's 3.6 us")),
            "vpu_ops_per_cycle": (Constant.measured(VPU_OPS_PER_CYCLE_V7X, _ATTN) if g == "v7x" else
                                  Constant.measured(VPU_OPS_PER_CYCLE_V5P, _VPU_V5P) if g == "v5p" else
                                  Constant.unmeasured(4096.0, 11600.0, "fitted on v7x and v5p only (6599 and "
                                                      "1959 jaxpr element ops a cycle, beside the MXU): a band "
                                                      "from 4 ALU slots of 8 x 128 lanes up")),
            "eup_ops_per_cycle": (Constant.measured(EUP_OPS_PER_CYCLE_V6E, _EUP_V6E) if g == "v6e" else
                                  Constant.unmeasured(512.0, 1024.0, "not published: one transcendental slot, "
                                                      "a half to a whole 8 x 128 vreg a cycle")),
            "scalar_op_s": (Constant.measured(SCALAR_OP_V7X_S, _SCALAR) if g == "v7x" else
                            Constant.unmeasured(0.6e-9, 2.5e-9, "fitted on v7x only (1.24 ns a jaxpr scalar op "
                                                "of a metadata loop): a band from half to twice that")),
            "ici_link_efficiency": (Constant.measured(LINK_EFFICIENCY, _PERMUTE) if g in _PERMUTE_MEASURED else
                                    Constant.unmeasured(0.75, 0.95, "no measured collective on this generation: "
                                                        "the stream fraction's band")),
            "collective_fixed_s": (COLLECTIVE_FIXED_S if g in _PERMUTE_MEASURED else
                                   Constant.unmeasured(1.0e-6, 5.9e-6, "no measured collective on this generation: "
                                                       "from 1 us a hop to the measured small permutes' 5.9 us")),
        }
    return out


TABLE = _table()

#: For each constant, whether a larger value makes a kernel slower (its "slow" end is its high end).
_SLOWER_WHEN_HIGH = {"stream_fraction": False, "step_overhead_s": True, "xla_efficiency": False,
                     "op_fixed_s": True, "vpu_ops_per_cycle": False, "eup_ops_per_cycle": False,
                     "scalar_op_s": True, "ici_link_efficiency": False, "collective_fixed_s": True}


def constants(generation: str) -> dict[str, Constant]:
    """Every assumed constant of a generation, with its band and source; ValueError for an unknown generation."""
    if generation not in TABLE:
        raise ValueError(f"no cost-model constants for TPU generation {generation!r}; known: {', '.join(TABLE)}")
    return TABLE[generation]


def stream_bytes_per_s(c: Chip, end: str = "point") -> float:
    """What a streamed copy reaches on one device of chip `c`: spec HBM bandwidth x the generation's stream
    fraction (measured on v7x, a band elsewhere)."""
    return c.hbm_bytes_per_s * rates(c.generation, end).stream_fraction


def rates(generation: str, end: str = "point") -> Rates:
    """The constants at one end of their bands: "point", "fast" (every kernel as fast as the band allows) or
    "slow"."""
    if end not in ENDS:
        raise ValueError(f"end must be one of {', '.join(ENDS)}, not {end!r}")
    values: dict[str, float] = {}
    for name, c in constants(generation).items():
        if end == "point":
            values[name] = c.point
        else:
            slow_high = _SLOWER_WHEN_HIGH[name]
            values[name] = c.high if (end == "slow") == slow_high else c.low
    return Rates(generation, **values)


# ------------------------------------------------------------------------------------------------ MXU passes

#: Generations whose MXU multiplies int8 at twice the bf16 rate (Google's per-chip specs: v5e 394 int8 TOPS vs 197
#: bf16 TFLOPS, v5p 918 vs 459, v6e 1836 vs 918); v4 and v7x publish no faster int8 rate.
_INT8_DOUBLE = {"v5e", "v5p", "v6e"}
#: Generations whose MXU multiplies fp8 natively at twice the bf16 rate (v7x: 4614 FP8 vs 2307 bf16 TFLOPS a chip).
_FP8_DOUBLE = {"v7x"}
#: XLA's f32 dot on TPU: DEFAULT one bf16 pass, HIGH three (bf16_3x), HIGHEST six (bf16_6x).
F32_PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}
_FP8 = {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"}


def precision_name(precision: PrecisionLike) -> str:
    """The stronger of a dot's operand precisions as a name: DEFAULT, HIGH or HIGHEST (None is DEFAULT)."""
    if precision is None:
        return "DEFAULT"
    items = precision if isinstance(precision, (tuple, list)) else (precision,)
    order = ("DEFAULT", "HIGH", "HIGHEST")
    best = "DEFAULT"
    for p in items:
        name = getattr(p, "name", None) or str(p).rsplit(".", 1)[-1].upper()
        name = {"FASTEST": "DEFAULT", "BFLOAT16": "DEFAULT", "TENSORFLOAT32": "HIGH", "FLOAT32": "HIGHEST"}.get(name,
                                                                                                               name)
        if name in order and order.index(name) > order.index(best):
            best = name
    return best


def mxu_passes(lhs_dtype: npt.DTypeLike, rhs_dtype: npt.DTypeLike, precision: PrecisionLike, generation: str | None
               ) -> tuple[float, str]:
    """bf16-pass equivalents of one dot on the MXU, and why: f32 by precision (1 / 3 / 6), int8 and fp8 at half a
    pass where the generation multiplies them at twice the bf16 rate, anything else (bf16, mixed widths, a narrow
    type a generation upcasts) one pass."""
    lhs, rhs = np.dtype(lhs_dtype).name, np.dtype(rhs_dtype).name
    if "float32" in (lhs, rhs) or "float64" in (lhs, rhs):
        name = precision_name(precision)
        return float(F32_PASSES[name]), f"f32 at {name}: {F32_PASSES[name]} bf16 pass(es)"
    if lhs == rhs == "int8":
        if generation in _INT8_DOUBLE:
            return 0.5, f"int8 x int8 on {generation}: twice the bf16 rate"
        return 1.0, f"int8 x int8 on {generation or 'an unnamed generation'}: no faster int8 rate published"
    if lhs in _FP8 and rhs in _FP8:
        if generation in _FP8_DOUBLE:
            return 0.5, f"fp8 x fp8 on {generation}: twice the bf16 rate"
        return 1.0, f"fp8 x fp8 on {generation or 'an unnamed generation'}: upcast to bf16, one pass"
    if lhs != rhs:
        return 1.0, f"{lhs} x {rhs}: the wider operand's pass"
    return 1.0, f"{lhs} x {rhs}: one pass"


# --------------------------------------------------------------------------------------------- vector work

#: Transcendentals: the EUP's work, one per element.
EUP_PRIMITIVES = {"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "rsqrt", "sqrt", "erf", "erf_inv",
                  "sin", "cos", "tan", "atan2", "pow", "cbrt"}
#: Element-wise and reducing vector ops: the VPU's work, one per element (of the larger of input and output).
VPU_PRIMITIVES = {"add", "sub", "mul", "div", "max", "min", "neg", "abs", "select_n", "eq", "ne", "lt", "le", "gt",
                  "ge", "and", "or", "not", "xor", "convert_element_type", "reduce_max", "reduce_min", "reduce_sum",
                  "argmax", "argmin", "integer_pow", "square", "sign", "floor", "ceil", "round", "clamp",
                  "nextafter", "rem", "shift_left", "shift_right_logical", "shift_right_arithmetic",
                  "cumsum", "cummax", "reduce_and", "reduce_or", "iota", "broadcasted_iota"}

#: MXU geometry of one device: (systolic arrays, their side), from Google's TPU system-architecture pages (4 MXUs
#: per TensorCore; 128 x 128 through v5, 256 x 256 from v6e; v4 and v5p run two TensorCores as one device).
#: With the published peak it gives the clock: peak / (arrays x side^2 x 2).
MXU_GEOMETRY = {"v4": (8, 128), "v5e": (4, 128), "v5p": (8, 128), "v6e": (4, 256), "v7x": (4, 256)}
#: Vector lanes of one device: 8 sublanes x 128 lanes per TensorCore.
VECTOR_LANES = {"v4": 2048, "v5e": 1024, "v5p": 2048, "v6e": 1024, "v7x": 1024}


def clock_hz(generation: str, bf16_flops_per_s: float) -> float:
    """The device's clock implied by its peak and MXU geometry (v5e: 197 TFLOP/s / (4 x 128^2 x 2) = 1.5 GHz)."""
    arrays, side = MXU_GEOMETRY[generation]
    return bf16_flops_per_s / (arrays * side * side * 2)


def vector_seconds(vpu_elems: float, eup_elems: float, generation: str, bf16_flops_per_s: float, r: Rates) -> float:
    """Time of a kernel's vector work: VPU element ops and EUP transcendentals at the generation's rates (the two
    units issue in the same bundles, so the longer of the two; the MXU runs beside them, CallCost.seconds)."""
    if not vpu_elems and not eup_elems:
        return 0.0
    lanes_scale = VECTOR_LANES[generation] / 1024
    hz = clock_hz(generation, bf16_flops_per_s)
    return max(vpu_elems / (r.vpu_ops_per_cycle * lanes_scale * hz), eup_elems / (r.eup_ops_per_cycle * lanes_scale
                                                                                     * hz))


#: The side of a generation's MXU array (v4, v5e, v5p: 128 x 128; v6e, v7x: 256 x 256).
MXU_WIDTH = {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "v7x": 256}
_WIDTH: ContextVar[int | None] = ContextVar("mxu_width", default=None)


@contextmanager
def mxu_width(generation: str | None) -> Iterator[None]:
    """Charge the dots walked inside at the MXU width of `generation` (dot_key_flops); None: unpadded."""
    token = _WIDTH.set(MXU_WIDTH.get(generation) if generation else None)
    try:
        yield
    finally:
        _WIDTH.reset(token)


def current_mxu_width() -> int | None:
    """The MXU width dots are charged at now (mxu_width's), None outside it: part of what a walk depends on."""
    return _WIDTH.get()


def dot_key_flops(eqn: JaxprEqn) -> tuple[tuple[str, str, str], float]:
    """A dot_general's (operand dtypes and precision, FLOPs): the MXU pass rule's inputs, for XLA ops and kernels.
    Inside `mxu_width(generation)` the contraction and the output columns are rounded up to the MXU's side: the
    array holds a W x W tile of the stationary operand, so a dot 64 deep (an attention head of 64) uses a quarter of
    v6e's 256 x 256 array and takes as long as one 256 deep (tokamax's measured splash rows: at equal FLOPs, heads
    of 256 / 128 / 64 take 3.75 / 6.66 / 12.67 ms on v6e, and heads of 64 twice heads of 128 on v5p)."""
    (contract, _), (batch, _) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in eqn.invars)
    k = math.prod(lhs.shape[d] for d in contract)
    b = math.prod(lhs.shape[d] for d in batch)
    m = math.prod(lhs.shape) // max(k * b, 1)
    n = math.prod(rhs.shape) // max(k * b, 1)
    key = (np.dtype(lhs.dtype).name, np.dtype(rhs.dtype).name, precision_name(eqn.params.get("precision")))
    width = _WIDTH.get()
    if width:
        k, n = (-(-d // width) * width for d in (k, n))
    return key, 2.0 * b * m * n * k
