"""Layer kinds, declared once: one module per kind in this package, each defining `KIND = LayerKind(...)`.

A declaration says where kernelize finds the layer in a model, the call contract a kernel is held to, the inputs it
is validated on, which kernel export serves it, and the two functions that do the work (`apply` finds, validates,
swaps and reports; `restore` puts back exactly what was there). kernelize, restore, `mapping=` and the report read
the kinds from here, so adding a kind is one module here plus the serving kernel's kernel.yaml `replaces` (and its
registry.yaml `layers` entry for a default). Diffusers models and pipelines go through the same kinds (each
kind's `diffusers` says how). The kinds sit on top of layers/: each kind module runs its flow over the jobs (find,
plan, load, validate, swap, report) and the transformers / Diffusers adapters, and nothing below imports a kind
module. Importing this package itself imports neither torch nor jax; `all_kinds()` imports the kind modules (and
so torch), which only kernelize and the contract test ask for.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class KindRun:
    """What one kind's `apply` gets from kernelize: the model, the mapping value for the kind (a repo id, a loaded
    kernel or None), the backend and device, the mode, whether to validate, kernelize's state (restore reads it)
    and the report to append rows to."""

    model: Any
    spec: Any
    backend: str
    device: Any
    mode: str
    validate: bool
    state: Any
    report: Any


@dataclass(frozen=True)
class LayerKind:
    name: str  # the kind's name in mapping=, registry.yaml `layers`, kernel.yaml `replaces`, report rows
    export: str  # the function a kernel must export to serve it
    finds: str  # where kernelize finds such layers in a model
    contract: str  # the call the kernel is held to
    validated_on: str  # the inputs each layer is checked on before the swap
    apply: Callable[[KindRun], None]
    restore: Callable[[Any, Any], None]  # (model, kernelize's state) -> None; runs in reverse kind order
    order: int  # kernelize applies kinds in increasing order
    #: On a Diffusers denoiser (layers/diffusers.py): None runs `apply` / `restore` as on any model (the kind finds its
    #: layers by structure); an (apply, restore) pair runs those instead; a string leaves the kind out, saying why.
    diffusers: tuple[Callable[[KindRun], None], Callable[[Any, Any], None]] | str | None = None
    #: Which convention a loaded kernel serves the kind through: kernel -> (convention or None, why). None: the kind
    #: has one, its `export`.
    accepts: Callable[[Any], tuple[str | None, str]] | None = None


@functools.cache
def all_kinds() -> tuple[LayerKind, ...]:
    """Every kind declared in this package, in apply order."""
    kinds = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if not isinstance(kind, LayerKind):
            raise TypeError(f"{module.__name__} declares no KIND = LayerKind(...)")
        kinds.append(kind)
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        raise TypeError(f"two layer kinds share a name: {sorted(names)}")
    return tuple(sorted(kinds, key=lambda k: (k.order, k.name)))


def kind_names() -> tuple[str, ...]:
    return tuple(k.name for k in all_kinds())


def kind_exports() -> dict[str, str]:
    """kind -> the function a kernel must export to serve it."""
    return {k.name: k.export for k in all_kinds()}


def kind_convention(name: str, kernel: Any) -> tuple[str | None, str]:
    """(the convention `kernel` serves kind `name` through, why), or (None, why it cannot serve it)."""
    kind = next(k for k in all_kinds() if k.name == name)
    if kind.accepts is not None:
        return kind.accepts(kernel)
    if hasattr(kernel, kind.export):
        return kind.export, f"exports {kind.export}"
    return None, f"does not export {kind.export}"
