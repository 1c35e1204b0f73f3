"""transformers' experts-function convention on the ragged dot: `experts_forward(self, hidden_states, top_k_index,
top_k_weights) -> [T, H]`, what `ALL_EXPERTS_FUNCTIONS.register(name, k.experts_forward)` and
`from_pretrained(..., experts_implementation=name)` plug into every transformers MoE model.

`self` is the model's experts module; its layout is what transformers' `use_experts_implementation` records on it
(has_gate, is_concatenated, is_transposed, has_bias, has_post_expert_norm) plus its own weights, biases, `act_fn` and
`_apply_gate`. `read_layout` turns that into one `BlockLayout` or raises one NotImplementedError naming what it cannot
compute: a module without those flags, a post-expert norm, weights that are not dense float [E, ., .] tensors of
matching shapes, missing biases, or a gate / activation that is none of the known ones. The gate is recognised by its
numbers: the module's own `_apply_gate` (or `act_fn` when ungated) runs on a fixed float32 probe and must equal one
of the known forms ("glu": act(gate) * up with act silu / exact gelu / tanh gelu / relu, halves stacked or
interleaved; "clamped_swiglu": GPT-OSS's, with the module's `alpha` and `limit`), so a custom gate is never replaced
by a different one. The answer is kept per module while its class, flags, gate and activation stay the same.

Where it runs: "torch" (CPU default) is the package's `moe_experts` with the module's own gate; "jax" (TPU default)
is moe/transformers_experts.py's whole block as one function: on TPU tensors the op
`<namespace>::experts_forward` (`experts_forward_bias` with biases) that the torch-tpu build registers through
torch_tpu's jax_op (routing sort, both ragged dots, biases, gate, routing weights, combine: one op per layer), on
CPU/CUDA through DLPack. Expert-parallel sentinels (ids >= E, transformers' `num_experts` for another rank's
experts) are never computed and contribute zero on both.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ._vendor.torch_dispatch import TorchDispatch
from ._vendor.torch_tpu_ops import op_namespace, package_digest
from .release import VERSION

#: The layout flags transformers' `use_experts_implementation` sets on an experts module.
FLAGS = ("has_gate", "is_concatenated", "is_transposed", "has_bias")
#: Activations recognised by their numbers (the names moe/experts.py ACTIVATIONS gives the same functions).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_exact": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: How close the module's gate must come to a known form on the probe (relative to the probe's largest value).
PROBE_TOLERANCE = 1e-5

_NAMESPACE = op_namespace("ragged_dot", VERSION, package_digest(Path(__file__).parent))
DISPATCH = TorchDispatch("experts_forward", native=lambda: "torch-native expert block (moe_experts, module's gate)",
                         tpu_op=f"{_NAMESPACE}::experts_forward")


@dataclass(frozen=True)
class BlockLayout:
    """What experts_forward computes for one experts module (besides its tensors)."""

    up: str  # "gate_up_proj" (gated) or "up_proj"
    is_transposed: bool
    has_gate: bool
    has_bias: bool
    gate_kind: str  # "glu", "clamped_swiglu" or "none" (ungated: act(up))
    concatenated: bool  # gate/up halves stacked (True) or interleaved, as the module's gate reads them
    activation: str  # a key of ACTIVATIONS ("" for clamped_swiglu, which has its own)
    alpha: float = 0.0
    limit: float = 0.0

    def describe(self) -> str:
        parts = ["[E,H,2I]" if self.is_transposed else "[E,2I,H]", self.gate_kind]
        if self.gate_kind != "none":
            parts.append("concatenated" if self.concatenated else "interleaved")
        if self.activation:
            parts.append(self.activation)
        if self.has_bias:
            parts.append("bias")
        return ", ".join(parts)


def _refuse(module: Any, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"experts_forward (kernel-hub ragged dot) cannot compute {type(module).__name__}: {what}. It computes "
        "transformers' experts modules (use_experts_implementation) with dense float weights, a 'glu' gate "
        f"({', '.join(ACTIVATIONS)}; halves stacked or interleaved), GPT-OSS's clamped SwiGLU, or an ungated "
        "activation, with or without biases; run this model with another experts_implementation")


def _weight(module: Any, name: str) -> torch.Tensor:
    w = getattr(module, name, None)
    if not isinstance(w, torch.Tensor) or w.ndim != 3 or w.dtype not in FLOAT_DTYPES:
        got = "nothing" if w is None else \
            f"{type(w).__name__} {getattr(w, 'dtype', '')} {tuple(getattr(w, 'shape', ()))}"
        raise _refuse(module, f"{name} is not a dense float32/bfloat16/float16 [experts, ., .] tensor (got {got})")
    return w


def _probe(width: int) -> torch.Tensor:
    """A fixed float32 probe spanning [-10, 10] (past GPT-OSS's clamp at 7), `width` columns (the module's own up
    projection width, so a gate written for its sizes runs on it)."""
    return torch.linspace(-10.0, 10.0, 4 * width, dtype=torch.float32).reshape(4, width)


def _close(got: Any, want: torch.Tensor) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    got = got.detach().float().cpu()
    return bool(torch.isfinite(got).all()) and bool(
        (got - want).abs().max() <= PROBE_TOLERANCE * max(1.0, float(want.abs().max())))


def _gate_forms(module: Any, flag_concatenated: bool) -> list[tuple[str, bool, str, float, float]]:
    """Candidate gates (kind, concatenated, activation, alpha, limit), the flag's split first."""
    splits = (flag_concatenated, not flag_concatenated)
    forms = [("glu", c, a, 0.0, 0.0) for c in splits for a in ACTIVATIONS]
    alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
    if isinstance(alpha, int | float) and isinstance(limit, int | float) and not isinstance(alpha, bool):
        forms += [("clamped_swiglu", c, "", float(alpha), float(limit)) for c in splits]
    return forms


