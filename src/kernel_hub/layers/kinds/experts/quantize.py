"""kernelize(model, quantize="int8" | "fp8"): expert weights read as int8 or float8 bytes, for decode at half the bytes.

What happens to a replaced expert block (inference only):
- quantize="int8": each projection is quantized per (expert, output channel), symmetric, scale = max|w| / 127;
  quantize="fp8": float8_e4m3fn with one scale per 128 x 128 block (transformers' fine-grained FP8 layout),
  scale = max|w| / 448. Both through the kernel's own `quantize` export.
- The quantized copies live with the kernelized block (module.__dict__[RECORD_ATTR]), stored nn.Linear-style
  ([E, N, K] bytes, what the kernel's native CPU path streams); the model's own bf16 parameters stay its parameters,
  untouched: `state_dict()`, saving and `restore(model)` give them back bit for bit, and restore drops the copies.
  A parameter changed after kernelize (load_state_dict, .to(), an in-place edit: a new object or a new tensor
  version) is quantized again on the block's next call.
- A block whose experts already hold float8_e4m3fn weights with 128 x 128 `*_scale_inv` scales (transformers'
  FineGrainedFP8Config `FP8Experts`) runs on those weights directly, with or without `quantize=`.

The bound each quantized block is validated against (`error_bound`), derived:
1. Rounding a weight to the grid is independent of the inputs. For y = W x with inputs of i.i.d. components (the
   validation batch is Gaussian), E|dW x|^2 / E|W x|^2 = |dW|_F^2 / |W|_F^2 = e^2: a projection's output carries the
   weights' relative Frobenius error e as its relative RMS error. e is measured exactly, per projection, on the
   weights at swap time (`relative_weight_error`).
2. A gated block h = act(g) * u sees the errors of g and u at once (to first order d h / h = a(g) d g / g + d u / u,
   with a(g) = g act'(g) / act(g) <= 1.1 for SiLU and GELU), so h carries ~sqrt(2) e_up; the down projection carries
   that through and adds its own e_down, independent, in quadrature: RMS error sqrt(2 e_up^2 + e_down^2) (ungated:
   sqrt(e_up^2 + e_down^2)).
3. The metric (numerics.relative_error) is max |error| / max |reference| over the batch, not an RMS ratio: both
   peaks are a few RMS for Gaussian-like values, and PEAK_MARGIN = 4 allows the error's peak-to-RMS ratio to be up to
   4x the reference's.
4. On top, the tolerance the unquantized kernel is held to in that dtype (bf16 rounding of the two products).
   So: bound = tolerance(dtype) + PEAK_MARGIN * sqrt(2 e_up^2 + e_down^2).
A priori: int8 per channel rounds with a uniform error of step / sqrt(12), step = 2 max|w| / 254, so e =
max|w| / (127 sqrt(12) rms(w)), about 0.006-0.009 for rows whose peak is 2.5-4x their RMS: bound ~ 0.04-0.06 in
bf16. e4m3 keeps 3 mantissa bits (relative rounding up to 2^-4, RMS ~ 2^-4 / sqrt(3) of each value), e ~ 0.02-0.03:
bound ~ 0.14-0.2. A block over its bound keeps the unquantized kernel and its row says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch

from ....errors import KernelHubError
from ...sharded import local
from .find import BLOCK, ExpertsLayout, fp8_scale, fp8_scale_names
from .packing import weight_names

if TYPE_CHECKING:
    from .contract import AdviseFn, ExpertsCall, QuantizeFn

#: kernelize's quantize= choices -> the weight dtype.
FORMATS = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
DESCRIBE = {"int8": "int8, per-channel scales", "fp8": "float8_e4m3fn, 128x128 block scales",
            "fp8-model": "float8_e4m3fn, the model's own 128x128 block scales (weight_scale_inv)"}
RECORD_ATTR = "_kernel_hub_quantized"
PEAK_MARGIN = 4.0
#: Experts quantized at once (bounds the float32 working copy to a few experts).
CHUNK = 8
#: What a kernel must export for kernelize to quantize with it.
EXPORTS = ("quantize", "moe_experts")


def check_quantize(quantize: object, mode: str) -> str | None:
    """The format name, or None; raises KernelHubError (before anything changes) for an unknown value or training."""
    if quantize is None:
        return None
    if quantize not in FORMATS:
        raise KernelHubError(f"quantize must be None, 'int8' or 'fp8', got {quantize!r}")
    if mode != "inference":
        raise KernelHubError(f"quantize={quantize!r} is for inference: quantized expert weights are frozen copies, so "
                             f"mode={mode!r} cannot train them; kernelize with mode='inference' (or without quantize)")
    return quantize


def error_bound(e_up: float, e_down: float, *, gated: bool, tolerance: float) -> float:
    """The relative error a quantized block may show against its own unquantized layer (module docstring)."""
    return tolerance + PEAK_MARGIN * math.sqrt((2.0 if gated else 1.0) * e_up ** 2 + e_down ** 2)


# --- transformers' fine-grained FP8 experts ------------------------------------------------------------------------


# --- the quantized copies --------------------------------------------------------------------------------------------


@dataclass
class QuantizedExperts:
    """Lives on the block (module.__dict__[RECORD_ATTR]) from kernelize to restore."""

    fmt: str  # "int8", "fp8" or "fp8-model"
    names: tuple[str, str]
    transposed: bool  # the model's layout ([E, K, N] stacks): the copies are always nn.Linear-style
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # name -> (bytes, scale)
    sources: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (id, _version) quantized from
    errors: dict[str, float] = field(default_factory=dict)  # name -> relative weight error e
    bytes_before: int = 0
    bytes_after: int = 0
    quantize: QuantizeFn | None = None  # the kernel's quantize
    advise: AdviseFn | None = None  # the kernel's advise_huge_pages (2 MiB pages for the copies: fewer TLB misses)
    pages: str = ""  # what backs the copies


def _stamp(t: torch.Tensor) -> tuple[int, int]:
    return id(t), t._version


def _rhs(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The weight in the ragged dot's [E, K, N] orientation (a view)."""
    return weight if transposed else weight.transpose(1, 2)


