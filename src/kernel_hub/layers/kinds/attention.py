"""Layer kind `attention`: transformers attention through AttentionInterface, served by flash attention.

The machinery lives in layers/api.py (`_kernelize_attention`) and layers/attention_api.py / attention.py; this module
declares it.
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


KIND = LayerKind(
    name="attention",
    export="flash_attention",
    finds="every module that calls transformers' attention function (found by running the model once)",
    contract="transformers' attention call (module, query, key, value, attention_mask, ...) -> (out, None)",
    validated_on="a padded random batch through the model, each layer against its previous implementation",
    apply=_apply,
    restore=_restore,
    order=1,
)
