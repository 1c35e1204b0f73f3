"""Prepacked expert weights for kernelize on CPU (a swap of parameters, with its own bookkeeping): swapping the
parameters for packed ones, keeping the block a normal module meanwhile, and giving them back bit for bit.

The kernel packs (its `pack_experts` / `moe_experts_packed`, oneDNN, in place); whether a block is packed is plan.py's
`decide_packing`; this module keeps the block a normal torch module while it is:

- the packed parameters stay registered under their names as meta-device placeholders (same shape, dtype and
  requires_grad, no memory), so nothing reads packed bytes as numbers: a stray numeric use fails loudly;
- `state_dict()` (and so `torch.save(model.state_dict())` and `save_pretrained`) gets dense copies of the original
  values, in the original layout, in the original key order (a state_dict post hook);
- `load_state_dict` writes into the original parameters (unpacked first) and packs again afterwards;
- `.to()` / `.float()` / `.cpu()` / ... (everything through `Module._apply`): a call that would leave the weights as
  they are keeps them packed; any other unpacks (the original parameter objects, bit for bit), applies, and packs again
  where the result can be packed (CPU, float32/bfloat16, frozen);
- `unpack_module` (restore) writes the original bytes back into the original parameter objects and removes all of it.

A block whose placeholder is replaced (`experts.gate_up_proj = nn.Parameter(...)`) or set to require grad drops its
packed copy on its next call and runs the unpacked kernel path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from ....errors import KernelHubError
from ...swap import IMPLEMENTATION_NAME, STAND_INS_ATTR, stand_in_parameters
from . import packed_op
from .contract import HOOK_ATTR
from .find import ExpertsLayout
from .plan import PACK_ENV

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .contract import PackedWeight

RECORD_ATTR = STAND_INS_ATTR
DOWN = "down_proj"
#: Set to "0" to keep every expert block unpacked.
ENV = PACK_ENV


def weight_names(layout: ExpertsLayout) -> tuple[str, str]:
    return ("gate_up_proj" if layout.has_gate else "up_proj"), DOWN


def packing_enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


@dataclass
class ModulePacking:
    """Lives on the block (module.__dict__[RECORD_ATTR]) from kernelize to restore. `holders` is None while unpacked."""

    names: tuple[str, str]
    transposed: bool
    pack: Callable[..., PackedWeight]  # the kernel's pack_experts
    holders: dict[str, PackedWeight] | None = None
    placeholders: dict[str, torch.nn.Parameter] = field(default_factory=dict)
    handles: list[RemovableHandle] = field(default_factory=list)
    reason: str = ""
    compile_handle: int = 0  # packed_op's handle: how a compiled graph names this block


def record_of(module: torch.nn.Module) -> ModulePacking | None:
    return module.__dict__.get(RECORD_ATTR)


def _placeholder(param: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                              requires_grad=param.requires_grad)


#: ids of the meta parameters standing in for packed CPU weights anywhere in a model.
placeholders = stand_in_parameters


def _pack(module: torch.nn.Module, record: ModulePacking) -> str:
    """Pack the block's two weights in place and swap in placeholders; raises the kernel's PackingError (with both
    weights left dense) when either cannot be packed. Returns the reason line."""
    holders: dict[str, PackedWeight] = {}
    try:
        for name in record.names:
            param = module._parameters[name]
            holders[name] = record.pack(param, transposed=record.transposed)
    except BaseException:
        for holder in holders.values():
            holder.unpack()
        raise
    for name in record.names:
        record.placeholders[name] = module._parameters[name] = _placeholder(holders[name].tensor)
    record.holders = holders
    routes = [getattr(h, "how", f"oneDNN batch hint {h.hint}") for h in (holders[n] for n in record.names)]
    return f"packed in place ({' / '.join(dict.fromkeys(routes))}; {_pages([holders[n] for n in record.names])})"


def _pages(holders: list[PackedWeight]) -> str:
    """What backs the packed bytes: the MiB in 2 MiB pages, or the first reason why not."""
    huge = [getattr(h, "huge_pages", (0, "ordinary pages")) for h in holders]
    if all(nbytes for nbytes, _ in huge):
        return f"{sum(nbytes for nbytes, _ in huge) >> 20} MiB in 2 MiB pages"
    return next(why for nbytes, why in huge if not nbytes)


def _unpack(module: torch.nn.Module, record: ModulePacking) -> None:
    """Original parameter objects back under their names, bytes restored; requires_grad as the placeholder now says."""
    if record.holders is None:
        return
    for name in record.names:
        holder = record.holders[name]
        tensor = holder.unpack()
        placeholder = record.placeholders.get(name)
        param = tensor if isinstance(tensor, torch.nn.Parameter) else torch.nn.Parameter(tensor, requires_grad=False)
        if placeholder is not None:
            param.requires_grad_(placeholder.requires_grad)
        if module._parameters.get(name) is placeholder:  # a parameter the user put there stays
            module._parameters[name] = param
    record.holders = None
    record.placeholders = {}


def _try_pack(module: torch.nn.Module, record: ModulePacking) -> None:
    """Pack again after a load or a conversion, where the weights allow; otherwise stay unpacked (and say why)."""
    params = [module._parameters.get(n) for n in record.names]
    if any(p is None or p.requires_grad or p.device.type != "cpu" for p in params):
        record.reason = "unpacked: weights not on CPU or requiring grad"
        return
    try:
        record.reason = _pack(module, record)
    except Exception as exc:  # the kernel refused: the block runs its unpacked path
        record.reason = f"unpacked: {exc}"


def active_holders(module: torch.nn.Module) -> dict[str, PackedWeight] | None:
    """The packed weights a call may use, or None (unpacked path). Drops the packed copy of a block whose placeholder
    was replaced or set to require grad, so its next calls read the parameters it now has."""
    record = record_of(module)
    if record is None or record.holders is None:
        return None
    for name in record.names:
        placeholder = record.placeholders[name]
        if module._parameters.get(name) is not placeholder or placeholder.requires_grad:
            _unpack(module, record)
            record.reason = f"unpacked: {name} was replaced or set to require grad"
            return None
    return record.holders


# --- hooks: state_dict, load_state_dict, Module._apply ----------------------------------------------------------------


def _state_dict_hook(module: torch.nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                     local_metadata: dict[str, object]) -> None:
    record = record_of(module)
    if record is None or record.holders is None:
        return
    for name in record.names:
        key = prefix + name
        if key in state_dict:  # assignment to an existing key keeps its place in the order
            value = state_dict[key]
            dense = record.holders[name].dense()
            state_dict[key] = (torch.nn.Parameter(dense, requires_grad=value.requires_grad)
                               if isinstance(value, torch.nn.Parameter) else dense)


def _load_pre_hook(module: torch.nn.Module, *args: object) -> None:
    record = record_of(module)
    if record is not None:
        _unpack(module, record)


def _load_post_hook(module: torch.nn.Module, incompatible_keys: object) -> None:
    record = record_of(module)
    if record is not None and record.holders is None:
        _try_pack(module, record)


def _leaves_weights_alone(fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> bool:
    """Would `fn` (a Module._apply function) return a CPU tensor of `dtype` unchanged? (.to() to where it already is)"""
    probe = torch.empty(1, dtype=dtype)
    try:
        return fn(probe) is probe and not probe.is_shared()
    except Exception:
        return False


class PackedApply:
    """The block's instance `_apply` (what .to(), .float(), .cpu(), .to_empty(), .share_memory() go through); a class,
    not a closure, so deepcopy rebinds it to the copy."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> torch.nn.Module:
        module = self.module
        record = record_of(module)
        base = type(module)._apply
        if record is None:
            return base(module, fn, recurse)
        if record.holders is not None and _leaves_weights_alone(fn, record.holders[record.names[0]].dtype):
            with _placeholders_hidden(module, record):
                return base(module, fn, recurse)
        _unpack(module, record)
        result = base(module, fn, recurse)
        _try_pack(module, record)
        return result