def _quantize_one(weight: torch.Tensor, transposed: bool, fmt: str, quantize: QuantizeFn
                  ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(bytes [E, N, K], scale laid out like them, relative Frobenius error) for one [E, ...] projection, a few
    experts at a time."""
    rhs = _rhs(weight.detach(), transposed)
    e, k, n = rhs.shape
    dtype = FORMATS[fmt]
    q_all = torch.empty((e, n, k), dtype=dtype, device=rhs.device)  # beside the weights they stand for
    scales = []
    err2 = ref2 = 0.0
    with torch.no_grad():
        for start in range(0, e, CHUNK):
            part = rhs[start:start + CHUNK]
            q, s = quantize(part, dtype)
            q_all[start:start + CHUNK] = q.transpose(1, 2)
            scales.append(s)
            deq = _dequantize(q, s).double()
            err2 += float(((deq - part.double()) ** 2).sum())
            ref2 += float((part.double() ** 2).sum())
    scale = torch.cat(scales).transpose(1, 2)  # [E, N, 1] / [E, NB, KB]: the transposed view of a contiguous stack
    return q_all, scale, math.sqrt(err2 / ref2) if ref2 > 0 else 0.0


def _dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float32 [.., K, N] values of q (rhs orientation) with scales s; independent of the kernel's own."""
    w = q.to(torch.float32)
    if q.dtype == torch.int8:
        return w * s
    k, n = q.shape[-2:]
    return w * s.repeat_interleave(BLOCK, -2)[..., :k, :].repeat_interleave(BLOCK, -1)[..., :n]


def quantize_block(module: torch.nn.Module, layout: ExpertsLayout, fmt: str, quantize: QuantizeFn,
                   advise: AdviseFn | None = None) -> QuantizedExperts:
    """Quantized copies of the block's two projections (never touching its parameters)."""

    names = weight_names(layout)
    record = QuantizedExperts(fmt=fmt, names=names, transposed=layout.is_transposed, quantize=quantize,
                              advise=advise)
    _fill(module, record)
    return record


def _fill(module: torch.nn.Module, record: QuantizedExperts) -> None:
    before = after = 0
    for name in record.names:
        param = cast(torch.Tensor, module._parameters[name])  # weight_names: the block's own parameters
        rank_slice = local(param)  # a sharded block computes on its rank's slice: that is what gets quantized
        assert record.quantize is not None  # a record made by quantize_block, the only kind filled
        q, s, err = _quantize_one(rank_slice, record.transposed, record.fmt, record.quantize)
        if record.advise is not None:
            huge, why = record.advise(q)
            record.pages = f"{huge >> 20} MiB in 2 MiB pages" if huge else why
        record.weights[name] = (q, s)
        record.sources[name] = _stamp(param)
        record.errors[name] = err
        before += rank_slice.numel() * rank_slice.element_size()
        after += q.numel() * q.element_size() + s.numel() * s.element_size()
    record.bytes_before, record.bytes_after = before, after


def fp8_model_record(module: torch.nn.Module, layout: ExpertsLayout) -> QuantizedExperts:
    """The record of a block that already holds fine-grained FP8 weights: its own tensors, no copy."""

    names = weight_names(layout)
    record = QuantizedExperts(fmt="fp8-model", names=names, transposed=layout.is_transposed)
    for name, scale_name in zip(names, fp8_scale_names(layout.has_gate), strict=True):
        weight = getattr(module, name)
        scale = getattr(module, scale_name)
        record.bytes_after += weight.numel() * weight.element_size() + scale.numel() * scale.element_size()
        record.bytes_before += weight.numel() * 2  # what the same weights take in bfloat16
    return record


def record_of(module: torch.nn.Module) -> QuantizedExperts | None:
    return module.__dict__.get(RECORD_ATTR)


def weights_for(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]] | None:
    """(up, down, moe_experts keyword arguments) for a quantized block's call, or None (not quantized). Quantizes
    again first when a source parameter changed since (a new object or an in-place write; checked on eager calls)."""
    record = record_of(module)
    if record is None:
        return None
    up, down = record.names
    if record.fmt == "fp8-model":
        gated = up == "gate_up_proj"
        s_up, s_down = (getattr(module, n) for n in fp8_scale_names(gated))
        w_up, w_down = getattr(module, up), getattr(module, down)
        return w_up, w_down, {"is_transposed": record.transposed, "w_gate_up_scale": fp8_scale(s_up, w_up),
                              "w_down_scale": fp8_scale(s_down, w_down)}
    # eager calls only: under torch.compile a tensor's _version is data dynamo cannot guard on (compile after loading)
    if not torch.compiler.is_compiling() and any(record.sources.get(n) != _stamp(module._parameters[n])
                                                 for n in record.names):
        _fill(module, record)
    (q_up, s_up), (q_down, s_down) = record.weights[up], record.weights[down]
    return q_up, q_down, {"is_transposed": False, "w_gate_up_scale": s_up, "w_down_scale": s_down}


