"""The Diffusers adapter: kernelize / restore for a Diffusers model or pipeline, through the same layer kinds
(layers/kinds/) and jobs as a transformers model.

Flow: a model, or a pipeline's denoiser components (its transformer(s) / UNet) -> for each denoiser, every layer kind
kernelize hands down, in apply order, as its declaration's `diffusers` says: RMSNorm by structure (torch.nn.RMSNorm,
Diffusers' RMSNorm, ...) exactly as on any model; attention through the processor API (kinds/attention/diffusers.py);
experts left out (Diffusers denoisers have no transformers expert blocks). A pipeline's rows are named
`<component>.<path>`. Any exception restores every module before it propagates; `restore` runs the restore of each
kind that ran, in reverse order, so each module gets back exactly what it had.

Nothing here imports diffusers: a Diffusers object is recognised by the modules its classes come from (find.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import KernelHubError
from ..load.trust import NOTHING_EXTRA, TrustPolicy
from .find import is_denoiser, is_diffusers_object, is_pipeline
from .keep_out import ReportMark, keep_out_if_caught
from .kinds.declaration import KindRun, LayerKind
from .plan import backend_of, kernel_specs
from .report import KernelizeReport
from .swap import STATE_ATTR
from .weights_guard import check_loaded
from .write_watch import guarding

__all__ = ["DiffusersState", "fallbacks", "is_denoiser", "is_diffusers_object", "is_pipeline", "kernelize_diffusers",
           "restore_diffusers"]


@dataclass
class DiffusersState:
    """What restore needs: module path -> installed route (the attention kind's AttentionRoute, holding the original),
    the other kinds' states by name (as kernelize's state holds them), kernelized components (a pipeline's), and the
    kinds that ran (restore runs theirs)."""

    routes: dict[str, Any] = field(default_factory=dict)
    kinds: dict[str, Any] = field(default_factory=dict)
    components: list[str] = field(default_factory=list)
    ran: tuple[LayerKind, ...] = ()

    def empty(self) -> bool:
        return not (self.routes or self.kinds or self.components)


def _prefixed(report: KernelizeReport, start: tuple[int, int], prefix: str) -> None:
    """Name the rows a component added since `start` (replaced, kept counts) `<component>.<path>`."""
    r, k = start
    report.replaced[r:] = [replace(row, layer=f"{prefix}.{row.layer}") for row in report.replaced[r:]]
    report.kept[k:] = [replace(row, layer=f"{prefix}.{row.layer}") for row in report.kept[k:]]


def _components(pipeline: Any, report: KernelizeReport) -> list[tuple[str, Any]]:
    """The pipeline's denoisers; the other components are named in a note."""
    picked, others = [], []
    for name, comp in pipeline.components.items():
        if comp is None:
            continue
        (picked if is_denoiser(comp) else others).append((name, comp))
    if others:
        report.notes.append("untouched components (kernelize swaps the denoiser's attention): "
                            + ", ".join(f"{n} ({type(c).__name__})" for n, c in others))
    return picked


def kernelize_diffusers(obj: Any, *, kinds: Sequence[LayerKind], mode: str, device: Any,
                        mapping: dict[str, Any] | None, validate: bool, trust: TrustPolicy = NOTHING_EXTRA
                        ) -> KernelizeReport:
    """kernelize for a Diffusers model or pipeline (layers.api.kernelize hands these over, with the kinds in apply
    order, after its mode check): every layer kind on each denoiser, as the kind's `diffusers` declares."""
    pipeline = is_pipeline(obj)
    if not pipeline and not hasattr(obj, "named_modules"):
        raise KernelHubError(f"kernelize wants a Diffusers model or pipeline, got {type(obj).__name__}")
    report = KernelizeReport(model=type(obj).__name__, mode=mode, backend="cpu")
    models = _components(obj, report) if pipeline else [("", obj)]
    for _, model in models:
        check_loaded(model)  # weights still on the meta device: one clear error before anything changes
    dev = device
    if models:
        report.backend, dev = backend_of(models[0][1], device)
    # raises on a bad mapping before any change
    specs = kernel_specs(mapping, report.backend, trust, kinds=kinds, mode=mode)
    if not models:
        report.notes.append(f"{type(obj).__name__} has no Diffusers transformer or UNet component")
        return report
    restore_diffusers(obj)
    kinds = tuple(k for k in kinds if not isinstance(k.diffusers, str))
    state = obj.__dict__[STATE_ATTR] = DiffusersState(ran=kinds)
    try:
        for name, model in models:
            target = state
            if pipeline:  # each component carries its own state, so restore(component) works too
                restore_diffusers(model)
                target = model.__dict__[STATE_ATTR] = DiffusersState(ran=kinds)
                state.components.append(name)
            start = (len(report.replaced), len(report.kept))
            with guarding(model):  # validation watches every tensor of this model, not only the layer's
                for kind in kinds:
                    apply = kind.diffusers[0] if kind.diffusers else kind.apply
                    mark = ReportMark.of(report)
                    apply(KindRun(kind, model, specs[kind.name], report.backend, dev, mode, validate, target,
                                  report))
                    keep_out_if_caught(report, kind.name, mark, lambda k=kind, m=model, t=target: _undo(k, m, t))
            if pipeline:
                _prefixed(report, start, name)
                if target.empty():
                    model.__dict__.pop(STATE_ATTR, None)
                    state.components.remove(name)
    except BaseException:
        restore_diffusers(obj)
        raise
    if state.empty():
        obj.__dict__.pop(STATE_ATTR, None)
    report.notes = list(dict.fromkeys(report.notes))  # a pipeline's components say the same things once
    return report


def _undo(kind: LayerKind, model: Any, state: DiffusersState) -> None:
    """One kind's swaps on one component put back (its kernel was caught writing)."""
    (kind.diffusers[1] if kind.diffusers else kind.restore)(model, state)
    state.kinds.pop(kind.name, None)


def restore_diffusers(obj: Any) -> bool:
    """Put back exactly what each kind changed (and a pipeline's components'); False if not kernelized."""
    state: DiffusersState | None = obj.__dict__.pop(STATE_ATTR, None)
    if state is None:
        return False
    for name in state.components:
        with contextlib.suppress(KeyError, AttributeError):
            restore_diffusers(obj.components[name])
    for kind in reversed(state.ran):
        (kind.diffusers[1] if kind.diffusers else kind.restore)(obj, state)
    return True


def fallbacks(obj: Any) -> dict[str, tuple[int, int, str]]:
    """layer -> (calls the kernel served, calls that ran torch's sdpa, why the last one did), for every
    routed layer of a kernelized model or pipeline."""
    state: DiffusersState | None = getattr(obj, "__dict__", {}).get(STATE_ATTR)
    if state is None:
        return {}
    out: dict[str, tuple[int, int, str]] = {}
    for name in state.components:
        out.update({f"{name}.{k}": v for k, v in fallbacks(obj.components[name]).items()})
    out.update({p: (r.calls, r.fallbacks, r.last_fallback) for p, r in state.routes.items()})
    return out
