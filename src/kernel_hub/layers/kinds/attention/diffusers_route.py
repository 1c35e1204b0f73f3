"""The Diffusers adapter of the attention kind at call time: the attention processor kernelize installs on a
Diffusers attention module, and the pure decision that turns one `scaled_dot_product_attention` call into kernel
arguments.

Why a wrapping processor: Diffusers' dispatcher registry is keyed by the closed enum `AttentionBackendName`
and `set_attention_backend` refuses any other name, so a new backend cannot be registered without patching
Diffusers; and SD3-style processors call `F.scaled_dot_product_attention` directly, past the dispatcher.
So kernelize uses the processor API (`module.set_processor`): `AttentionRoute` runs the module's own
processor unchanged (projections, norms, rotary, joint concatenation, output split) inside a torch function
mode that hands its `scaled_dot_product_attention` calls (what Diffusers' default "native" backend and the
SD3-style processors call, q/k/v [B, H, S, D]) to the kernel. A call the kernel cannot express runs torch's
own with the same arguments. No Diffusers class is edited; restore puts the original processor object back.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ....verify.numerics import relative_error
from ...swap import CallCounts
from ...weights_guard import KernelRefused, check_output, held_weights

SDPA = torch.nn.functional.scaled_dot_product_attention
_SDPA_SIGNATURE = inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
    for name, default in (("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
                          ("value", inspect.Parameter.empty), ("attn_mask", None), ("dropout_p", 0.0),
                          ("is_causal", False), ("scale", None), ("enable_gqa", False))
])


@dataclass(frozen=True)
class SdpaCallPlan:
    """Kernel arguments for one call; `batched=False` means 3-D q/k/v ([N, S, D], run as [1, N, S, D])."""

    causal: bool
    scale: float | None
    kv_lengths: torch.Tensor | None = None  # [B] keys each sequence attends (a prefix, after key_order); None: all
    batched: bool = True
    key_order: torch.Tensor | None = None  # [B, Skv] key positions, kept keys first; None: keys as they are


def _key_lengths(mask: torch.Tensor, b: int, h: int, sq: int, skv: int
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, str]:
    """(per-sequence key count, key order, "") for a key-padding mask (the same for every head and query row), or
    (None, None, why the kernel cannot express it). Keys that are not a prefix (Qwen-Image pads its text tokens,
    which sit before the image tokens) come with an order that moves the kept keys first: exact for the non-causal
    attention such masks reach this with (no position of a key enters the softmax; only the summation order moves)."""
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.dtype.is_floating_point:
        keep = mask == 0
        dropped = mask <= torch.finfo(mask.dtype).min / 2  # includes -inf
        if not bool((keep | dropped).all()):
            return None, None, "additive mask with bias values"
    else:
        return None, None, f"{mask.dtype} attention mask"
    if keep.dim() > 4:
        return None, None, f"{keep.dim()}-D attention mask"
    keep = keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape))
    try:
        keep = keep.expand(b, h, sq, skv)
    except RuntimeError:
        return None, None, f"mask {tuple(mask.shape)} does not broadcast to attention ({b}, {h}, {sq}, {skv})"
    keys = keep[:, 0, 0, :]
    if not bool((keep == keys[:, None, None, :]).all()):
        return None, None, "mask differs across heads or query rows (not a key-padding mask)"
    lengths = keys.sum(-1)
    if not bool((lengths > 0).all()):
        return None, None, "a sequence with no key to attend (sdpa gives NaN there)"
    prefix = torch.arange(skv, device=keys.device)[None, :] < lengths[:, None]
    order = None
    if not bool((keys == prefix).all()):
        order = torch.argsort((~keys).to(torch.int8), dim=-1, stable=True)  # kept keys first, in their order
    if bool((lengths == skv).all()):
        return None, None, ""
    return lengths.to(torch.int32), order, ""


def plan_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> tuple[SdpaCallPlan | None, str]:
    """Pure decision for one `scaled_dot_product_attention` call: (kernel plan, "") or (None, why torch's
    own runs). The kernel computes exactly what sdpa would on every row where it runs."""
    if dropout_p:
        return None, "attention dropout"
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        return None, "q/k/v are not tensors"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return None, f"{query.dim()}-D query with {key.dim()}-D key"
    if not query.dtype.is_floating_point or not (query.dtype == key.dtype == value.dtype):
        return None, f"q/k/v dtypes {query.dtype}/{key.dtype}/{value.dtype}"
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        return None, "value head size differs from the query/key head size"
    if key.shape[:-1] != value.shape[:-1]:
        return None, "key and value shapes differ"
    batched = query.dim() == 4
    q_shape = tuple(query.shape) if batched else (1, *query.shape)
    k_shape = tuple(key.shape) if batched else (1, *key.shape)
    (b, hq, sq, _), (bk, hkv, skv, _) = q_shape, k_shape
    if b != bk:
        return None, f"query batch {b} and key batch {bk} differ"
    if hq != hkv and not (enable_gqa and hkv and hq % hkv == 0):
        return None, f"{hq} query heads over {hkv} key heads without enable_gqa"
    if is_causal and (attn_mask is not None or sq != skv):
        return None, "causal with a mask or fewer queries than keys (sdpa aligns top-left, the kernel bottom-right)"
    lengths = order = None
    if attn_mask is not None:  # never with is_causal (refused above): reordering keys is exact here
        if not isinstance(attn_mask, torch.Tensor):
            return None, f"{type(attn_mask).__name__} attention mask"
        lengths, order, why = _key_lengths(attn_mask, b, hq, sq, skv)
        if why:
            return None, why
    return SdpaCallPlan(causal=bool(is_causal), scale=None if scale is None else float(scale), kv_lengths=lengths,
                batched=batched, key_order=order), ""


def run_plan(flash: Callable[..., torch.Tensor], plan: SdpaCallPlan, query, key, value) -> torch.Tensor:
    """The kernel on one call under `plan`, in sdpa's output layout."""
    if not plan.batched:
        query, key, value = query[None], key[None], value[None]
    if plan.key_order is not None:
        index = plan.key_order[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
        key, value = torch.gather(key, 2, index), torch.gather(value, 2, index)
    out = flash(query, key, value, causal=plan.causal, sm_scale=plan.scale, kv_lengths=plan.kv_lengths)
    return out if plan.batched else out[0]


@dataclass
class SdpaProbe:
    """Validation: each call runs torch's sdpa and the kernel on the same arguments, records the error and
    returns torch's result (so validation never changes what the module computes)."""

    errors: list[float] = field(default_factory=list)
    failure: str = ""
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # (q, k) per call


class _SdpaMode(TorchFunctionMode):
    """Routes `scaled_dot_product_attention` to `handler(args, kwargs)`; every other torch call runs as is."""

    def __init__(self, handler: Callable[[tuple, dict], torch.Tensor]):
        super().__init__()
        self._handler = handler

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is SDPA:
            return self._handler(args, kwargs or {})
        return func(*args, **(kwargs or {}))


class _SignedCall:
    """`route.__call__` as Diffusers' signature check sees it: the original processor's parameters."""

    def __init__(self, route: AttentionRoute):
        self.route = route

    def __call__(self, attn: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        return self.route._run(attn, args, kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.route.original.__call__)


class AttentionRoute(CallCounts):
    """Processor installed by kernelize: the module's own processor, its sdpa calls on `flash`.

    `calls` counts calls the kernel served, `fallbacks` those that ran torch's sdpa (`last_fallback` says
    why). Attribute reads it does not own, and Diffusers' `_attention_backend` / `_parallel_config`
    writes, go to the original processor, so `set_attention_backend` and context-parallel set-up still
    reach it."""

    def __init__(self, original: Any, flash: Callable[..., torch.Tensor]):
        self.original = original
        self.flash = flash
        self.probe: SdpaProbe | None = None
        self.calls = 0
        self.fallbacks = 0
        self.last_fallback = ""
        # Attention modules filter the kwargs they pass by `inspect.signature(processor.__call__)`: an instance
        # attribute wins that lookup (the call itself goes through the class's __call__).
        self.__dict__["__call__"] = _SignedCall(self)

    def __call__(self, attn: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        return self._run(attn, args, kwargs)

    def _run(self, attn: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        with _SdpaMode(lambda a, k: self._sdpa(a, k, attn)):
            return self.original(attn, *args, **kwargs)

    def _sdpa(self, args: tuple, kwargs: dict, attn: torch.nn.Module | None = None) -> torch.Tensor:
        try:
            bound = _SDPA_SIGNATURE.bind(*args, **kwargs)
        except TypeError as exc:  # an sdpa argument this decision does not know
            plan, why = None, f"sdpa arguments: {exc}"
        else:
            bound.apply_defaults()
            plan, why = plan_sdpa(**bound.arguments)
        probe = self.probe
        if probe is not None:
            ref = SDPA(*args, **kwargs)
            if plan is None:
                probe.failure = probe.failure or f"validation call fell back: {why}"
                return ref
            q, k = bound.arguments["query"], bound.arguments["key"]
            probe.shapes.append((tuple(q.shape), tuple(k.shape)))
            try:
                # a kernel that wrote to the model's weights or its inputs is undone and refused
                v = bound.arguments["value"]
                with (held_weights(attn, inputs={"query": q, "key": k, "value": v}) if attn is not None
                      else contextlib.nullcontext()):
                    out = run_plan(self.flash, plan, q, k, v)
                check_output(out, ref, "the layer's attention")
            except KernelRefused as exc:
                probe.failure = probe.failure or str(exc)
                return ref
            except Exception as exc:  # kernelize keeps the layer with this reason
                probe.failure = probe.failure or f"kernel raised in validation: {type(exc).__name__}: {exc}"
                return ref
            probe.errors.append(relative_error(out, ref))
            return ref
        if plan is None:
            self.fell_back(why)
            return SDPA(*args, **kwargs)
        self.served()
        return run_plan(self.flash, plan, bound.arguments["query"], bound.arguments["key"], bound.arguments["value"])

    # Diffusers sets these on every attention processor (set_attention_backend, enable_parallelism).
    @property
    def _attention_backend(self) -> object:
        return getattr(self.original, "_attention_backend", None)

    @_attention_backend.setter
    def _attention_backend(self, value: object) -> None:
        self.original._attention_backend = value  # type: ignore[attr-defined]  # a Diffusers processor's own

    @property
    def _parallel_config(self) -> object:
        return getattr(self.original, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, value: object) -> None:
        self.original._parallel_config = value  # type: ignore[attr-defined]  # a Diffusers processor's own

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("original")
        if original is None or name.startswith("__"):  # unpickling / copying: no original yet
            raise AttributeError(name)
        return getattr(original, name)

    def __repr__(self) -> str:
        return f"AttentionRoute({self.original!r})"
