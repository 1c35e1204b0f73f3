"""The transformers adapter of the attention kind: the attention implementation kernelize registers with
transformers, its mask function, the pure decision that turns the mask a layer receives into kernel arguments, and
the per-model config class that lets a kernelized model's config ask for attention weights.

"kernel_hub_flash" is registered in transformers' AttentionInterface, and in AttentionMaskInterface with a
mask function that delegates to the model's previous implementation's mask function (and "kernel_hub", the same
functions under a name `model.set_attn_implementation` accepts: transformers loads a flash-attn package for any
flash-named implementation it is asked to switch to, so kernelize sets the flash name on the configs itself). The name
says "flash" because transformers' continuous batching accepts no other custom implementation; its packed calls
(`cu_seq_lens_q/k`, no mask) and paged calls (`block_table`) are read in packed.py: every layer
gets exactly the mask its previous implementation would get, so a kept layer (or a call whose mask
the kernel cannot express) runs the previous implementation unchanged. For a hooked layer the mask is
read as: keys in one contiguous run per sequence, queries whose own token is a real key (or, under a static cache,
that attend any key) in one contiguous run, causal (bottom-right) and sliding window relative to those runs; the
runs become a per-sequence shift plus q/kv lengths. The candidate mask is checked against the received one on every
real query row, so the kernel only runs where it computes exactly what the mask says. Padding query
rows (whose own token is padding) come out 0.

Head sizes: multi-head latent attention (DeepSeek-V2/V3, Mistral 4, ...) calls with a value head size other than
the query/key one; the kernel takes one head size, so the smaller side is zero-padded (exact: zero q/k columns add
nothing to the logits, zero v columns only add output columns that are dropped) and the softmax scale is always
passed explicitly from the call (the module's `scaling`) or the unpadded q/k head size.

Sparse selections: under any implementation but "eager"/"sdpa", DeepSeek sparse attention models (mistral_large4,
glm_moe_dsa, deepseek_v32, hy_v4, dots3_note, axk2 in transformers 5.24) stop folding their indexer's top-k keys
into the mask and pass them as `indices` (`block_indices` for a block indexer) for a sparse kernel to consume.
Neither the kernel nor the previous implementation called under "kernel_hub" honours them, so such a call is never
run here: validation records it and kernelize leaves the whole model on its previous implementation.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ....errors import KernelHubError
from ....verify.numerics import relative_error
from ...swap import IMPLEMENTATION_NAME as SETTABLE_NAME
from ...swap import CallCounts
from ...weights_guard import KernelRefused, check_output, held_weights
from . import packed
from .contract import HOOK_ATTR, NAME

#: The implementation name kernelize switches a model's attention configs to (flash-named: continuous batching
#: accepts it); SETTABLE_NAME ("kernel_hub") runs the same functions and is the name set_attn_implementation takes.
IMPLEMENTATION_NAME = "kernel_hub_flash"
NAMES = (IMPLEMENTATION_NAME, SETTABLE_NAME)
LAYER_KIND = NAME  # the kind's name, as its report rows give it
#: kwargs the kernel cannot honour: a call carrying any of them (not None) runs the previous implementation.
UNSUPPORTED_KWARGS = ("position_bias", "cu_seq_lens_q", "cu_seq_lens_k", "head_mask")
#: kwargs carrying a sparse key selection a model masks only under "eager"/"sdpa" -> what they are.
SPARSE_KWARGS = {"indices": "DeepSeek sparse attention top-k key indices",
                 "block_indices": "block-sparse attention key-block indices"}

#: id(config) -> attention implementation before kernelize (what the mask function delegates to).
_PREVIOUS: dict[int, str | None] = {}


@dataclass
class AttentionHook(CallCounts):
    """What a kernelized attention module does; lives on the instance under HOOK_ATTR. Its counts: calls the kernel
    served, calls handed to the previous implementation (a mask / kwargs the kernel cannot express) and why."""

    flash: Callable[..., torch.Tensor] | None  # the kernel's torch flash_attention; None: layer kept
    previous: str | None
    packed: packed.PackedKernel | None = None  # its flash-attn functions for packed calls; None: layer kept


@dataclass(frozen=True)
class AttentionCallPlan:
    """Kernel arguments for one call: shifts move each sequence's real tokens to the front."""

    causal: bool
    window: int | None
    q_shift: torch.Tensor | None = None  # [B] first real query row
    kv_shift: torch.Tensor | None = None  # [B] first attended key
    q_lengths: torch.Tensor | None = None
    kv_lengths: torch.Tensor | None = None
    rows: torch.Tensor | None = None  # [B, Sq] real query rows (None: all)