def install(module: torch.nn.Module, record: QuantizedExperts) -> None:
    module.__dict__[RECORD_ATTR] = record


def drop(module: torch.nn.Module) -> bool:
    """Remove the block's quantized copies (restore); True if it had any."""
    return module.__dict__.pop(RECORD_ATTR, None) is not None


# --- validation against the block's own layer ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What quantizing one block came to, for its report row."""

    quantized: str | None  # the format description, None when the block kept unquantized weights
    max_error: float | None
    bound: float | None
    bytes_before: int | None
    bytes_after: int | None
    why: str


def bound_for(record: QuantizedExperts, layout: ExpertsLayout, tolerance: float) -> float | None:
    """error_bound of a record whose weight errors are known (None for the model's own FP8 weights: their reference
    is the same weights dequantized, so the block is held to `tolerance` instead)."""
    if not record.errors:
        return None
    up, down = record.names
    return error_bound(record.errors[up], record.errors[down], gated=layout.has_gate, tolerance=tolerance)


def describe(record: QuantizedExperts, err: float | None, bound: float | None) -> str:
    saved = f"{record.bytes_before / 2**20:.1f} -> {record.bytes_after / 2**20:.1f} MiB"
    weights = ", ".join(f"{n} e={record.errors[n]:.1e}" for n in record.names if n in record.errors)
    check = "" if err is None else f"; error {err:.2e} vs bound {bound:.2e}"
    pages = f"; {record.pages}" if record.pages else ""
    return f"{DESCRIBE[record.fmt]} ({saved}{'; weights ' + weights if weights else ''}{check}{pages})"


