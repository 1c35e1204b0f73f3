"""What a kernel wrote outside its own layer while validation ran it: the rest of the model, watched copy-on-write.

Why: the layer being validated is held as a full copy (weights_guard.Snapshot), but a kernel can reach any other
tensor of the model (a global, a parent module) and nothing in torch stops it. Copying the whole model for every
validated layer costs a second model in memory; instead, while the kernel runs, a dispatch mode sees every aten op
that writes to a tensor (in place, through a view or `.data`, an out= argument) and copies a model tensor the moment
before its storage is first written. Afterwards only the copied tensors are compared (bits, so a write that changed
nothing is no alarm) and put back; identity, shape, storage and version counters catch swaps (`param.data = ...`,
a replaced Parameter). Cost: one pass over the model's tensor handles per validated call, a Python hop per aten op
of the kernel, and a copy of only what was written.

Not seen here: writes that bypass torch's dispatcher into a tensor outside the layer (numpy or DLPack views); the
layer's own tensors are compared by content, so those are caught there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: The model whose tensors validation watches (set by kernelize around its layer kinds).
_SCOPE: ContextVar[torch.nn.Module | None] = ContextVar("kernel_hub_guard_scope", default=None)


@contextlib.contextmanager
def guarding(model: object) -> Iterator[None]:
    """Within this block, validation watches all of `model`'s parameters and buffers, not only the layer's."""
    token = _SCOPE.set(cast(torch.nn.Module, model))  # kernelize's model, a torch module by now
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scope_model() -> torch.nn.Module | None:
    return _SCOPE.get()


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        if t.device.type == "meta" or t.layout != torch.strided or t.is_quantized:
            return None
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


@dataclass
class _Watched:
    owner: Any
    store: str
    name: str
    tensor: torch.Tensor
    alias: torch.Tensor  # tensor.data: the original storage, kept for putting back
    meta: tuple[Any, ...]  # shape, dtype, device, data pointer
    version: int
    copy: torch.Tensor | None = None  # its bits from just before the first write the dispatch mode saw


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.dtype, t.device, t.data_ptr() if _storage_key(t) is not None else 0


_WRITTEN_ARGS: dict[object, tuple[tuple[int, str], ...]] = {}


def _written_args(func: object) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument an aten op writes to, from its schema (cached per op)."""
    got = _WRITTEN_ARGS.get(func)
    if got is None:
        schema = getattr(func, "_schema", None)
        got = tuple((i, a.name) for i, a in enumerate(schema.arguments if schema is not None else ())
                    if a.alias_info is not None and a.alias_info.is_write)
        _WRITTEN_ARGS[func] = got
    return got


class _CopyOnWrite(TorchDispatchMode):
    """Copies a watched tensor right before the first op that writes to its storage."""

    def __init__(self, by_storage: dict[int, list[_Watched]]) -> None:
        super().__init__()
        self.by_storage = by_storage

    def __torch_dispatch__(self, func: Callable[..., Any], types: tuple[type, ...], args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for pos, name in _written_args(func):
            value = args[pos] if pos < len(args) else kwargs.get(name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                key = _storage_key(t) if isinstance(t, torch.Tensor) else None
                for w in self.by_storage.get(key, ()) if key is not None else ():
                    if w.copy is None:  # the mode is off inside its own dispatch: this clone is not seen
                        w.copy = w.tensor.detach().clone()
        return func(*args, **kwargs)


def _named(model: torch.nn.Module, skip: set[int]) -> Iterator[tuple[str, Any, str, str, torch.Tensor]]:
    for prefix, owner in model.named_modules(remove_duplicate=False):
        if id(owner) in skip:
            continue
        for store in ("_parameters", "_buffers"):
            for name, t in owner.__dict__.get(store, {}).items():
                if t is not None:
                    yield (f"{prefix}.{name}" if prefix else name), owner, store, name, t


#: Integer dtypes by element size: bits compared as integers of the element's width (twice as fast as bytes).
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as one integer row (NaN == NaN here, and -0.0 != 0.0: bit-identical means identical)."""
    flat = t.detach().reshape(-1)
    return flat.view(_INT_OF_SIZE.get(flat.element_size(), torch.uint8))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


class ModelWatch:
    """The model's tensors outside the held layer, as they were when the watch began; `changed()` after the body."""

    def __init__(self, model: torch.nn.Module, held: torch.nn.Module) -> None:
        self.model = model
        self.skip = {id(m) for m in held.modules()}
        self.entries: dict[str, _Watched] = {}
        by_storage: dict[int, list[_Watched]] = {}
        for qual, owner, store, name, t in _named(model, self.skip):
            w = _Watched(owner, store, name, t, t.data, _meta(t), _version(t))
            self.entries[qual] = w
            key = _storage_key(t)
            if key is not None:
                by_storage.setdefault(key, []).append(w)
        self.mode = _CopyOnWrite(by_storage)

    def changed(self) -> list[str]:
        """Names of the tensors outside the layer that are not what they were (bits compared where written)."""
        now = {qual: t for qual, _, _, _, t in _named(self.model, self.skip)}
        out = set(now) ^ set(self.entries)
        for qual, w in self.entries.items():
            t = now.get(qual)
            if t is None:
                continue
            if t is not w.tensor or _meta(t) != w.meta:
                out.add(qual)
            elif w.copy is not None:
                if not _same_bits(t, w.copy):
                    out.add(qual)
            elif _version(t) != w.version:  # written where the dispatch mode could not see it: assume changed
                out.add(qual)
        return sorted(out)

    def put_back(self) -> None:
        """Every watched tensor the object it was, on its storage, with its bits; tensors added are dropped."""
        known = {(id(w.owner), w.store, w.name) for w in self.entries.values()}
        with torch.no_grad():
            for _, owner, store, name, _ in list(_named(self.model, self.skip)):
                if (id(owner), store, name) not in known:
                    getattr(owner, store).pop(name, None)
            for w in self.entries.values():
                getattr(w.owner, w.store)[w.name] = w.tensor
                if _meta(w.tensor) != w.meta:
                    w.tensor.data = w.alias
                if w.copy is not None and not _same_bits(w.tensor, w.copy):
                    w.alias.copy_(w.copy)


@dataclass
class InputsWatch:
    """Copies of the tensors a kernel is handed as inputs: a kernel writes its output, never its inputs."""

    inputs: dict[str, torch.Tensor]
    copies: dict[str, torch.Tensor]

    @classmethod
    def take(cls, inputs: Mapping[str, object]) -> InputsWatch:
        held = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and _storage_key(v) is not None}
        return cls(held, {k: v.detach().clone() for k, v in held.items()})

    def changed(self) -> list[str]:
        return [k for k, v in self.inputs.items()
                if v.shape != self.copies[k].shape or not _same_bits(v, self.copies[k])]

    def put_back(self) -> None:
        with torch.no_grad():
            for k in self.changed():
                if self.inputs[k].shape == self.copies[k].shape:
                    self.inputs[k].detach().copy_(self.copies[k])