@dataclass(frozen=True)
class HeadPad:
    """Zero columns that give q/k and v one head size (what the kernel takes); the output keeps `dv` columns."""

    qk: int  # columns added to q and k (value head larger)
    v: int  # columns added to v (value head smaller, e.g. DeepSeek-V3: q/k 192, v 128)
    dv: int
    scale: float  # the softmax scale of the unpadded call


@dataclass
class AttentionProbe:
    """Validation mode: each call runs the previous implementation and the kernel, records the error."""

    flash: Callable[..., torch.Tensor]
    errors: dict[int, list[float]] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    sparse: dict[int, str] = field(default_factory=dict)  # layers whose calls carry a sparse selection: why


#: id(config) -> the probe of the kernelize run validating the model that holds that config. Per model, not per
#: process: kernelize gives each model private config copies, so two models validated at once (two threads, two
#: asyncio tasks) each feed their own probe, and another model's forward meanwhile is never probed. A dict keyed by
#: config id, like _PREVIOUS, is also what torch.compile traces without a graph break (a ContextVar it cannot).
_PROBES: dict[int, AttentionProbe] = {}
_log = logging.getLogger(__name__)
_weights_logged = False


def attention_weights_requested(kwargs: dict[str, Any]) -> bool:
    """Whether this call's caller asked for attention weights: an `output_attentions` kwarg, or transformers' output
    capture collecting "attentions" for the forward now running (read outside torch.compile only: dynamo cannot
    trace the ContextVar, and a compiled graph asking for weights is traced with them off)."""
    if kwargs.get("output_attentions"):
        return True
    if torch.compiler.is_compiling():
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capture passes output_attentions instead
        return False
    try:
        collected = _active_collector.get()
    except LookupError:  # no capturing forward is running
        return False
    return isinstance(collected, dict) and "attentions" in collected


def materialized_mask(query: torch.Tensor, key: torch.Tensor, *, causal: bool,
                      window: int | None) -> torch.Tensor | None:
    """The additive [1, 1, Sq, Skv] mask a call without one means (causal bottom-right, sliding window), for the eager
    attention: the previous implementation's mask function may hand None to a layer that masks by `is_causal`
    (sdpa), and eager attention would then attend every key. None where nothing is masked."""
    if not causal and window is None:
        return None
    sq, skv = query.shape[2], key.shape[2]
    i = torch.arange(sq, device=query.device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=query.device)[None, :]
    keep = j <= i if causal else torch.ones(sq, skv, dtype=torch.bool, device=query.device)
    if window is not None:
        keep &= j > i - window
    bias = torch.zeros(sq, skv, dtype=query.dtype, device=query.device)
    return bias.masked_fill(~keep, torch.finfo(query.dtype).min)[None, None]


def eager_mask(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, attention_mask: Any,
               kwargs: dict[str, Any]) -> Any:
    """The mask as eager attention reads it: additive, in the query's dtype. Under "kernel_hub" the model builds the
    previous implementation's mask (kernel_hub_mask): sdpa's is a bool keep-mask, or None where sdpa would mask by
    `is_causal`; eager attention adds its mask to the scores, so a bool mask would add 1 to kept scores and mask
    nothing (wrong numbers, silently). None is materialized from the layer's causal / sliding-window facts."""
    if attention_mask is None:
        causal = kwargs.get("is_causal")
        window = kwargs.get("sliding_window")
        causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
        return materialized_mask(query, key, causal=causal, window=None if window is None else int(window))
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool:
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=attention_mask.device)
        return bias.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return attention_mask


def _weights_call(module: torch.nn.Module) -> Callable[..., Any]:
    """The implementation that returns attention weights (the module's eager attention), logged once."""
    global _weights_logged
    if not _weights_logged:
        _weights_logged = True
        _log.warning("kernel_hub attention: attention weights were requested (output_attentions), which the kernel "
                     "does not compute; such calls run the model's eager attention (this is logged once)")
    return previous_function(module, "eager")


