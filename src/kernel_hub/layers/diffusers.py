"""The Diffusers adapter: kernelize / restore for a Diffusers model or pipeline, through the same layer kinds
(layers/kinds/) and jobs as a transformers model, and the attention kind's apply / restore on a denoiser.

Flow: a model, or a pipeline's denoiser components (its transformer(s) / UNet) -> for each denoiser, every layer kind
in apply order, as its declaration's `diffusers` says: RMSNorm by structure (torch.nn.RMSNorm, Diffusers' RMSNorm, ...)
exactly as on any model; attention through the processor API (below); experts left out (Diffusers denoisers have no
transformers expert blocks). A pipeline's rows are named `<component>.<path>`. Any exception restores every module
before it propagates; `restore` runs each kind's restore in reverse order, so each module gets back exactly what it had.

Attention: every attention module (anything with `processor` and `set_processor`) -> install `AttentionRoute`
(diffusers_route.py) in probe mode -> one validation call of the module on random hidden states of its own widths
(plus encoder states for joint / cross attention): each sdpa call runs torch's and the kernel on the same q/k/v,
keeping torch's -> keep the route where the kernel matched within the dtype tolerance, put the original processor back
(with the reason) where it did not, or where the processor never called sdpa. Restore puts each original processor
object back.

Nothing here imports diffusers: a Diffusers object is recognised by the modules its classes come from (find.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..errors import KernelHubError
from .attention import LAYER_KIND
from .diffusers_route import AttentionRoute, Probe
from .find import diffusers_attention_modules as attention_modules
from .find import encoder_width, is_denoiser, is_diffusers_object, is_pipeline
from .kinds import KindRun, all_kinds
from .load import kernel_for, kernel_info
from .plan import backend_of, kernel_specs, verdict
from .report import Kept, KernelizeReport, Replaced
from .swap import STATE_ATTR
from .validate import TOLERANCE, diffusers_attention_call, dtype_device
from .weights_guard import check_loaded

__all__ = ["DiffusersState", "fallbacks", "is_denoiser", "is_diffusers_object", "is_pipeline", "kernelize_diffusers",
           "restore_diffusers"]


@dataclass
class DiffusersState:
    """What restore needs: module path -> installed route (holding the original), the other kinds' states by name
    (as kernelize's state holds them), kernelized components (a pipeline's)."""

    routes: dict[str, AttentionRoute] = field(default_factory=dict)
    kinds: dict[str, Any] = field(default_factory=dict)
    components: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.routes or self.kinds or self.components)


def _layout(module: Any, route: AttentionRoute, probe: Probe) -> str:
    (q, k), kind = probe.shapes[0], "self"
    if isinstance(getattr(module, "add_k_proj", None), torch.nn.Linear):
        kind = "joint"
    elif encoder_width(module) is not None:
        kind = "cross"
    heads = f"heads {q[-3]}/{k[-3]}" if len(q) == 4 else f"{q[0]} heads x batch"
    return f"{type(route.original).__name__}: {kind}, {heads}, d{q[-1]}"


def _validate(module: Any, route: AttentionRoute, seed: int) -> Probe:
    """Probe the module's calls: first as its projections suggest (encoder_width), then, for processors
    that always concatenate encoder states (CogVideoX, CogView4, Lumina2 style), with encoder states of
    the query's width."""
    first = encoder_width(module)
    to_q = getattr(module, "to_q", None)
    tries = [first] + ([to_q.in_features] if first is None and isinstance(to_q, torch.nn.Linear) else [])
    error = ""
    for encoder in tries:
        route.probe = probe = Probe()
        try:
            diffusers_attention_call(module, encoder, seed)
        except Exception as exc:  # the module could not run this call: the next try, or kept with the reason
            error = error or f"validation call failed: {type(exc).__name__}: {exc}"
            continue
        finally:
            route.probe = None
        return probe
    return Probe(failure=error)


def _where_attention_ran(processor: Any) -> str:
    if not hasattr(processor, "_attention_backend"):
        return "it computes attention itself, not through Diffusers' dispatcher"
    backend = processor._attention_backend
    if backend is None:
        return "attention backend: the dispatcher's active one"
    return f"attention backend: {getattr(backend, 'value', backend)}"


def _keep_reason(route: AttentionRoute, probe: Probe, validate: bool, tol: float) -> str:
    """Why this module keeps its processor after its validation call ("" if the route stays)."""
    if probe.failure:
        return probe.failure
    if not probe.shapes:
        return (f"{type(route.original).__name__} did not call torch scaled_dot_product_attention "
                f"({_where_attention_ran(route.original)})")
    return verdict(max(probe.errors), tol) if validate else ""


