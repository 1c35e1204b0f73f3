"""kernelize(model) / restore(model): run a model's layers on hub kernels, and put back exactly what was there.

The flow, each step its own module: plan (mode, backend, which kernel each layer kind gets: registry.yaml `layers`
overridden by `mapping=`; a bad mapping raises before anything changes) -> swap.take_own_configs (the model's
private config copies) -> every layer kind, in apply order, each running its jobs (find -> load -> validate -> plan ->
swap -> report rows; a kernel caught writing weights on one layer is kept out of every layer of its kind: keep_out.py)
-> the KernelizeReport. The kinds are the built-in ones (kinds.BUILTIN_KINDS) or `kinds=`, handed
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
from ..load.trust import TrustSetting, trust_policy
from .diffusers import is_diffusers_object, kernelize_diffusers, restore_diffusers
from .hf_compat import explicit_skips, strict_from
from .keep_out import ReportMark, keep_out_if_caught
from .kinds import BUILTIN_KINDS, KindRun, LayerKind, in_order
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
    trust_remote_code: TrustSetting = False,
    quantize: str | None = None,
    kinds: Sequence[LayerKind] | None = None,
    strict: bool = False,
    use_fallback: Any = None,
) -> Model:
    """Run `model`'s layers (experts, attention, ...) on the hub kernels the registry or `mapping` names for this
    backend, each checked against the layer it replaces first, so a kernel that disagrees is never swapped in.

    Args:
        model: a transformers model or Diffusers pipeline/model; patched in place, `restore(model)` undoes it.
        mode: "inference", or "training" (validation also compares gradients); HF's `kernels.Mode` values work.
        device: the device the model runs on, which picks the backend (default: where its parameters are).
        mapping: {layer kind: repo id | {backend: repo id} | loaded kernel | None} over registry.yaml's `layers`;
            HF layer names and LayerRepository values are accepted; None leaves that kind alone.
        validate: compare each layer with its own implementation first and keep that one where they disagree.
        trust_remote_code: get_kernel's rule, for the repos `mapping` names.
        quantize: "int8" or "fp8" expert weights (inference only), each block checked within its error bound.
        kinds: the layer kinds to run (default: kinds.BUILTIN_KINDS); add your own kind to extend it.
        strict: raise instead of keeping any layer's own implementation (HF's `use_fallback=False` means the same).
        use_fallback: HF's spelling of `not strict`.

    Returns:
        The same model; `kernelize_report(model)` says what was replaced, what was kept and why.

    Raises:
        KernelizeStrictError: with `strict`, naming each layer that would be kept (the model is left as it was).
        KernelHubError: a bad argument or a kernel that cannot be loaded, with what to fix.
    """
    mode = check_mode(mode)
    trust = trust_policy(trust_remote_code)
    strict = strict_from(strict, use_fallback)
    kinds = in_order(BUILTIN_KINDS if kinds is None else kinds)
    skipped = explicit_skips(mapping, kinds)
    quantize = _check_quantize(quantize, mode, kinds)
    if is_diffusers_object(model):  # Diffusers models and pipelines: the same kinds, attention via the processor API
        if quantize is not None:
            raise KernelHubError("quantize= quantizes Mixture-of-Experts expert weights; Diffusers models have no "
                                 "expert layers kernelize serves: drop quantize=")
        report = kernelize_diffusers(model, kinds=kinds, mode=mode, device=device, mapping=mapping,
                                     validate=validate, trust=trust)
        return _remember(model, _strict_check(model, report, strict, skipped))
    if not hasattr(model, "named_modules"):
        raise KernelHubError(f"kernelize wants a torch.nn.Module, got {type(model).__name__}")
    check_loaded(model)  # weights still on the meta device: one clear error before anything changes
    backend, dev = backend_of(model, device)
    # raises on a bad mapping before any change
    specs = kernel_specs(mapping, backend, trust, kinds=kinds, mode=mode)
    if is_kernelized(model):
        restore(model)
    report = KernelizeReport(model=type(model).__name__, mode=mode, backend=backend)
    # names switch on the model's own config copies
    state = KernelizeState(own_configs=take_own_configs(model), ran=kinds)
    model.__dict__[STATE_ATTR] = state
    try:
        with guarding(model):  # validation watches every tensor of the model, not only the layer's
            for kind in kinds:
                mark = ReportMark.of(report)
                kind.apply(KindRun(kind, model, specs[kind.name], backend, dev, mode, validate, state, report,
                                   quantize=quantize))
                keep_out_if_caught(report, kind.name, mark, lambda kind=kind: _undo(kind, model, state))
    except BaseException:
        restore(model)
        raise
    if state.empty():
        model.__dict__.pop(STATE_ATTR, None)
        give_back_configs(state.own_configs)
    return _remember(model, _strict_check(model, report, strict, skipped))


def _check_quantize(quantize: Any, mode: str, kinds: Sequence[LayerKind]) -> str | None:
    """kernelize's quantize= as the kind that quantizes its weights checks it (the built-in one when `kinds` has
    none), before anything changes."""
    check = next((k.quantizes for k in (*kinds, *BUILTIN_KINDS) if k.quantizes is not None), None)
    return check(quantize, mode) if check is not None else quantize


def _undo(kind: LayerKind, model: Any, state: KernelizeState) -> None:
    """One kind's swaps put back (a kernel caught writing once runs on no layer of the model)."""
    kind.restore(model, state)
    state.kinds.pop(kind.name, None)


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
    """Put back exactly what `model` ran before kernelize, so a kernelized model can be compared with its own
    layers or handed on unpatched.

    Args:
        model: a model (or Diffusers pipeline) `kernelize` patched.

    Returns:
        True when something was restored, False if the model was not kernelized.
    """
    if is_diffusers_object(model):
        return restore_diffusers(model)
    state: KernelizeState | None = model.__dict__.pop(STATE_ATTR, None)
    if state is None:
        return False
    for kind in reversed(state.ran):
        kind.restore(model, state)
    give_back_configs(state.own_configs)  # after every kind has put its names back on the copies
    return True
