"""Kernels never change a layer's weights: checked around every kernel call kernelize makes, and at run time.

Why: a kernel gets the layer's own parameters (an experts kernel the whole block), and nothing in torch stops it
from writing to them. A kernel that scaled `gate_up_proj` in place and was then kept (its numbers were wrong) left
the model computing other logits, and restore() could not give the weights back, since kernelize never changed them.

Two guards, by cost:
- validation (once per layer, at kernelize): `held_weights` keeps a copy of the layer's parameters and buffers and
  compares bits, identity, shape, dtype and device after the kernel ran; anything touched is put back bit for bit
  and the kernel is refused (KernelRefused, the reason a kept row shows). Cost: one transient copy of one layer's
  weights, one pass to compare; content is compared, so writes through `.data`, numpy or DLPack views are caught too.
  The rest of the model kernelize works on is watched copy-on-write (write_watch.ModelWatch: only what a kernel
  wrote is copied and compared), and the inputs the kernel was handed are copied and compared: a kernel writes its
  output and nothing else. A write that left the bits as they were (a version counter moved) is no alarm there.
- run time (every call of a swapped layer): `watched` compares each parameter's and buffer's identity, autograd
  version counter and data pointer before and after the call: any in-place op through the tensor or a view of it
  (`mul_`, `copy_`, an out= argument) and any `param.data = ...` is caught, for a few microseconds per call and no
  memory. Not caught there: writes through `.data` or foreign views, which bypass the version counter (validation
  compares content, so a kernel doing that on every call never gets swapped in). With no copy to compare, an
  in-place op that left the bits as they were still counts as a write at run time. What it finds raises
  WeightsModified: the weights were changed by that call and no copy was kept to undo it (reload them).

`check_loaded` is the other weights question: a model still on the meta device has none to validate against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KernelHubError
from .write_watch import InputsWatch, ModelWatch, scope_model
from .write_watch import bits as _bits

#: The start of the reason a kept layer shows when its kernel wrote to the layer's weights.
WEIGHTS_MODIFIED = "the kernel modified the layer's weights"


class KernelRefused(KernelHubError):
    """Validation refused a kernel for a reason that is not a number (its message is the kept row's reason)."""


class WeightsModified(KernelRefused):
    """A kernel wrote to the weights of the layer it serves."""


def _named_tensors(module: torch.nn.Module, recurse: bool) -> Iterator[tuple[str, Any, str, str, torch.Tensor]]:
    """(qualified name, owning module, "_parameters" or "_buffers", local name, tensor) of every set entry."""
    owners = module.named_modules() if recurse else (("", module),)
    for prefix, owner in owners:
        for store in ("_parameters", "_buffers"):
            for name, t in owner.__dict__.get(store, {}).items():
                if t is not None:
                    yield (f"{prefix}.{name}" if prefix else name), owner, store, name, t


def _has_bits(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and t.layout == torch.strided and not t.is_quantized


@dataclass
class _Entry:
    owner: Any
    store: str
    name: str
    tensor: torch.Tensor  # the object the layer held
    alias: torch.Tensor  # tensor.data: a handle on the original storage, kept alive for putting back
    meta: tuple[Any, ...]  # shape, dtype, device, data pointer
    copy: torch.Tensor | None  # its bits (None: nothing to copy, e.g. a meta placeholder)


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.dtype, t.device, t.data_ptr() if _has_bits(t) else 0


@dataclass
class Snapshot:
    """A layer's parameters and buffers as they were: the objects, their storage and a copy of their bits."""

    module: torch.nn.Module
    recurse: bool
    entries: dict[str, _Entry] = field(default_factory=dict)

    @classmethod
    def take(cls, module: torch.nn.Module, *, recurse: bool = True) -> Snapshot:
        snap = cls(module, recurse)
        with torch.no_grad():
            for qual, owner, store, name, t in _named_tensors(module, recurse):
                snap.entries[qual] = _Entry(owner, store, name, t, t.data, _meta(t),
                                            t.detach().clone() if _has_bits(t) else None)
        return snap

    def changed(self) -> list[str]:
        """Names of the entries that are not what they were (replaced, added, removed, reshaped or rewritten)."""
        now = {qual: t for qual, _, _, _, t in _named_tensors(self.module, self.recurse)}
        out = sorted(set(now) ^ set(self.entries))
        for qual, e in self.entries.items():
            t = now.get(qual)
            if t is None:
                continue
            replaced = t is not e.tensor or _meta(t) != e.meta
            if replaced or (e.copy is not None and not torch.equal(_bits(t), _bits(e.copy))):
                out.append(qual)
        return sorted(set(out))

    def put_back(self) -> None:
        """Every entry the object it was, on its original storage, with its original bits; added entries dropped."""
        known = {(id(e.owner), e.store, e.name) for e in self.entries.values()}
        with torch.no_grad():
            for _, owner, store, name, _ in list(_named_tensors(self.module, self.recurse)):
                if (id(owner), store, name) not in known:
                    getattr(owner, store).pop(name, None)
            for e in self.entries.values():
                getattr(e.owner, e.store)[e.name] = e.tensor
                if _meta(e.tensor) != e.meta:
                    e.tensor.data = e.alias
                if e.copy is not None and not torch.equal(_bits(e.tensor), _bits(e.copy)):
                    e.alias.copy_(e.copy)


def modified_reason(names: list[str], when: str = "") -> str:
    return f"{WEIGHTS_MODIFIED} {_shown(names)}{when}"


#: The start of the reason a kept layer shows when its kernel wrote to a tensor of the model outside that layer.
OUTSIDE_MODIFIED = "the kernel modified weights outside the layer"
#: The start of the reason a kept layer shows when its kernel wrote to the inputs it was handed.
INPUTS_MODIFIED = "the kernel modified its input"

_HELD: ContextVar[bool] = ContextVar("kernel_hub_weights_held", default=False)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")


def _refusal(layer: list[str], outside: list[str], inputs: list[str]) -> str:
    parts = [modified_reason(layer)] if layer else []
    if outside:
        parts.append(f"{OUTSIDE_MODIFIED} {_shown(outside)}")
    if inputs:
        parts.append(f"{INPUTS_MODIFIED}{'s' if len(inputs) > 1 else ''} {_shown(inputs)} "
                     "(a kernel writes only its output)")
    return "; ".join(parts)


@contextlib.contextmanager
def held_weights(module: torch.nn.Module, *, recurse: bool = True,
                 inputs: Mapping[str, object] | None = None) -> Iterator[Snapshot]:
    """Run the body (kernel calls in validation) with `module`'s weights held, the rest of the model kernelize is
    working on watched (write_watch.ModelWatch) and `inputs` (name -> tensor handed to the kernel) copied: whatever
    the body changed in any of them is put back bit for bit and WeightsModified raised naming it, also when the body
    raised (the writes are the first thing to say)."""
    snap = Snapshot.take(module, recurse=recurse)
    model = scope_model()
    outside = ModelWatch(model, module) if model is not None and model is not module else None
    args = InputsWatch.take(inputs or {})
    token = _HELD.set(True)
    try:
        with outside.mode if outside is not None else contextlib.nullcontext():
            yield snap
    except BaseException as exc:
        _HELD.reset(token)
        _settle(snap, outside, args, exc)
        raise
    _HELD.reset(token)
    _settle(snap, outside, args, None)


def _settle(snap: Snapshot, outside: ModelWatch | None, args: InputsWatch, exc: BaseException | None) -> None:
    """Put back whatever the body wrote and raise WeightsModified naming it (nothing written: return)."""
    layer, beyond, inputs = snap.changed(), outside.changed() if outside is not None else [], args.changed()
    if not (layer or beyond or inputs):
        return
    snap.put_back()
    if outside is not None:
        outside.put_back()
    args.put_back()
    raise WeightsModified(_refusal(layer, beyond, inputs)) from exc


def versions(module: torch.nn.Module, *, recurse: bool = False) -> tuple[tuple[Any, ...], ...]:
    """(name, object id, version counter, data pointer) of each parameter and buffer: what an in-place op or a
    `.data =` changes, read without touching the data (well under a microsecond a tensor)."""
    return tuple((qual, id(t), -1 if t.is_inference() else t._version, t.data_ptr())
                 for qual, _, _, _, t in _named_tensors(module, recurse))


class _Watch:
    """The run-time guard's context: versions before, compared after (an exception in the body passes through)."""

    __slots__ = ("before", "module", "recurse")

    def __init__(self, module: torch.nn.Module, recurse: bool) -> None:
        self.module, self.recurse = module, recurse

    def __enter__(self) -> None:
        self.before = versions(self.module, recurse=self.recurse)

    def __exit__(self, *exc: object) -> None:
        after = versions(self.module, recurse=self.recurse)
        if after != self.before:
            old = {v[0]: v for v in self.before}
            names = sorted({v[0] for v in after if old.get(v[0]) != v} | (set(old) - {v[0] for v in after}))
            raise WeightsModified(modified_reason(names, " at run time (restore() cannot undo that: reload the "
                                                         "weights)"))


def watched(module: torch.nn.Module, *, recurse: bool = False) -> Any:
    """A context that raises WeightsModified if its body changed `module`'s weights in place (version counters; the
    run-time guard). Outside torch.compile only: a traced graph has no version counters to read (a no-op there)."""
    if torch.compiler.is_compiling() or _HELD.get():  # in validation, held_weights compares the bits themselves
        return contextlib.nullcontext()
    return _Watch(module, recurse)


def guarded_call(call: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An experts call fn(module, hidden, index, weights) whose kernel may not change the block's own weights."""

    def run(module: torch.nn.Module, *args: torch.Tensor) -> torch.Tensor:
        with watched(module):
            return call(module, *args)

    run.__wrapped__ = call  # type: ignore[attr-defined]
    return run


def check_output(out: object, ref: torch.Tensor, what: str = "the layer") -> None:
    """Refuse an output the model cannot take in place of `ref`: not a tensor, or another dtype or shape."""
    if not isinstance(out, torch.Tensor):
        raise KernelRefused(f"the kernel returned {type(out).__name__}; {what} returns a tensor")
    if out.dtype != ref.dtype or out.shape != ref.shape:
        raise KernelRefused(f"the kernel returned {_describe(out)}; {what} returns {_describe(ref)}")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def meta_weights(model: torch.nn.Module, skip: set[int] | None = None) -> list[str]:
    """Names of `model`'s parameters and buffers on the meta device (ids in `skip`: placeholders kernelize made)."""
    return [qual for qual, _, _, _, t in _named_tensors(model, True)
            if t.device.type == "meta" and id(t) not in (skip or set())]


def check_loaded(model: Any) -> None:
    """Raise one clear error when `model`'s weights are still on the meta device: nothing can be validated or run."""
    from .swap import stand_in_parameters

    if not hasattr(model, "named_modules"):
        return
    names = meta_weights(model, stand_in_parameters(model))
    if names:
        raise KernelHubError(
            f"{type(model).__name__} has weights on the meta device ({', '.join(names[:3])}"
            f"{f' and {len(names) - 3} more' if len(names) > 3 else ''}): load the weights first "
            "(from_pretrained, or load_state_dict(..., assign=True) after building on meta), then kernelize")