def previous_function(module: torch.nn.Module, previous: str | None) -> Callable[..., Any]:
    """The attention function `module` called before kernelize (its modeling file's eager as default)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as eager
    if previous in (None, "eager", *NAMES):
        return eager
    return ALL_ATTENTION_FUNCTIONS.get_interface(previous, eager)


def kernel_hub_mask(*args: Any, config: Any = None, **kwargs: Any) -> Any:
    """Registered mask function: the previous implementation's own mask function (sdpa's if unknown)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    previous = _PREVIOUS.get(id(config), "sdpa")
    fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(previous or "sdpa", sdpa_mask)
    if fn is kernel_hub_mask:
        fn = sdpa_mask
    return fn(*args, config=config, **kwargs)


def register() -> None:
    """Register both names in AttentionInterface and AttentionMaskInterface (idempotent; adds names, edits no
    class)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    for name in NAMES:
        if ALL_ATTENTION_FUNCTIONS._global_mapping.get(name) is not kernel_hub_attention:
            AttentionInterface.register(name, kernel_hub_attention)
        if ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(name) is not kernel_hub_mask:
            AttentionMaskInterface.register(name, kernel_hub_mask)


def switch_configs(configs: Iterable[Any], name: str) -> None:
    """Set `name` on configs already switched to SETTABLE_NAME by set_attn_implementation (what it does for a
    registered name, without the flash-attn package load it would attempt for a flash-named one)."""
    for cfg in configs:
        if cfg._attn_implementation in NAMES:
            cfg._attn_implementation_internal = name


# --- a kernelized model's config may ask for attention weights ------------------------------------------------------
#
# transformers' config refuses `output_attentions=True` (set, or validated) under any implementation name but eager,
# since only eager computes the weights. Under "kernel_hub" every call that wants weights runs the layer's eager
# attention (`_weights_call`), so a kernelized model's config accepts the request as eager would. Per model: kernelize
# gives the model private config copies (swap.take_own_configs), and each copy the attention kind switches gets the
# class below, a subclass of its own class; every other config in the process (another model's, one never
# kernelized) keeps transformers' rule, and restore puts the original class back.

#: Subclasses made so far, reachable by name for pickle (`ACCEPTING.<module>_<class>`). Process-wide by nature: pickle
#: finds a class by its module path from any thread or task. _MAKING makes each one once, so two threads kernelizing
#: models of one config class at once get the same class (a second one would replace the first under its name, and
#: the first model's config would no longer pickle).
ACCEPTING = types.SimpleNamespace()
_MAKING = threading.Lock()


@contextlib.contextmanager
def _as_eager(config: Any):
    """While inside, a config under kernelize's names reads as eager (transformers' checks pass as they would there)."""
    name = config._attn_implementation
    if name not in NAMES:
        yield
        return
    config._attn_implementation_internal = "eager"
    try:
        yield
    finally:
        config._attn_implementation_internal = name


def accepting_class(cls: type) -> type:
    """`cls` with its output_attentions setter and validators taking "kernel_hub" as eager (made once per class)."""
    key = f"{cls.__module__}.{cls.__qualname__}".replace(".", "_").replace("<", "_").replace(">", "_")
    with _MAKING:
        made = getattr(ACCEPTING, key, None)
        if made is None or made.__bases__ != (cls,):
            made = _make_accepting(cls, key)
            setattr(ACCEPTING, key, made)
        return made


def _make_accepting(cls: type, key: str) -> type:
    ns: dict[str, Any] = {"__module__": __name__, "__doc__": cls.__doc__, "_kernel_hub_original": cls,
                          # kept, not regenerated: transformers makes every config subclass a dataclass, which would
                          # write its own __init__ / __eq__ (and drop __hash__) over the class's
                          "__init__": cls.__init__, "__eq__": cls.__eq__, "__hash__": cls.__hash__}
    prop = getattr(cls, "output_attentions", None)
    if isinstance(prop, property) and prop.fset is not None:
        setter = prop.fset

        def fset(self: Any, value: bool) -> None:
            with _as_eager(self) if value else contextlib.nullcontext():
                setter(self, value)

        ns["output_attentions"] = prop.setter(fset)
    for name in ("validate_output_attentions", "validate"):
        check = getattr(cls, name, None)
        if callable(check):
            ns[name] = _eager_check(check)
    made = type(cls.__name__, (cls,), ns)
    made.__qualname__ = f"ACCEPTING.{key}"
    return made


def _eager_check(check: Callable[[Any], None]) -> Callable[[Any], None]:
    def run(self: Any) -> None:
        with _as_eager(self):
            check(self)

    run.__name__ = check.__name__
    return run


def accept_weight_requests(config: Any) -> type | None:
    """Give `config` (a private copy) the accepting class; returns its class before (None: it had it already)."""
    cls = type(config)
    if "_kernel_hub_original" in vars(cls):
        return None
    config.__class__ = accepting_class(cls)
    return cls


def _as_bool_mask(mask: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """A 4-D bool or additive (0 / very negative) mask as bool [B, Sq, Skv]; else why not."""
    if mask.dim() != 4:
        return None, f"{mask.dim()}-D attention mask"
    if mask.shape[1] != 1:
        return None, "per-head attention mask"
    m = mask[:, 0]
    if m.dtype == torch.bool:
        return m, ""
    if not m.dtype.is_floating_point:
        return None, f"{m.dtype} attention mask"
    keep = m == 0
    if not bool((keep | (m <= torch.finfo(m.dtype).min / 2)).all()):
        return None, "additive mask with bias values"
    return keep, ""


def _contiguous_run(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of flags [B, N]: (start, length) of its True run, and whether every row has one run (a bool tensor)."""
    n = flags.shape[1]
    idx = torch.arange(n, device=flags.device)
    count = flags.sum(1)
    start = torch.where(flags, idx, n).amin(1).clamp(max=n)
    end = torch.where(flags, idx + 1, 0).amax(1)
    ok = ((end - start).clamp(min=0) == count).all()
    start = torch.where(count > 0, start, torch.zeros_like(start))
    return start, count, ok


