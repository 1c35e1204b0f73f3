"""Switching transformers' configs between attention implementations: the names kernelize registers, each config's
implementation before kernelize (what the registered mask function and a hookless layer delegate to), and the
per-model config class that lets a kernelized model's config ask for attention weights.

"kernel_hub" and "kernel_hub_flash" run the same functions (dispatch.py registers them in AttentionInterface, and
kernel_hub_mask here in AttentionMaskInterface): the mask function delegates to the model's previous implementation's
mask function, so every layer gets exactly the mask its previous implementation would get. The flash-named one exists
because transformers' continuous batching accepts no other custom implementation; transformers loads a flash-attn
package for any flash-named implementation it is asked to switch to, so kernelize sets that name on the configs itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...swap import IMPLEMENTATION_NAME as SETTABLE_NAME

#: The implementation name kernelize switches a model's attention configs to (flash-named: continuous batching
#: accepts it); SETTABLE_NAME ("kernel_hub") runs the same functions and is the name set_attn_implementation takes.
IMPLEMENTATION_NAME = "kernel_hub_flash"
NAMES = (IMPLEMENTATION_NAME, SETTABLE_NAME)

#: id(config) -> attention implementation before kernelize (what the mask function delegates to).
PREVIOUS: dict[int, str | None] = {}


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

    previous = PREVIOUS.get(id(config), "sdpa")
    fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(previous or "sdpa", sdpa_mask)
    if fn is kernel_hub_mask:
        fn = sdpa_mask
    return fn(*args, config=config, **kwargs)


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
# attention (dispatch.py), so a kernelized model's config accepts the request as eager would. Per model: kernelize
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
