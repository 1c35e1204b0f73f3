"""Layer kind `attention`: transformers attention through AttentionInterface, served by flash attention.

The machinery lives in layers/api.py (`_kernelize_attention`) and layers/attention_api.py / attention.py; on Diffusers
models in layers/diffusers.py / diffusers_route.py (the processor API). This module declares it.
"""

from __future__ import annotations

from typing import Any

from . import KindRun, LayerKind


def _apply(run: KindRun) -> None:
    from ..api import _kernelize_attention

    _kernelize_attention(run.model, run.spec, run.backend, run.device, run.mode, run.validate, run.state, run.report)


def _restore(model: Any, state: Any) -> None:
    from ..attention_api import restore_attention

    restore_attention(model, state.attention)


def _apply_diffusers(run: KindRun) -> None:
    from ..diffusers import kernelize_attention_processors

    kernelize_attention_processors(run)


def _restore_diffusers(model: Any, state: Any) -> None:
    from ..diffusers import restore_attention_processors

    restore_attention_processors(model, state)


KIND = LayerKind(
    name="attention",
    export="flash_attention",
    finds="every module that calls transformers' attention function (found by running the model once)",
    contract="transformers' attention call (module, query, key, value, attention_mask, ...) -> (out, None)",
    validated_on="a padded random batch through the model, each layer against its previous implementation",
    apply=_apply,
    restore=_restore,
    order=1,
    diffusers=(_apply_diffusers, _restore_diffusers),  # Diffusers: each attention processor wrapped (diffusers_route)
)