def sparse_selection(kwargs: dict[str, Any]) -> str:
    """Pure decision: why this call cannot run under "kernel_hub" at all ("" if it can). A sparse selection passed
    as a kwarg is only there because the implementation is not eager/sdpa (else it is in the mask)."""
    found = [f"{what} (`{name}`)" for name, what in SPARSE_KWARGS.items() if kwargs.get(name) is not None]
    if not found:
        return ""
    return (f"{', '.join(found)}: the model masks them only under eager/sdpa and hands them to any other attention "
            "implementation, and the kernel computes dense attention")


def plan_kwargs(kwargs: dict[str, Any], *, training: bool) -> str:
    """Pure decision: why the kernel cannot honour this call's kwargs ("" if it can)."""
    why = sparse_selection(kwargs)
    if why:
        return why
    if kwargs.get("dropout", 0.0) and training:
        return "attention dropout"
    if kwargs.get("output_attentions"):
        return "output_attentions"
    return next((name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None), "")


def plan_heads(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
               scaling: float | None) -> tuple[HeadPad | None, str]:
    """Pure decision on q/k/v [B,H,S,D] shapes: the zero padding that makes the call one the kernel takes (value head
    size != query/key head size, as in multi-head latent attention), or (None, why not)."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None, f"q/k/v of {len(q)}/{len(k)}/{len(v)} dims"
    if tuple(k[:3]) != tuple(v[:3]):
        return None, f"key {tuple(k)} and value {tuple(v)} differ beyond the head size"
    if q[-1] != k[-1]:
        return None, f"query head size {q[-1]} differs from the key head size {k[-1]}"
    d, dv = int(k[-1]), int(v[-1])
    scale = float(scaling) if scaling is not None else d ** -0.5
    return HeadPad(qk=max(0, dv - d), v=max(0, d - dv), dv=dv, scale=scale), ""


def plan_call(
    mask: torch.Tensor | None, sq: int, skv: int, *, causal: bool, window: int | None
) -> tuple[AttentionCallPlan | None, str]:
    """Pure decision for one call: (kernel arguments, "") or (None, why the previous implementation runs)."""
    if mask is None:
        if causal and 1 < sq < skv:
            return None, "no mask with fewer queries than keys (sdpa would slice the keys)"
        return AttentionCallPlan(causal=causal, window=window), ""
    if not isinstance(mask, torch.Tensor):
        return None, f"{type(mask).__name__} attention mask"
    m, why = _as_bool_mask(mask)
    if m is None:
        return None, why
    if m.shape[-2:] != (sq, skv):
        return None, f"mask {tuple(m.shape[-2:])} does not match attention ({sq}, {skv})"
    keys = m.any(1)  # [B, Skv] keys anyone attends
    ks, kl, ok_k = _contiguous_run(keys)
    why = ""
    for rows in _query_rows(m, keys):
        qs, ql, ok_q = _contiguous_run(rows)
        if not bool(ok_k & ok_q):
            why = why or "padding is not one contiguous run per sequence"
        elif not bool(_candidate_matches(m, rows, qs, ks, ql, kl, causal=causal, window=window)):
            why = why or "mask is not causal/sliding-window over padded sequences"
        else:
            break
    else:
        return None, why
    full = bool((qs == 0).all() and (ks == 0).all() and (ql == sq).all() and (kl == skv).all())
    if full:
        return AttentionCallPlan(causal=causal, window=window), ""
    shifted = bool((qs != 0).any() or (ks != 0).any())
    return AttentionCallPlan(causal=causal, window=window, q_shift=qs if shifted else None,
                             kv_shift=ks if shifted else None, q_lengths=ql.to(torch.int32),
                             kv_lengths=kl.to(torch.int32), rows=rows), ""


def _query_rows(m: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two readings of which query rows [B, Sq] are real, tried in order (each is checked against the mask): those
    attending any key, which a static cache needs (its keys past the filled length are masked, so a decode query's
    own key is not the last slot); and those whose own key (new tokens come last) is a real key, which leaves
    right-padding queries out, whose rows attend every real key."""
    sq, skv = m.shape[-2:]
    own = torch.arange(sq, device=m.device) + (skv - sq)
    last = keys[:, own] if skv >= sq else torch.zeros(m.shape[0], sq, dtype=torch.bool, device=m.device)
    return m.any(2), last


