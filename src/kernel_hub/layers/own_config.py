"""Give a model its own copies of its modules' configs: kernelize never changes a config another model shares.

transformers dispatches attention and experts by the name on a config (`_attn_implementation`,
`_experts_implementation`), and two models built from one config object hold that very object (and its sub-configs,
text_config and the like). Switching one model's implementation on the shared object would switch the other model
too, silently: it would then run under "kernel_hub" with no hooks of its own, and the restore of either model would
pull the name out from under the other. kernelize therefore swaps in deep copies (one copy per distinct config
object, sub-configs included, so modules that shared a config still share its copy) before it switches anything, and
restore hands the original objects back to the modules that still hold the copies.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OwnConfigs:
    """(module, original config, the copy put there) for every module kernelize gave a copy."""

    swaps: list[tuple[Any, Any, Any]] = field(default_factory=list)


def _is_config(value: Any) -> bool:
    try:
        from transformers import PretrainedConfig
    except ImportError:  # no transformers: nothing dispatches on a config
        return False
    return isinstance(value, PretrainedConfig)


def take_own_configs(model: Any) -> OwnConfigs:
    """Replace every module's `config` by a private deep copy (shared objects map to one shared copy)."""
    memo: dict[int, Any] = {}  # one deepcopy memo: a sub-config reached twice is copied once
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
