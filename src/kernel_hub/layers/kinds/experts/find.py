"""The moe_experts kind's find job: which modules of a model are expert blocks, and each one's layout.

`find_experts` / `read_experts` return an `ExpertsSite` with either a layout the kernel can serve or the reason it
cannot. Layouts are read from the flags transformers' `@use_experts_implementation` puts on the instance
(is_transposed, is_concatenated, has_bias, has_gate, has_post_expert_norm) and checked against the parameter shapes;
modules without those flags are matched by shape only where the shapes leave no doubt. Decided from a module's class,
attributes and parameter shapes, never its numbers, and never by running anything: cheap, no framework imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ...sharded import local

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

#: What transformers' experts forward takes (positional, in this order).
EXPERTS_CALL = ("hidden_states", "top_k_index", "top_k_weights")
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")

#: transformers' fine-grained FP8 block size (weights and `*_scale_inv`), the only one the kernel takes.
BLOCK = 128


def fp8_scale_names(gated: bool) -> tuple[str, str]:
    return ("gate_up_proj_scale_inv" if gated else "up_proj_scale_inv"), "down_proj_scale_inv"


def fp8_model_dtype(module: torch.nn.Module, gated: bool) -> tuple[str | None, str]:
    """(the compute dtype name, why) when `module` is a fine-grained FP8 expert block the kernel runs on its own
    weights: float8_e4m3fn weights with float32 128x128 `*_scale_inv`, nn.Linear-style; (None, why not) otherwise."""
    up = getattr(module, "gate_up_proj" if gated else "up_proj", None)
    down = getattr(module, "down_proj", None)
    if {str(getattr(up, "dtype", None)), str(getattr(down, "dtype", None))} != {"torch.float8_e4m3fn"}:
        return None, "not float8_e4m3fn experts"
    if tuple(getattr(module, "block_size", None) or ()) != (BLOCK, BLOCK):
        return None, f"float8 experts with block_size {getattr(module, 'block_size', None)} (the kernel takes 128x128)"
    for name, weight in zip(fp8_scale_names(gated), (up, down), strict=True):
        scale = getattr(module, name, None)
        if str(getattr(scale, "dtype", None)) != "torch.float32" or len(getattr(scale, "shape", ())) != 3:
            return None, f"float8 experts whose {name} is not a float32 [E, out/128, in/128] tensor"
        if fp8_scale(cast("torch.Tensor", scale), cast("torch.Tensor", weight)) is None:  # tensors: dtypes checked
            return None, f"float8 experts whose {name} {list(scale.shape)} does not fit {list(weight.shape)}"
    config = getattr(module, "config", None)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).replace("torch.", "") if dtype is not None else "bfloat16"
    return (name if name in ("bfloat16", "float32") else "bfloat16"), "float8_e4m3fn weights with 128x128 scales"


def fp8_scale(scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """A weight_scale_inv [E, ceil(out/128), ceil(in/128)] for weight [E, out, in]; transformers allocates at least
    two output rows for a fused gate_up (min_sf_out=2), of which only ceil(out/128) are used: cut to those."""
    e, out, inp = weight.shape
    want = (e, -(-out // BLOCK), -(-inp // BLOCK))
    if tuple(scale.shape) == want:
        return scale
    if scale.shape[0] == e and scale.shape[2] == want[2] and scale.shape[1] > want[1] and want[1] == 1:
        return scale[:, :1]
    return None


@dataclass(frozen=True)
class ExpertsLayout:
    """How one expert block stores its weights; everything moe_experts needs besides the tensors."""

    num_experts: int
    hidden_size: int
    intermediate_size: int
    is_transposed: bool  # gate_up [E,H,2I] / down [E,I,H] instead of [E,2I,H] / [E,H,I]
    is_concatenated: bool  # [gate; up] halves, else interleaved g0,u0,g1,u1
    has_gate: bool  # gate_up_proj (gated) vs up_proj (plain activation)
    has_bias: bool
    has_post_expert_norm: bool
    dtype: str  # the dtype the block computes in (its weights' own, unless `weights` says they are quantized)
    weights: str = "dense"  # "fp8-model": float8_e4m3fn weights with 128x128 scales (quantize.py)

    def describe(self) -> str:
        parts = [
            "[E,H,2I]" if self.is_transposed else "[E,2I,H]",
            "gate/up concatenated" if self.is_concatenated else "gate/up interleaved",
        ]
        if not self.has_gate:
            parts[1] = "ungated"
        if self.has_bias:
            parts.append("bias")
        if self.has_post_expert_norm:
            parts.append("post-norm")
        if self.weights != "dense":
            parts.append(self.weights)
        return ", ".join(parts)


@dataclass(frozen=True)
class ExpertsSite:
    """One expert block found in a model: where it is, how to hook it, and whether we can."""

    path: str
    class_name: str
    route: str | None  # "interface" (ExpertsInterface), "forward" (instance forward), None: keep
    layout: ExpertsLayout | None
    reason: str  # why this route, or why it is kept

    @property
    def supported(self) -> bool:
        return self.route is not None and self.layout is not None


def _shape(t: object) -> tuple[int, ...] | None:
    shape = getattr(local(t), "shape", None)  # a sharded weight: this rank's slice, what its forward runs on
    return tuple(shape) if shape is not None else None


def routes_through_interface(module: torch.nn.Module) -> bool:
    """True when the class's forward is transformers' ExpertsInterface dispatcher."""
    forward = type(module).forward
    return (
        hasattr(forward, "__wrapped__")
        and hasattr(module, "has_gate")
        and hasattr(module, "is_transposed")
        and hasattr(getattr(module, "config", None), "_experts_implementation")
    )


def looks_like_experts(module: torch.nn.Module) -> bool:
    """3-D stacked expert weights: an up (or gate_up) projection and a down projection."""
    up = getattr(module, "gate_up_proj", None)
    if up is None:
        up = getattr(module, "up_proj", None)
    down = getattr(module, "down_proj", None)
    return len(_shape(up) or ()) == 3 and len(_shape(down) or ()) == 3


def forward_signature_matches(forward: Callable[..., object]) -> tuple[bool, str]:
    """Does `forward` take exactly (hidden_states, top_k_index, top_k_weights) positionally?"""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError) as exc:
        return False, f"forward has no readable signature ({exc})"
    if params and params[0].name == "self":
        params = params[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra_required = [
        p for p in params if p.default is p.empty and p.kind in (p.KEYWORD_ONLY,)
    ]
    if len(positional) != 3 or extra_required or any(
        p.kind in (p.VAR_POSITIONAL,) for p in params
    ):
        names = ", ".join(p.name for p in params)
        return False, f"forward({names}) does not take (hidden_states, top_k_index, top_k_weights)"
    return True, "forward(" + ", ".join(p.name for p in positional) + ")"


def _dtype_name(t: object) -> str:
    return str(getattr(t, "dtype", "?")).replace("torch.", "")


def _hidden_size(module: torch.nn.Module) -> int | None:
    for name in ("hidden_dim", "hidden_size"):
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    config = getattr(module, "config", None)
    value = getattr(config, "hidden_size", None)
    return value if isinstance(value, int) else None


def _check_shapes(
    up: tuple[int, ...], down: tuple[int, ...], transposed: bool, gated: bool
) -> tuple[tuple[int, int, int] | None, str]:
    """(E, H, I) from the shapes under a given layout, or why they do not fit it."""
    e = up[0]
    if down[0] != e:
        return None, f"gate_up has {e} experts but down_proj has {down[0]}"
    if transposed:
        h, up_out = up[1], up[2]
        i, h2 = down[1], down[2]
    else:
        up_out, h = up[1], up[2]
        h2, i = down[1], down[2]
    if h != h2:
        return None, f"hidden sizes disagree: {h} vs {h2}"
    if up_out != (2 * i if gated else i):
        return None, f"up projection width {up_out} does not match {'2x ' if gated else ''}{i}"
    return (e, h, i), ""


def read_experts(module: torch.nn.Module, path: str) -> ExpertsSite:
    """Decide how (or whether) the kernel can serve the expert block `module` found at `path`."""
    name = type(module).__name__

    def keep(reason: str) -> ExpertsSite:
        return ExpertsSite(path, name, None, None, reason)

    interface = routes_through_interface(module)
    if interface:
        gated = bool(module.has_gate)
        transposed = bool(module.is_transposed)
        concatenated = bool(getattr(module, "is_concatenated", True))
        has_bias = bool(getattr(module, "has_bias", False))
        post_norm = bool(getattr(module, "has_post_expert_norm", False))
    else:
        ok, why = forward_signature_matches(type(module).forward)
        if not ok:
            return keep(why)
        gated = getattr(module, "gate_up_proj", None) is not None
        concatenated, post_norm = True, False
        has_bias = getattr(module, "gate_up_proj_bias", None) is not None
        transposed = None  # read from the shapes below

    up = getattr(module, "gate_up_proj" if gated else "up_proj", None)
    down = getattr(module, "down_proj", None)
    up_shape, down_shape = _shape(up), _shape(down)
    if up_shape is None or down_shape is None or len(up_shape) != 3 or len(down_shape) != 3:
        return keep("no 3-D expert weights (gate_up_proj/up_proj and down_proj)")
    dtype = _dtype_name(up)
    fp8_dtype, _ = fp8_model_dtype(module, gated)  # transformers' fine-grained FP8 experts run on their own bytes
    if fp8_dtype is not None:
        dtype = fp8_dtype
    elif dtype not in SUPPORTED_DTYPES or _dtype_name(down) != dtype:
        return keep(f"weights are {dtype}/{_dtype_name(down)}; the kernel takes float32, bfloat16, float16")
    if has_bias and (
        getattr(module, "gate_up_proj_bias" if gated else "up_proj_bias", None) is None
        or getattr(module, "down_proj_bias", None) is None
    ):
        return keep("has_bias is set but a bias parameter is missing")

    if transposed is None:  # no flags: the shapes must decide, unambiguously
        hidden = _hidden_size(module)
        fits = {t: _check_shapes(up_shape, down_shape, t, gated)[0] for t in (False, True)}
        if hidden is not None:
            fits = {t: v for t, v in fits.items() if v is not None and v[1] == hidden}
        fits = {t: v for t, v in fits.items() if v is not None}
        if len(fits) != 1:
            return keep(f"weight layout is ambiguous from shapes {up_shape} / {down_shape}")
        transposed = next(iter(fits))
        if not hasattr(module, "_apply_gate") and getattr(module, "act_fn", None) is None:
            return keep("no act_fn or _apply_gate to gate with")
    dims, why = _check_shapes(up_shape, down_shape, transposed, gated)
    if dims is None:
        return keep(f"shapes do not match the declared layout: {why}")
    declared = getattr(module, "num_experts", None)
    if isinstance(declared, int) and declared != dims[0]:
        return keep(f"num_experts={declared} but the weights hold {dims[0]} experts")
    if not gated and getattr(module, "act_fn", None) is None:
        return keep("ungated experts without act_fn")

    layout = ExpertsLayout(
        num_experts=dims[0],
        hidden_size=dims[1],
        intermediate_size=dims[2],
        is_transposed=transposed,
        is_concatenated=concatenated,
        has_gate=gated,
        has_bias=has_bias,
        has_post_expert_norm=post_norm,
        dtype=dtype,
        weights="fp8-model" if fp8_dtype is not None else "dense",
    )
    if interface:
        return ExpertsSite(path, name, "interface", layout, "routes through transformers' ExpertsInterface")
    return ExpertsSite(path, name, "forward", layout, "no ExpertsInterface: instance forward replaced")


def find_experts(model: torch.nn.Module) -> list[ExpertsSite]:
    """Every expert block in `model` (outermost only: nothing inside a found block is searched)."""
    sites: list[ExpertsSite] = []
    taken: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in taken):
            continue
        if routes_through_interface(module) or looks_like_experts(module):
            sites.append(read_experts(module, path))
            taken.append(path)
    return sites


def top_k_of(config: PretrainedConfig | None, num_experts: int) -> int:
    """Experts per token from the model config (names vary by family), for validation batches."""
    for name in ("num_experts_per_tok", "top_k_experts", "moe_topk", "top_k", "experts_per_token",
                 "num_experts_per_token", "moe_top_k"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return min(value, num_experts)
    return min(2, num_experts)