def _form(h: torch.Tensor, kind: str, concatenated: bool, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """The known gate forms in torch, float32 (moe/transformers_experts.py `gate` is the same in JAX)."""
    g, u = h.chunk(2, dim=-1) if concatenated else (h[..., 0::2], h[..., 1::2])
    if kind == "glu":
        return ACTIVATIONS[activation](g) * u
    g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return (u + 1) * (g * torch.sigmoid(g * alpha))


def _run_probe(module: Any, fn: Any, what: str, probe: torch.Tensor) -> torch.Tensor:
    """The module's own gate or activation on the probe; one refusal naming it when it cannot run there."""
    try:
        with torch.no_grad():
            return fn(probe)
    except Exception as exc:
        raise _refuse(module, f"its {what} does not run on a float32 CPU probe ({type(exc).__name__}: {exc})") \
            from None


def _recognise_gate(module: Any, concatenated: bool, width: int) -> tuple[str, bool, str, float, float]:
    gate = getattr(module, "_apply_gate", None)
    if not callable(gate):
        raise _refuse(module, "has_gate is set but it has no _apply_gate")
    probe = _probe(width)
    got = _run_probe(module, gate, "_apply_gate", probe)
    for form in _gate_forms(module, concatenated):
        if _close(got, _form(probe, *form)):
            return form
    raise _refuse(module, f"its gate ({type(module).__name__}._apply_gate, act_fn "
                          f"{type(getattr(module, 'act_fn', None)).__name__}) matches none of the known forms")


def _recognise_activation(module: Any, width: int) -> str:
    act = getattr(module, "act_fn", None)
    if not callable(act):
        raise _refuse(module, "it is ungated (has_gate=False) but has no act_fn")
    probe = _probe(width)
    got = _run_probe(module, act, "act_fn", probe)
    for name, fn in ACTIVATIONS.items():
        if _close(got, fn(probe)):
            return name
    raise _refuse(module, f"its activation {type(act).__name__} is none of {', '.join(ACTIVATIONS)}")


def _fingerprint(module: Any) -> tuple[Any, ...]:
    """What the recognised layout depends on besides the tensors (their shapes are checked on every call)."""
    gate = getattr(module, "_apply_gate", None)
    return (type(module), tuple(getattr(module, f, None) for f in (*FLAGS, "has_post_expert_norm")),
            getattr(gate, "__func__", gate), id(getattr(module, "act_fn", None)), getattr(module, "alpha", None),
            getattr(module, "limit", None))


_KNOWN: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], BlockLayout]] = weakref.WeakKeyDictionary()


def _check_shapes(module: Any, flags: dict[str, bool], up: torch.Tensor, down: torch.Tensor) -> int:
    """The up projection's output width, once the weights (and biases) fit one another; NotImplementedError else."""
    gated, transposed = flags["has_gate"], flags["is_transposed"]
    e = up.shape[0]
    up_in, up_out = (up.shape[1], up.shape[2]) if transposed else (up.shape[2], up.shape[1])
    down_in, down_out = (down.shape[1], down.shape[2]) if transposed else (down.shape[2], down.shape[1])
    inter = up_out // 2 if gated else up_out
    if down.shape[0] != e or down_out != up_in or down_in != inter or (gated and up_out % 2) \
            or down.dtype != up.dtype:
        raise _refuse(module, f"its weights {'gate_up_proj' if gated else 'up_proj'} {tuple(up.shape)} and down_proj "
                              f"{tuple(down.shape)} ({up.dtype}, {down.dtype}) do not fit one another with "
                              f"is_transposed={transposed}, has_gate={gated}")
    if flags["has_bias"]:
        name = "gate_up_proj_bias" if gated else "up_proj_bias"
        ub, db = getattr(module, name, None), getattr(module, "down_proj_bias", None)
        if (not isinstance(ub, torch.Tensor) or tuple(ub.shape) != (e, up_out)
                or not isinstance(db, torch.Tensor) or tuple(db.shape) != (e, down_out)):
            raise _refuse(module, f"has_bias is set but {name} / down_proj_bias are not [{e}, {up_out}] and "
                                  f"[{e}, {down_out}]")
    return up_out