def _scale(scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp8_scale of a block find.fp8_model_dtype accepted, so one that fits."""
    return cast(torch.Tensor, fp8_scale(scale, weight))


def fp8_reference(module: torch.nn.Module, layout: ExpertsLayout) -> ExpertsCall:
    """The fine-grained FP8 block's own computation on CPU, where its forward needs a GPU kernel: transformers'
    dequantization (`_dequantize_fp8_weight`) of each expert it routes to, in float32 (bfloat16 would round every
    weight once more, an error of its own), then FP8Experts' own gate and float32 combine, as fn(module, hidden,
    index, weights) with the result in the hidden states' dtype."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    up_name, down_name = ("gate_up_proj" if layout.has_gate else "up_proj"), "down_proj"
    s_up_name, s_down_name = fp8_scale_names(layout.has_gate)

    def reference(mod: Any, hidden: torch.Tensor, index: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden, dtype=torch.float32)
        dtype, hidden = hidden.dtype, hidden.float()
        for e in torch.unique(index).tolist():
            if e >= layout.num_experts:
                continue
            tok, slot = torch.where(index == e)
            w_up = _dequantize_fp8_weight(getattr(mod, up_name)[e], _scale(getattr(mod, s_up_name), getattr(
                mod, up_name))[e], list(mod.block_size), torch.float32)
            w_down = _dequantize_fp8_weight(getattr(mod, down_name)[e], _scale(getattr(mod, s_down_name), getattr(
                mod, down_name))[e], list(mod.block_size), torch.float32)
            h = torch.nn.functional.linear(hidden[tok], w_up)
            h = mod._apply_gate(h) if layout.has_gate else mod.act_fn(h)
            y = torch.nn.functional.linear(h, w_down)
            out.index_add_(0, tok, y * weights[tok, slot, None].float())
        return out.to(dtype)

    return reference


def kernel_takes_scales(kernel: ModuleType) -> tuple[bool, str]:
    """(can `kernel` run quantized experts, why not): it exports quantize and a moe_experts taking the scales."""
    import inspect

    missing = [name for name in EXPORTS if not callable(getattr(kernel, name, None))]
    if missing:
        return False, f"the kernel exports no {', '.join(missing)}"
    try:
        params = inspect.signature(kernel.moe_experts).parameters
    except (TypeError, ValueError):
        return False, "the kernel's moe_experts has no readable signature"
    if not {"w_gate_up_scale", "w_down_scale"} <= set(params):
        return False, "the kernel's moe_experts takes no w_gate_up_scale / w_down_scale"
    return True, ""


def apply_to_block(module: torch.nn.Module, layout: ExpertsLayout, fmt: str | None, kernel: ModuleType,
                   check: Callable[[], float], tolerance: float, validate: bool) -> Outcome | None:
    """Quantize one accepted block and check it against its own layer (`check()` -> relative error of the block's
    kernel call, which now reads the quantized copies, against the unquantized layer). None: nothing to quantize.
    A block over its bound, or whose quantized call raises, drops the copies and keeps the unquantized kernel."""
    if layout.weights == "fp8-model":
        record = record_of(module)
        assert record is not None
        return Outcome(DESCRIBE[record.fmt], None, None, record.bytes_before, record.bytes_after,
                       describe(record, None, None))
    if fmt is None:
        return None
    ok, why = kernel_takes_scales(kernel)
    if not ok:
        return Outcome(None, None, None, None, None, f"not quantized: {why}")
    record = quantize_block(module, layout, fmt, kernel.quantize, getattr(kernel, "advise_huge_pages", None))
    install(module, record)
    bound = bound_for(record, layout, tolerance)
    if not validate:
        return Outcome(DESCRIBE[fmt], None, bound, record.bytes_before, record.bytes_after,
                       describe(record, None, bound) + "; not validated (validate=False)")
    try:
        err = check()
    except Exception as exc:  # the quantized path must never break kernelize: the unquantized kernel stays
        drop(module)
        return Outcome(None, None, bound, None, None,
                       f"not quantized: the quantized kernel raised {type(exc).__name__}: {exc}")
    if not err <= bound:
        drop(module)
        return Outcome(None, err, bound, None, None,
                       f"not quantized: {fmt} error {err:.2e} > bound {bound:.2e} against the block's own layer")
    return Outcome(DESCRIBE[fmt], err, bound, record.bytes_before, record.bytes_after, describe(record, err, bound))


def register_fp8_interface(name: str, forward: ExpertsCall) -> None:
    """Register `forward` under `name` in transformers' FP8ExpertsInterface too: fine-grained FP8 expert blocks
    dispatch through that interface (its own mapping), not ExpertsInterface. Adds a name, edits no class."""
    try:
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8ExpertsInterface
    except ImportError:  # a transformers without fine-grained FP8: nothing to register
        return
    if ALL_FP8_EXPERTS_FUNCTIONS.get(name) is not forward:
        FP8ExpertsInterface.register(name, forward)
