"""Switching transformers' configs between attention implementations: the names kernelize registers, each config's
implementation before kernelize (what the registered mask function and a hookless layer delegate to), the entry into
continuous batching that gives the configs the flash-named name for its run, and the per-model config class that lets
a kernelized model's config ask for attention weights and keeps building models.

"kernel_hub" and "kernel_hub_flash" run the same functions (dispatch.py registers them in AttentionInterface, and
kernel_hub_mask here in AttentionMaskInterface): the mask function delegates to the model's previous implementation's
mask function, so every layer gets exactly the mask its previous implementation would get. A kernelized model's
configs name "kernel_hub": a model built from them (`type(model)(model.config)`, `from_config`, an assistant model)
passes transformers' checks as for any registered name. Only transformers' continuous batching needs a flash-named
implementation (it accepts no other custom one), and transformers would load a flash-attn package for a flash-named
name at model construction (GPT-OSS: fetch `kernels-community/vllm-flash-attn3`), so the configs carry
"kernel_hub_flash" only while a continuous-batching manager of the model runs (`BatchingEntry`).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...swap import IMPLEMENTATION_NAME as _SWAP_NAME

#: The implementation name a kernelized model's attention configs carry (the name set_attn_implementation takes).
IMPLEMENTATION_NAME = _SWAP_NAME
#: The same functions under a flash-named name: what the configs carry while continuous batching runs the model.
BATCHING_NAME = "kernel_hub_flash"
NAMES = (IMPLEMENTATION_NAME, BATCHING_NAME)
#: The model method every continuous-batching entry goes through (generate_batch, the context manager, serve).
BATCHING_ENTRY = "init_continuous_batching"

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


def remember_previous(config: Any, previous: str | None) -> None:
    """Record `config`'s implementation before kernelize (dropped with the config: an id is never reused while its
    entry stays)."""
    PREVIOUS[id(config)] = previous
    weakref.finalize(config, PREVIOUS.pop, id(config), None)


def switch_configs(configs: Iterable[Any], name: str) -> None:
    """Set `name` on configs that carry one of kernelize's names (set on the internal field: transformers would try to
    load a flash-attn package for a flash-named one)."""
    for cfg in configs:
        if cfg._attn_implementation in NAMES:
            cfg._attn_implementation_internal = name


class BatchingEntry:
    """`model`'s init_continuous_batching for its instance: the configs carry BATCHING_NAME from the manager's start
    until its stop, then IMPLEMENTATION_NAME again. Holds the model weakly (it lives in the model's __dict__); a deep
    copy of the model gets an entry of its own, on the copy and the copy's configs."""

    def __init__(self, model: Any, configs: list[Any]) -> None:
        self._model = weakref.ref(model)
        self.configs = configs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model()
        switch_configs(self.configs, BATCHING_NAME)
        try:
            manager = getattr(type(model), BATCHING_ENTRY)(model, *args, **kwargs)
        except BaseException:
            switch_configs(self.configs, IMPLEMENTATION_NAME)
            raise
        _rename_on_stop(manager, self.configs)
        return manager

    def __deepcopy__(self, memo: dict[int, Any]) -> BatchingEntry:
        model = self._model()
        return BatchingEntry(memo.get(id(model), model), copy.deepcopy(self.configs, memo))


def _rename_on_stop(manager: Any, configs: list[Any]) -> None:
    """Wrap this manager's stop (once: a persistent manager comes back through the entry) to put the name back."""
    if "stop" in vars(manager) or not callable(getattr(manager, "stop", None)):
        return
    stop = manager.stop

    def stop_then_rename(*args: Any, **kwargs: Any) -> Any:
        try:
            return stop(*args, **kwargs)
        finally:
            switch_configs(configs, IMPLEMENTATION_NAME)

    manager.stop = stop_then_rename


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
    ns["__deepcopy__"] = _deepcopy_remembering
    for name in ("validate_output_attentions", "validate"):
        check = getattr(cls, name, None)
        if callable(check):
            ns[name] = _eager_check(check)
    made = type(cls.__name__, (cls,), ns)
    made.__qualname__ = f"ACCEPTING.{key}"
    return made


def _deepcopy_remembering(self: Any, memo: dict[int, Any]) -> Any:
    """A copy of a kernelized config (`from_config` copies the config it is given) delegates to the same previous
    implementation: the registered functions find it by the config's id."""
    twin = type(self).__new__(type(self))
    memo[id(self)] = twin
    for key, value in vars(self).items():
        twin.__dict__[key] = copy.deepcopy(value, memo)
    if id(self) in PREVIOUS:
        remember_previous(twin, PREVIOUS[id(self)])
    return twin


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