def _candidate_matches(m, rows, qs, ks, ql, kl, *, causal: bool, window: int | None) -> torch.Tensor:
    """Whether the causal/sliding mask over the runs (qs, ql) / (ks, kl) equals `m` on every real query row."""
    sq, skv = m.shape[-2:]
    i = torch.arange(sq, device=m.device)[None, :, None] - qs[:, None, None]
    j = torch.arange(skv, device=m.device)[None, None, :] - ks[:, None, None]
    qlen, klen = ql[:, None, None], kl[:, None, None]
    cand = (i >= 0) & (i < qlen) & (j >= 0) & (j < klen)
    pos = i + (klen - qlen)
    if causal:
        cand &= j <= pos
    if window is not None:
        cand &= j > pos - window
    return ((cand == m) | ~rows[:, :, None]).all()


def traced_plan(
    mask: torch.Tensor | None, sq: int, skv: int, *, causal: bool, window: int | None
) -> tuple[AttentionCallPlan | None, torch.Tensor | None, str]:
    """plan_call for torch.compile: every decision on shapes and static facts is taken here, every decision on the
    mask's values is one bool tensor `ok` (None: the plan needs no check) that picks the branch in the graph.
    The plan is always the general one (shifts and lengths): with zero shifts and full lengths it computes exactly
    what the unshifted plan does. (None, None, why): the previous implementation runs, decided statically."""
    if mask is None or not isinstance(mask, torch.Tensor):
        plan, why = plan_call(mask, sq, skv, causal=causal, window=window)
        return plan, None, why
    if mask.dim() != 4 or mask.shape[1] != 1:
        return None, None, "4-D attention mask with one head" if mask.dim() != 4 else "per-head attention mask"
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        return None, None, f"{mask.dtype} attention mask"
    if tuple(mask.shape[-2:]) != (sq, skv):
        return None, None, f"mask {tuple(mask.shape[-2:])} does not match attention ({sq}, {skv})"
    m = mask[:, 0]
    ok = torch.ones((), dtype=torch.bool, device=m.device)
    if m.dtype != torch.bool:
        keep = m == 0
        ok = (keep | (m <= torch.finfo(m.dtype).min / 2)).all()  # no bias values
        m = keep
    keys = m.any(1)
    ks, kl, ok_k = _contiguous_run(keys)
    runs = []
    for rows in _query_rows(m, keys):  # both readings, the first that fits chosen in the graph (torch.where)
        qs, ql, ok_q = _contiguous_run(rows)
        runs.append((rows, qs, ql, ok_q & _candidate_matches(m, rows, qs, ks, ql, kl, causal=causal, window=window)))
    (rows1, qs1, ql1, ok1), (rows2, qs2, ql2, ok2) = runs
    rows, qs, ql = torch.where(ok1, rows1, rows2), torch.where(ok1, qs1, qs2), torch.where(ok1, ql1, ql2)
    ok = ok & ok_k & (ok1 | ok2)
    return AttentionCallPlan(causal=causal, window=window, q_shift=qs, kv_shift=ks, q_lengths=ql.to(torch.int32),
                             kv_lengths=kl.to(torch.int32), rows=rows), ok, ""


