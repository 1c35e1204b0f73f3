"""The swap job: install a replacement on a model and put back exactly what was there.

Why one module: restore() must be bit-identical, and that rests on a few rules every kind shares. Nothing is ever
changed on a class or a shared object: a model gets private copies of its configs before any implementation name is
switched (`take_own_configs`), replacements live on instances (`swap_forward`, hook attributes), every change is
recorded in the model's `KernelizeState` before it is made, and restore walks the record backwards
(`put_back_forward`, `put_back_names`, `give_back_configs`). The hooks that run at call time count what they served
with `CallCounts`, outside torch.compile only. Torch-free: importing this imports no framework.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

#: The implementation name kernelize registers in transformers' dispatch interfaces (a kind's adapter registers it).
IMPLEMENTATION_NAME = "kernel_hub"
#: Where a kernelized model keeps its KernelizeState (restore reads it; its presence is "kernelized").
STATE_ATTR = "_kernel_hub_state"
#: Where a module whose weights a kind moved out of its parameters keeps its record: any object whose
#: `placeholders` maps parameter names to the meta parameters left registered in their place.
STAND_INS_ATTR = "_kernel_hub_packed"
class _Missing:
    """The one "nothing was there" marker: copies and pickles of it are itself, so a deep-copied model's swap
    record still reads as "nothing" and restore() on the copy removes the forward instead of installing a marker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __copy__(self) -> _Missing:
        return self

    def __deepcopy__(self, memo: dict) -> _Missing:
        return self

    def __reduce__(self) -> str:
        return "MISSING"


#: A module whose instance __dict__ held no `forward` before the swap.
MISSING = _Missing()


@dataclass
class OwnConfigs:
    """(module, original config, the copy put there) for every module kernelize gave a copy."""

    swaps: list[tuple[Any, Any, Any]] = field(default_factory=list)


@dataclass
class KernelizeState:
    """What restore needs, filled by each kind as it swaps: `kinds[name]` holds that kind's own record (its flow's
    state class), recorded before the kind changes anything so an exception halfway still restores."""

    own_configs: OwnConfigs = field(default_factory=OwnConfigs)  # the model's private config copies
    kinds: dict[str, Any] = field(default_factory=dict)
    ran: tuple[Any, ...] = ()  # the LayerKinds kernelize ran, in apply order: restore runs theirs in reverse

    def empty(self) -> bool:
        return not self.kinds


def is_kernelized(model: Any) -> bool:
    return STATE_ATTR in getattr(model, "__dict__", {})


def stand_in_parameters(model: Any) -> set[int]:
    """ids of the meta parameters standing in for weights a kind moved out of `model`'s modules (packed CPU
    weights, say): the weights guard and the plan must not read them as the model's own."""
    return {id(p) for m in model.modules() if (r := m.__dict__.get(STAND_INS_ATTR)) is not None
            for p in r.placeholders.values()}


# --- counting at call time ------------------------------------------------------------------------------------------


def _compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


@dataclass(kw_only=True, eq=False)
class CallCounts:
    """Calls a hook served (`calls`) and handed to the previous implementation (`fallbacks`, the last one's reason in
    `last_fallback`). Eager-mode facts: inside torch.compile nothing is counted, since an int attribute bumped in a
    traced graph becomes a guard that fails on every call (dynamo recompiled a kernelized model at each generate
    step). Keyword-only fields, so a hook dataclass can inherit them after its own positional fields; no __eq__, so
    a plain class inheriting them keeps identity equality and its hash."""

    calls: int = 0
    fallbacks: int = 0
    last_fallback: str = ""

    def __deepcopy__(self, memo: dict[int, Any]) -> CallCounts:
        """A copy whose loaded kernel modules are shared (a module cannot be copied, and one loaded kernel serves
        any number of models); everything else is deep-copied, so a deep-copied model gets its own hooks."""
        new = object.__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = value if isinstance(value, ModuleType) else copy.deepcopy(value, memo)
        return new

    def served(self) -> None:
        if not _compiling():
            self.calls += 1

    def fell_back(self, why: str) -> None:
        if not _compiling():
            self.fallbacks += 1
            self.last_fallback = why


# --- configs: private copies, implementation names ------------------------------------------------------------------


def _is_config(value: Any) -> bool:
    try:
        from transformers import PretrainedConfig
    except ImportError:  # no transformers: nothing dispatches on a config
        return False
    return isinstance(value, PretrainedConfig)


def take_own_configs(model: Any) -> OwnConfigs:
    """Replace every module's `config` by a private deep copy (shared objects map to one shared copy).

    transformers dispatches attention and experts by the name on a config, and two models built from one config
    object hold that very object (and its sub-configs): switching one model's implementation on the shared object
    would switch the other silently, and either restore would pull the name from under the other. One deepcopy memo
    for the whole model, so modules that shared a config still share its copy."""
    memo: dict[int, Any] = {}
    own = OwnConfigs()
    for module in model.modules():
        cfg = module.__dict__.get("config")
        if not _is_config(cfg):
            continue
        twin = memo.get(id(cfg))
        if twin is None:
            twin = copy.deepcopy(cfg, memo)
        module.__dict__["config"] = twin
        own.swaps.append((module, cfg, twin))
    return own


def give_back_configs(own: OwnConfigs) -> None:
    """Put each module's original config back, where the module still holds the copy kernelize put there."""
    for module, original, twin in own.swaps:
        if module.__dict__.get("config") is twin:
            module.__dict__["config"] = original
    own.swaps.clear()


def put_back_names(configs: list[tuple[Any, str | None]], attr: str) -> None:
    """Each config's implementation name `attr` ("_attn_implementation", "_experts_implementation") as recorded,
    written to the internal field so no setter re-dispatches (sub-configs keep their own recorded names)."""
    for cfg, value in configs:
        if getattr(cfg, attr) != value:
            setattr(cfg, f"{attr}_internal", value)


# --- instance forwards ----------------------------------------------------------------------------------------------


def swap_forward(module: Any, forward: Any) -> Any:
    """Set `module`'s instance forward; returns what its instance __dict__ held before (MISSING: nothing)."""
    previous = module.__dict__.get("forward", MISSING)
    module.__dict__["forward"] = forward
    return previous


def put_back_forward(module: Any, previous: Any) -> None:
    """Undo swap_forward with what it returned."""
    if previous is MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = previous