def _static_reason(module: Any) -> str:
    """Modules kernelize leaves alone before trying them."""
    processor = module.processor
    if isinstance(processor, AttentionRoute):
        return "already routed by another kernelize"
    if isinstance(processor, torch.nn.Module):
        return f"{type(processor).__name__} holds weights (a torch module): left in place"
    if getattr(processor, "_parallel_config", None) is not None:
        return "context parallelism is enabled on this processor"
    return ""


def _kernelize_model(model: Any, kernel: Any, repo_id: str, info: dict[str, Any], *, validate: bool,
                     tolerance: dict, state: DiffusersState, report: KernelizeReport) -> None:
    for i, (path, module) in enumerate(attention_modules(model)):
        reason = _static_reason(module)
        if reason:
            report.kept.append(Kept(path, LAYER_KIND, reason))
            continue
        original = module.processor
        route = AttentionRoute(original, kernel.flash_attention)
        state.routes[path] = route
        module.set_processor(route)
        probe = _validate(module, route, seed=i)
        tol = tolerance.get(dtype_device(module)[0], 1e-4)
        reason = _keep_reason(route, probe, validate, tol)
        if reason:
            module.set_processor(original)
            del state.routes[path]
            report.kept.append(Kept(path, LAYER_KIND, reason))
            continue
        report.replaced.append(Replaced(
            layer=path, kind=LAYER_KIND, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="processor",
            layout=_layout(module, route, probe), max_error=max(probe.errors) if validate else None,
            tolerance=tol if validate else None))


def kernelize_attention_processors(run: KindRun) -> None:
    """The attention kind on one Diffusers denoiser (its `diffusers` apply): route every attention processor whose
    sdpa calls the kernel matches; `run.state` is the denoiser's DiffusersState."""
    if not attention_modules(run.model):
        run.report.notes.append(f"{type(run.model).__name__}: no Diffusers attention module found")
        return
    loaded = kernel_for(run, LAYER_KIND, runs_the_model=False)
    if loaded is None:
        return
    kernel, repo_id = loaded
    info = kernel_info(kernel, run.device, "flash_attention")
    _kernelize_model(run.model, kernel, repo_id, info, validate=run.validate, tolerance=TOLERANCE,
                     state=run.state, report=run.report)
    if run.state.routes:
        run.report.notes.append("attention processors wrapped (Diffusers processor API): each runs its own processor "
                                "with its scaled_dot_product_attention calls on the kernel; calls it cannot express "
                                "(masks other than key padding, dropout, ...) run torch's")
        if run.mode == "training":
            run.report.notes.append("attention validated on the forward pass (its backward is the kernel's autograd)")


def restore_attention_processors(model: Any, state: DiffusersState) -> None:
    """The attention kind's restore on a Diffusers denoiser: each original processor object back."""
    for path, route in state.routes.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if module.processor is route:  # a processor the user set since is left alone
            module.set_processor(route.original)


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


def kernelize_diffusers(obj: Any, *, mode: str, device: Any, mapping: dict[str, Any] | None, validate: bool,
                        trust_remote_code: Any = False) -> KernelizeReport:
    """kernelize for a Diffusers model or pipeline (layers.api.kernelize hands these over after its mode check): every
    layer kind on each denoiser, as the kind's `diffusers` declares."""
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
    specs = kernel_specs(mapping, report.backend, trust_remote_code)  # raises on a bad mapping before any change
    if not models:
        report.notes.append(f"{type(obj).__name__} has no Diffusers transformer or UNet component")
        return report
    restore_diffusers(obj)
    kinds = [k for k in all_kinds() if not isinstance(k.diffusers, str)]
    state = obj.__dict__[STATE_ATTR] = DiffusersState()
    try:
        for name, model in models:
            target = state
            if pipeline:  # each component carries its own state, so restore(component) works too
                restore_diffusers(model)
                target = model.__dict__[STATE_ATTR] = DiffusersState()
                state.components.append(name)
            start = (len(report.replaced), len(report.kept))
            for kind in kinds:
                apply = kind.diffusers[0] if kind.diffusers else kind.apply
                apply(KindRun(model, specs[kind.name], report.backend, dev, mode, validate, target, report))
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


def restore_diffusers(obj: Any) -> bool:
    """Put back exactly what each kind changed (and a pipeline's components'); False if not kernelized."""
    state: DiffusersState | None = obj.__dict__.pop(STATE_ATTR, None)
    if state is None:
        return False
    for name in state.components:
        with contextlib.suppress(KeyError, AttributeError):
            restore_diffusers(obj.components[name])
    for kind in reversed(all_kinds()):
        if isinstance(kind.diffusers, str):
            continue
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