def _roll(x: torch.Tensor, shift: torch.Tensor, sign: int) -> torch.Tensor:
    """x[b, :, i] <- x[b, :, (i + sign*shift[b]) % S] along the sequence axis (dim 2)."""
    s = x.shape[2]
    idx = (torch.arange(s, device=x.device)[None, :] + sign * shift[:, None]) % s
    return x.gather(2, idx[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def run_plan(
    flash: Callable[..., torch.Tensor], plan: AttentionCallPlan, query, key, value, *, pad: HeadPad, softcap, sinks
) -> torch.Tensor:
    """The kernel on one call's q/k/v [B,H,S,D] under `plan` and `pad` -> [B,Hq,Sq,Dv]."""
    q, k, v = query, key, value
    if pad.qk:
        q, k = torch.nn.functional.pad(q, (0, pad.qk)), torch.nn.functional.pad(k, (0, pad.qk))
    if pad.v:
        v = torch.nn.functional.pad(v, (0, pad.v))
    if plan.q_shift is not None:
        q = _roll(q, plan.q_shift, 1)
        k, v = _roll(k, plan.kv_shift, 1), _roll(v, plan.kv_shift, 1)
    out = flash(q, k, v, causal=plan.causal, sm_scale=pad.scale, sliding_window=plan.window,
                logits_soft_cap=softcap, sinks=None if sinks is None else sinks.float(),
                q_lengths=plan.q_lengths, kv_lengths=plan.kv_lengths)
    if plan.q_shift is not None:
        out = _roll(out, plan.q_shift, -1)  # rows past each q length were 0 and stay 0 (padding rows)
    return out[..., :pad.dv] if pad.v else out


def _kernel_call(
    module: torch.nn.Module, flash: Callable[..., torch.Tensor], query, key, value, attention_mask, kwargs
) -> tuple[Any, AttentionCallPlan | None, str]:
    """(output [B,Sq,H,Dv] or None, plan, reason) for one call of the kernel path."""
    why = plan_kwargs(kwargs, training=bool(module.training))
    if why:
        return None, None, why
    pad, why = plan_heads(tuple(query.shape), tuple(key.shape), tuple(value.shape), kwargs.get("scaling"))
    if pad is None:
        return None, None, why
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    window = kwargs.get("sliding_window")
    if torch.compiler.is_compiling():
        return _traced_kernel_call(module, flash, query, key, value, attention_mask, kwargs, pad=pad,
                                   causal=causal, window=None if window is None else int(window))
    plan, why = plan_call(attention_mask, query.shape[2], key.shape[2], causal=causal,
                          window=None if window is None else int(window))
    if plan is None:
        return None, None, why
    out = run_plan(flash, plan, query, key, value, pad=pad, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"))
    return out.transpose(1, 2).contiguous(), plan, ""


def _traced_kernel_call(module, flash, query, key, value, attention_mask, kwargs, *, pad: HeadPad, causal: bool,
                        window: int | None) -> tuple[Any, AttentionCallPlan | None, str]:
    """_kernel_call under torch.compile: no Python branch on tensor values. Where the mask's values decide, the graph
    holds both the kernel and the previous implementation and keeps one by the plan's check (torch.where), so a mask the
    kernel cannot express still gets the previous implementation's output, exactly as in eager mode."""
    plan, ok, why = traced_plan(attention_mask, query.shape[2], key.shape[2], causal=causal, window=window)
    if plan is None:
        return None, None, why
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")

    def kernel(q, k, v):
        out = run_plan(flash, plan, q, k, v, pad=pad, softcap=softcap, sinks=sinks)
        return out.transpose(1, 2).contiguous()

    if ok is None:
        return kernel(query, key, value), plan, ""
    hook = module.__dict__.get(HOOK_ATTR)
    prev_fn = previous_function(module, hook.previous if hook is not None else None)

    def previous(q, k, v):
        return prev_fn(module, q, k, v, attention_mask, **kwargs)[0]

    # torch.where, not torch.cond: torch 2.13's dynamo drops a store to an object attribute made after a torch.cond
    # when the traced frame stored to the same attribute before it. transformers' output capture and kernels'
    # use_kernelized_func set a context variable around every attention layer's forward and reset it after, so
    # under torch.cond the reset was lost: after one compiled call the variable stayed in its compile-time global
    # mode, the next eager forward collected no hidden states, and every compiled call recompiled. Both branches
    # run here (the cost of a mask check under compile) and the check picks one; neither branch mutates anything.
    return torch.where(ok, kernel(query, key, value), previous(query, key, value)), plan, ""


def _rel_rows(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> float:
    """numerics.relative_error over real query rows (out/ref [B,Sq,H,D])."""
    if rows is not None and out.shape == ref.shape:
        out, ref = out[rows], ref[rows]
    return relative_error(out, ref)


def kernel_hub_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Registered as attention implementation "kernel_hub": the kernel for hooked layers where the call
    is expressible, else the layer's previous implementation with the same arguments."""
    hook: AttentionHook | None = module.__dict__.get(HOOK_ATTR)
    previous = hook.previous if hook is not None else _PREVIOUS.get(id(getattr(module, "config", None)))
    prev_fn = previous_function(module, previous)
    probe = _PROBES.get(id(getattr(module, "config", None))) if _PROBES else None
    if probe is not None:
        ref = prev_fn(module, query, key, value, attention_mask, **kwargs)
        key_id = id(module)
        probe.modules[key_id] = module
        sparse = sparse_selection(kwargs)
        if sparse:
            probe.sparse.setdefault(key_id, sparse)
        try:
            # a kernel that wrote to the model's weights or its inputs is undone and refused
            with held_weights(module, inputs={"query": query, "key": key, "value": value}):
                out, plan, why = _kernel_call(module, probe.flash, query, key, value, attention_mask, kwargs)
            if out is not None:
                check_output(out, ref[0], "the layer's attention")
        except KernelRefused as exc:  # recorded; kernelize keeps the layer with this reason
            probe.failures[key_id] = str(exc)
            return ref
        except Exception as exc:  # recorded; kernelize keeps the layer with this reason
            probe.failures[key_id] = f"kernel raised in validation: {type(exc).__name__}: {exc}"
            return ref
        if out is None:
            probe.failures.setdefault(key_id, f"validation call fell back: {why}")
        else:
            probe.errors.setdefault(key_id, []).append(_rel_rows(out, ref[0], plan.rows))
        return ref
    sparse = sparse_selection(kwargs)
    if sparse:  # kernelize keeps such models off "kernel_hub": the previous implementation here would drop them too
        raise KernelHubError(f"{type(module).__name__} passed {sparse}; neither can run under 'kernel_hub': "
                             "call kh.restore(model) (kernelize keeps such models on their own attention)")
    if packed.is_packed(kwargs):
        return _packed_call(module, hook, prev_fn, previous, query, key, value, kwargs)
    if attention_weights_requested(kwargs):
        return _weights_call(module)(module, query, key, value, eager_mask(module, query, key, attention_mask, kwargs),
                                     **kwargs)
    if hook is None or hook.flash is None:
        return prev_fn(module, query, key, value, attention_mask, **kwargs)
    out, _, why = _kernel_call(module, hook.flash, query, key, value, attention_mask, kwargs)
    if out is None:
        hook.fell_back(why)
        return prev_fn(module, query, key, value, attention_mask, **kwargs)
    hook.served()
    return out, None


def _packed_call(module: torch.nn.Module, hook: AttentionHook | None, prev_fn: Callable[..., Any], previous: str | None,
                 query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    """A packed call (continuous batching, padding-free): the kernel's flash-attn functions, or the previous
    implementation with the block-diagonal mask transformers builds for it only under eager/sdpa."""
    kernel = hook.packed if hook is not None and hook.flash is not None else None
    why = packed.plan_packed(kernel, kwargs, training=bool(module.training))
    if not why:
        out = packed.kernel_packed(kernel, module, query, key, value, kwargs)
        hook.served()
        return out, None
    if hook is not None:
        hook.fell_back(why)
    fn = _weights_call(module) if attention_weights_requested(kwargs) else prev_fn
    eager = fn is not prev_fn or previous in (None, "eager", *NAMES)
    return packed.previous_packed(fn, module, query, key, value, kwargs, additive=eager)


def set_probe(configs: Iterable[Any], probe: AttentionProbe | None) -> None:
    """Validation mode for the model holding `configs`: its attention calls feed `probe` (None: off again)."""
    for cfg in configs:
        if probe is None:
            _PROBES.pop(id(cfg), None)
        else:
            _PROBES[id(cfg)] = probe