def read_layout(module: Any) -> BlockLayout:
    """The module's BlockLayout, or one NotImplementedError naming what experts_forward cannot compute."""
    flags = {f: getattr(module, f, None) for f in FLAGS}
    missing = [f for f, v in flags.items() if not isinstance(v, bool)]
    if missing:
        raise _refuse(module, f"it carries no use_experts_implementation layout ({', '.join(missing)} missing)")
    if getattr(module, "has_post_expert_norm", False):
        raise _refuse(module, "has_post_expert_norm=True (a norm after each expert)")
    up = "gate_up_proj" if flags["has_gate"] else "up_proj"
    width = _check_shapes(module, flags, _weight(module, up), _weight(module, "down_proj"))  # on every call
    fingerprint = (*_fingerprint(module), width)
    known = _KNOWN.get(module)
    if known is None or known[0] != fingerprint:
        if flags["has_gate"]:
            kind, concatenated, activation, alpha, limit = _recognise_gate(module, flags["is_concatenated"], width)
        else:
            kind, concatenated, activation, alpha, limit = "none", True, _recognise_activation(module, width), 0.0, 0.0
        layout = BlockLayout(up, flags["is_transposed"], flags["has_gate"], flags["has_bias"], kind, concatenated,
                             activation, alpha, limit)
        _KNOWN[module] = known = (fingerprint, layout)
    return known[1]


def _biases(module: Any, layout: BlockLayout) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not layout.has_bias:
        return None, None
    return getattr(module, "gate_up_proj_bias" if layout.has_gate else "up_proj_bias"), module.down_proj_bias


def _torch_block(module: Any, layout: BlockLayout, hidden: torch.Tensor, index: torch.Tensor,
                 weights: torch.Tensor) -> torch.Tensor:
    """The package's moe_experts (resolved through the package, so its dispatch records the call) with the module's
    own gate / activation."""
    moe_experts = importlib.import_module(__package__).moe_experts
    up_bias, down_bias = _biases(module, layout)
    gate = {"gate_fn": module._apply_gate} if layout.has_gate else {"act": module.act_fn}
    return moe_experts(hidden, index, weights, getattr(module, layout.up), module.down_proj,
                       gate_up_proj_bias=up_bias, down_proj_bias=down_bias, is_transposed=layout.is_transposed,
                       is_concatenated=layout.concatenated, has_gate=layout.has_gate, implementation="torch", **gate)


def _jax_block(module: Any, layout: BlockLayout, hidden: torch.Tensor, index: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor:
    """moe/transformers_experts.py's block: one TorchTPU op on TPU tensors, DLPack elsewhere."""
    from ._vendor.torch_jax import call_jax
    from ._vendor.torch_tpu_ops import on_tpu
    from .moe.transformers_experts import DIFFERENTIABLE, DIFFERENTIABLE_BIAS, experts_function

    up_bias, down_bias = _biases(module, layout)
    tensors: tuple[torch.Tensor, ...] = (hidden, index.to(torch.int32), weights, getattr(module, layout.up),
                                         module.down_proj)
    if up_bias is not None and down_bias is not None:
        tensors += (up_bias, down_bias)
    options = {"is_transposed": layout.is_transposed, "gate_kind": layout.gate_kind,
               "concatenated": layout.concatenated, "activation": layout.activation or "silu",
               "alpha": layout.alpha, "limit": layout.limit}
    bias = layout.has_bias
    if on_tpu(*tensors):
        from .torch_bridge import TPU_OPS

        return TPU_OPS.get("experts_forward_bias" if bias else "experts_forward")(*tensors, **options)
    return call_jax(experts_function(bias, None, None), tensors, options,
                    differentiable=DIFFERENTIABLE_BIAS if bias else DIFFERENTIABLE)


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    *, implementation: str | Sequence[str] | None = None) -> torch.Tensor:
    """transformers' experts function: the experts module `self` on hidden_states[T,H] routed by top_k_index[T,K]
    (ids >= E are expert-parallel sentinels: never computed, zero contribution) with top_k_weights[T,K] -> [T,H] in
    hidden_states' dtype. implementation: "torch" or "jax" (a name or a sequence tried in order; None: the device's
    order, CPU "torch" first, TPU "jax": one op per call). NotImplementedError for a layout it cannot compute."""
    layout = read_layout(self)

    def call(name: str) -> torch.Tensor:
        block = _torch_block if name == "torch" else _jax_block
        return block(self, layout, hidden_states, top_k_index, top_k_weights)

    return DISPATCH.run(hidden_states.device, implementation, call)
