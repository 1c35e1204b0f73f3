"""What a layer kind is: the `LayerKind` declaration kernelize reads, and the `KindRun` one kind's `apply` gets.

Why its own module: the generic jobs (plan, load) and the entry point (api.py) read declarations handed to them,
and a kind's folder declares one, so both import this module and neither imports the other. Torch-free.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import KernelHubError

if TYPE_CHECKING:  # types only: importing a declaration stays torch-free
    import torch

    from ..report import KernelizeReport


class KindStates(Protocol):
    """Kernelize's restore record as a kind sees it (swap.KernelizeState on a model, diffusers.DiffusersState on a
    Diffusers component): each kind keeps its own state under its name, before it changes anything."""

    kinds: dict[str, Any]


@dataclass
class KindRun:
    """What one kind's `apply` gets from kernelize: the kind's own declaration, the model, the mapping value for the
    kind (a repo id, a loaded kernel or None), the backend and device, the mode, whether to validate, kernelize's
    state (restore reads it) and the report to append rows to."""

    kind: LayerKind
    model: torch.nn.Module
    spec: object  # plan.RepoSpec, hf_compat.LocalSpec, a repo id, an already loaded kernel, or None
    backend: str
    device: torch.device
    mode: str
    validate: bool
    state: KindStates
    report: KernelizeReport
    quantize: str | None = None  # kernelize's quantize= (the kinds that quantize read it)


@dataclass(frozen=True)
class LayerKind:
    name: str  # the kind's name in mapping=, registry.yaml `layers`, kernel.yaml `replaces`, report rows
    title: str  # how the report's family table titles the kind's column
    export: str  # the function a kernel must export to serve it
    protocols: tuple[type, ...]  # the Protocols a serving kernel's torch entry keeps, every entry required
    finds: str  # where kernelize finds such layers in a model
    contract: str  # the call the kernel is held to
    validated_on: str  # the inputs each layer is checked on before the swap
    apply: Callable[[KindRun], None]
    #: (model, the state its apply filled) -> None; runs in reverse kind order, on a Diffusers model too unless
    #: `diffusers` names another restore.
    restore: Callable[[torch.nn.Module, KindStates], None]
    order: int  # kernelize applies kinds in increasing order
    #: Protocols a serving kernel may keep, each all or none (the experts' packed weights).
    optional: tuple[type, ...] = ()
    #: On a Diffusers denoiser (layers/diffusers.py): None runs `apply` / `restore` as on any model (the kind finds its
    #: layers by structure); an (apply, restore) pair runs those instead; a string leaves the kind out, saying why.
    diffusers: tuple[Callable[[KindRun], None], Callable[[torch.nn.Module, KindStates], None]] | str | None = None
    #: Which convention a loaded kernel serves the kind through: kernel -> (convention or None, why). None: the kind
    #: has one, its `export`.
    accepts: Callable[[Any], tuple[str | None, str]] | None = None
    #: HF layer names meaning this kind (transformers' `use_kernel_forward_from_hub` marks, HF kernels' layer
    #: classes): mapping keys kernelize reads as the kind's name (hf_compat.kind_for_key).
    hf_names: tuple[str, ...] = ()
    #: Further HF class names meaning this kind, as (regex, how a message shows it), e.g. transformers' per-family
    #: classes.
    hf_pattern: tuple[str, str] | None = None
    #: The kind's check of kernelize's `quantize=` (a kind that quantizes its weights): (quantize, mode) -> the format
    #: or None; raises before anything changes.
    quantizes: Callable[[Any, str], str | None] | None = None

    def is_hf_name(self, key: str) -> bool:
        """Whether the HF layer name `key` means this kind."""
        return key in self.hf_names or (self.hf_pattern is not None and re.match(self.hf_pattern[0], key) is not None)

    def convention(self, kernel: Any) -> tuple[str | None, str]:
        """(the convention `kernel` serves this kind through, why), or (None, why it cannot serve it)."""
        if self.accepts is not None:
            return self.accepts(kernel)
        if hasattr(kernel, self.export):
            return self.export, f"exports {self.export}"
        return None, f"does not export {self.export}"


def deferred(module: str, name: str) -> Callable[..., Any]:
    """`module`'s function `name`, imported on the first call: a kind's declaration names its flow and adapters (which
    import torch, transformers or Diffusers) without importing them, so reading the kinds stays framework-free."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call


def in_order(kinds: Iterable[Any]) -> tuple[LayerKind, ...]:
    """`kinds` in apply order; refused (before anything changes) unless each is a LayerKind and their names differ."""
    kinds = tuple(kinds)
    wrong = [type(k).__name__ for k in kinds if not isinstance(k, LayerKind)]
    if wrong:
        raise KernelHubError(f"kinds= takes LayerKind declarations, got {', '.join(wrong)}")
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        raise KernelHubError(f"two layer kinds share a name: {sorted(names)}")
    return tuple(sorted(kinds, key=lambda k: (k.order, k.name)))
