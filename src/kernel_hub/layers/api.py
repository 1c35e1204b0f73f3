"""kernelize(model) / restore(model): run a model's layers on hub kernels, and put back exactly what was there.

The flow, each step its own module: plan (mode, backend, which kernel each layer kind gets: registry.yaml `layers`
overridden by `mapping=`; a bad mapping raises before anything changes) -> swap.take_own_configs (the model's
private config copies) -> every layer kind, in apply order, each running its jobs (find -> load -> validate -> plan ->
swap -> report rows) -> the KernelizeReport. The kinds are the built-in ones (kinds.BUILTIN_KINDS) or `kinds=`, handed
down from here: no job below looks kinds up. Any exception on the way restores the model before it propagates, so a
model is never left half patched; restore runs the restore of each kind that ran, in reverse order, then gives the
original configs back. Diffusers models and pipelines go to the Diffusers adapter (diffusers.py), through the same
kinds.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from ..errors import KernelHubError, KernelizeStrictError
from .diffusers import is_diffusers_object, kernelize_diffusers, restore_diffusers
from .hf_compat import explicit_skips, strict_from
from .kinds import BUILTIN_KINDS, KindRun, LayerKind, in_order
from .kinds.experts.quantize import check_quantize
from .plan import backend_of, check_mode, kernel_specs
from .report import KernelizeReport, strict_failures
from .swap import STATE_ATTR, KernelizeState, give_back_configs, is_kernelized, take_own_configs
from .weights_guard import check_loaded
from .write_watch import guarding

__all__ = ["KIND_EXPORTS", "SUPPORTED_KINDS", "is_kernelized", "kernelize", "kernelize_report", "restore"]

#: The built-in layer kinds (kinds.BUILTIN_KINDS, one folder each), by name.
SUPPORTED_KINDS = tuple(k.name for k in BUILTIN_KINDS)
#: The function a loaded kernel must export to serve each built-in layer kind.
KIND_EXPORTS = {k.name: k.export for k in BUILTIN_KINDS}

Model = TypeVar("Model")

# The last report of each model kernelize saw; weak, so a report never keeps a dropped model alive.
_REPORTS: weakref.WeakKeyDictionary[Any, KernelizeReport] = weakref.WeakKeyDictionary()


def kernelize(
    model: Model,
    *,
    mode: Any = "inference",
    device: Any = None,
    mapping: dict[str, Any] | None = None,
    validate: bool = True,
    trust_remote_code: Any = False,
    quantize: str | None = None,
    kinds: Sequence[LayerKind] | None = None,
    strict: bool = False,
    use_fallback: Any = None,
) -> Model:
    """Run `model`'s expert and attention layers on the hub kernels the registry (or `mapping`) names for
    this backend (attention: through transformers' AttentionInterface; `mapping={"attention": None}` skips it).

    Returns the model itself, patched in place (`model = kh.kernelize(model)`, as HF `kernels` does);
    `kernelize_report(model)` gives what was replaced and what was kept, and why.

    mode: "inference", or "training" (validation also compares gradients); HF's `kernels.Mode.INFERENCE` /
    `Mode.TRAINING` mean the same (TORCH_COMPILE is refused). device: the device the model runs on (default: where
    its parameters are) picks the backend. mapping: {layer kind: repo id | {backend: repo id} | loaded kernel |
    None} overrides registry.yaml's `layers`; HF layer names ("RMSNorm", "MegaBlocksMoeMLP", "<Family>Experts") are
    kinds too, and HF's LayerRepository / LocalLayerRepository (alone, per device, per Mode) are values. validate: check
    each layer against its current implementation first and keep that one where they disagree.
    `restore(model)` undoes everything. A repo is also {"repo_id", "version", "revision"}; one outside
    registry.yaml with neither gets its newest release. trust_remote_code: get_kernel's rule, for the repos
    `mapping` names. quantize: "int8" (per output channel) or "fp8" (128x128 blocks), inference only: the expert
    weights are read as quantized copies kept with each block, each checked against the block's own layer within
    the bound quantize.error_bound derives; the model's parameters are untouched (kinds/experts/quantize.py). kinds:
    the layer kinds to run (default: kinds.BUILTIN_KINDS); `(*BUILTIN_KINDS, my_kind)` adds a kind declared anywhere
    (layers/kinds/__init__.py says what one needs), and restore(model) runs its restore too. strict (or HF's
    `use_fallback=False`): raise KernelizeStrictError naming each layer that would keep its own implementation and
    why, with the model left as it was; a kind mapped to None is left alone without raising.
    """
    mode = check_mode(mode)
    strict = strict_from(strict, use_fallback)
    kinds = in_order(BUILTIN_KINDS if kinds is None else kinds)
    skipped = explicit_skips(mapping, tuple(k.name for k in kinds))
    quantize = check_quantize(quantize, mode)
    if is_diffusers_object(model):  # Diffusers models and pipelines: the same kinds, attention via the processor API
        if quantize is not None:
            raise KernelHubError("quantize= quantizes Mixture-of-Experts expert weights; Diffusers models have no "
                                 "expert layers kernelize serves: drop quantize=")
        report = kernelize_diffusers(model, kinds=kinds, mode=mode, device=device, mapping=mapping,
                                     validate=validate, trust_remote_code=trust_remote_code)
        return _remember(model, _strict_check(model, report, strict, skipped))
    if not hasattr(model, "named_modules"):
        raise KernelHubError(f"kernelize wants a torch.nn.Module, got {type(model).__name__}")
    check_loaded(model)  # weights still on the meta device: one clear error before anything changes
    backend, dev = backend_of(model, device)
    # raises on a bad mapping before any change
    specs = kernel_specs(mapping, backend, trust_remote_code, kinds=kinds, mode=mode)
    if is_kernelized(model):
        restore(model)
    report = KernelizeReport(model=type(model).__name__, mode=mode, backend=backend)
    # names switch on the model's own config copies
    state = KernelizeState(own_configs=take_own_configs(model), ran=kinds)
    model.__dict__[STATE_ATTR] = state
    try:
        with guarding(model):  # validation watches every tensor of the model, not only the layer's
            for kind in kinds:
                kind.apply(KindRun(kind, model, specs[kind.name], backend, dev, mode, validate, state, report,
                                   quantize=quantize))
    except BaseException:
        restore(model)
        raise
    if state.empty():
        model.__dict__.pop(STATE_ATTR, None)
        give_back_configs(state.own_configs)
    return _remember(model, _strict_check(model, report, strict, skipped))


def _strict_check(model: Any, report: KernelizeReport, strict: bool, skipped: frozenset[str]) -> KernelizeReport:
    """Under strict, a layer kept on its own implementation undoes the whole kernelize and raises, naming it."""
    failures = strict_failures(report, skipped) if strict else []
    if not failures:
        return report
    restore(model)
    _REPORTS[model] = report  # what was tried stays readable through kernelize_report
    listed = "; ".join(f"{layer}: {why}" for layer, why in failures[:5])
    more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
    raise KernelizeStrictError(f"strict kernelize: {len(failures)} layer(s) would keep their own implementation, "
                               f"so {type(model).__name__} is left unchanged: {listed}{more}; map a kind to None to "
                               "leave it alone")


def _remember(model: Model, report: KernelizeReport) -> Model:
    _REPORTS[model] = report
    return model


def kernelize_report(model: Any) -> KernelizeReport:
    """The report of the last `kernelize(model)`: `.replaced`, `.kept`, `.to_json()`, and `str()` is a table.

    Args:
        model: a model (or Diffusers pipeline) that `kernelize` returned.

    Returns:
        The KernelizeReport of its last kernelize; it stays readable after `restore(model)`.

    Raises:
        KernelHubError: the model was never kernelized in this process.
    """
    try:
        return _REPORTS[model]
    except (KeyError, TypeError):
        raise KernelHubError(f"{type(model).__name__} was never kernelized in this process: call "
                             "kh.kernelize(model) first") from None


def restore(model: Any) -> bool:
    """Put back exactly what `model` ran before kernelize; False if it was not kernelized."""
    if is_diffusers_object(model):
        return restore_diffusers(model)
    state: KernelizeState | None = model.__dict__.pop(STATE_ATTR, None)
    if state is None:
        return False
    for kind in reversed(state.ran):
        kind.restore(model, state)
    give_back_configs(state.own_configs)  # after every kind has put its names back on the copies
    return True