@contextlib.contextmanager
def _placeholders_hidden(module: torch.nn.Module, record: ModulePacking):
    """Take the placeholders out of _parameters for the duration, then put them back in their places."""
    order = list(module._parameters)
    for name in record.names:
        del module._parameters[name]
    try:
        yield
    finally:
        current = dict(module._parameters)
        module._parameters.clear()
        for name in order + [k for k in current if k not in order]:
            module._parameters[name] = record.placeholders[name] if name in record.names else current[name]


# --- install / remove -----------------------------------------------------------------------------------------------


def _guard_other_implementations(module: torch.nn.Module, args: tuple[object, ...]) -> None:
    """Forward pre-hook of a packed block: transformers' own experts implementations (a model switched back with
    set_experts_implementation) would read the meta placeholders and fail deep inside with a dtype or device error;
    say what happened and what to do instead."""
    if HOOK_ATTR not in module.__dict__ or "forward" in module.__dict__:
        return  # the block's own forward is ours (or it is not routed through the interface)
    chosen = getattr(getattr(module, "config", None), "_experts_implementation", IMPLEMENTATION_NAME)
    if chosen != IMPLEMENTATION_NAME and active_holders(module) is not None:
        raise KernelHubError(
            f"{type(module).__name__}: its expert weights are packed by kernel_hub.kernelize (CPU inference), which "
            f"the {chosen!r} experts implementation cannot read; call kernel_hub.restore(model) before switching, "
            f"or kernelize with {ENV}=0 to keep the weights dense")


def pack_module(module: torch.nn.Module, layout: ExpertsLayout, kernel: ModuleType) -> tuple[bool, str]:
    """Pack the block's expert weights and install the hooks that keep it a normal module; (packed, why). On a refusal
    the block is left exactly as it was."""
    record = ModulePacking(names=weight_names(layout), transposed=layout.is_transposed, pack=kernel.pack_experts)
    try:
        record.reason = _pack(module, record)
    except Exception as exc:
        return False, f"not packed: {exc}"
    module.__dict__[RECORD_ATTR] = record
    record.compile_handle = packed_op.register(module)
    record.handles = [module.register_state_dict_post_hook(_state_dict_hook),
                      module.register_load_state_dict_pre_hook(_load_pre_hook),
                      module.register_load_state_dict_post_hook(_load_post_hook),
                      module.register_forward_pre_hook(_guard_other_implementations)]
    module.__dict__["_apply"] = PackedApply(module)
    return True, record.reason


def unpack_module(module: torch.nn.Module) -> bool:
    """Give the block its original parameters back (bit for bit, same objects) and remove every packing hook."""
    record = module.__dict__.pop(RECORD_ATTR, None)
    if record is None:
        return False
    _unpack(module, record)
    for handle in record.handles:
        handle.remove()
    if isinstance(module.__dict__.get("_apply"), PackedApply):
        del module.__dict__["_apply"]
    return True
