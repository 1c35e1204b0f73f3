"""Layer kind `rms_norm`: RMSNorm modules (transformers', Diffusers', torch.nn.RMSNorm), served by
kernel-hub/rms-norm-tpu's `rms_norm`.

Found by class name and structure, whether or not HF kernels' `use_kernel_forward_from_hub` decorator marked the class
(with kernels 0.17.2 transformers 5.24 leaves it unmarked): a class named like an RMSNorm (or marked "RMSNorm"), not a
gated variant, with a 1-D `weight` over the last axis, no `bias` and a numeric `variance_epsilon` or `eps`; Diffusers
models reach this kind through the same declaration (layers/diffusers.py). The form is read from the layer's own
outputs, not its name: on random inputs, the kernel's four variants (weight or 1 + weight; scale in float32 or after
the cast to the input dtype) are compared with the layer's current forward and the closest one is taken if it is
within the dtype's tolerance; otherwise the layer is kept with the errors. The swap is this instance's `forward` only
(never a class or a module-level function); restore puts back exactly what was there.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from . import KindRun, LayerKind

NAME = "rms_norm"
#: (zero_centered, scale_after_cast) in the order ties are broken: f32 results cannot tell the cast orders apart.
FORMS = ((False, True), (False, False), (True, False), (True, True))
VALIDATION_ROWS = 16
_MISSING = object()


def form_name(zero_centered: bool, scale_after_cast: bool) -> str:
    scale = "(1 + weight)" if zero_centered else "weight"
    return f"{scale} * x_normed, {'cast before scaling' if scale_after_cast else 'scaled in f32'}"


def structure(module: Any) -> tuple[bool, str]:
    """(is an RMSNorm this kind can serve, why not): class name or HF kernels' mark, then the attributes."""
    import torch

    cls = type(module)
    named = "rmsnorm" in cls.__name__.lower() or getattr(cls, "kernel_layer_name", None) == "RMSNorm"
    if not named:
        return False, ""
    if "gated" in cls.__name__.lower():
        return False, f"{cls.__name__}: a gated RMSNorm (forward takes a gate) is another call contract"
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.nn.Parameter | torch.Tensor) or weight.dim() != 1:
        return False, f"{cls.__name__} has no 1-D weight (e.g. with_scale=False): the kernel scales by a weight"
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        return False, f"{cls.__name__} adds a bias after scaling (Diffusers' RMSNorm(bias=True)): the kernel adds none"
    eps = next((getattr(module, n) for n in ("variance_epsilon", "eps") if isinstance(getattr(module, n, None),
                                                                                     int | float)), None)
    if eps is None:
        return False, f"{cls.__name__} has neither a numeric variance_epsilon nor eps"
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) != 1:
        return False, f"{cls.__name__}.forward does not take one tensor"
    return True, ""


def epsilon(module: Any) -> float:
    for n in ("variance_epsilon", "eps"):
        value = getattr(module, n, None)
        if isinstance(value, int | float):
            return float(value)
    raise AttributeError(f"{type(module).__name__} has no epsilon")


def find_norms(model: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """([(path, module)] to try, [(path, reason)] named like an RMSNorm but not servable)."""
    found, skipped = [], []
    for path, module in model.named_modules():
        ok, why = structure(module)
        if ok:
            found.append((path, module))
        elif why:
            skipped.append((path, why))
    return found, skipped


@dataclass
class NormHook:
    """The instance forward kernelize installs: the kernel in the matched form, the previous forward where the
    input's dtype is not the weight's (a case the validation did not cover)."""

    kernel: Any
    module: Any
    previous: Any  # the forward that ran before (bound method or instance attribute)
    zero_centered: bool
    scale_after_cast: bool
    calls: int = 0
    fallbacks: int = 0

    def __call__(self, hidden_states: Any) -> Any:
        import torch

        weight = self.module.weight
        # counters are eager-mode facts: an int attribute bumped inside a compiled graph is a guard that fails on
        # every call (dynamo recompiled the model at each generate step)
        counting = not torch.compiler.is_compiling()
        if hidden_states.dtype != weight.dtype:
            if counting:
                self.fallbacks += 1
            return self.previous(hidden_states)
        if counting:
            self.calls += 1
        return self.kernel.rms_norm(hidden_states, weight, eps=epsilon(self.module),
                                    zero_centered=self.zero_centered, scale_after_cast=self.scale_after_cast)


@dataclass
class NormState:
    """For restore: each swapped module and what its instance __dict__ held under `forward` before."""

    swapped: list[tuple[Any, Any]] = field(default_factory=list)


def _errors(module: Any, kernel: Any, mode: str, seed: int) -> tuple[list[float], Any]:
    """Error of each FORMS entry against the module's current forward on random rows (training: max with the
    gradients of x and weight); and the reference output's dtype."""
    import torch

    from ..api import _rel_error

    weight = module.weight
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(VALIDATION_ROWS, weight.shape[0], generator=g) * 3.0).to(weight.device, weight.dtype)
    eps = epsilon(module)
    if mode != "training":
        with torch.no_grad():
            ref = module.forward(x)
            outs = [kernel.rms_norm(x, weight, eps=eps, zero_centered=zc, scale_after_cast=sac) for zc, sac in FORMS]
        return [_rel_error(o, ref) if o.dtype == ref.dtype else float("inf") for o in outs], ref.dtype
    cot = torch.randn(VALIDATION_ROWS, weight.shape[0], generator=g).to(weight.device, weight.dtype)

    def run(fn):
        xx = x.clone().requires_grad_(True)
        with torch.enable_grad():
            y = fn(xx)
            grads = torch.autograd.grad((y.float() * cot.float()).sum(), [xx, weight], allow_unused=True)
        return y, grads

    ref, ref_grads = run(module.forward)
    errors = []
    for zc, sac in FORMS:
        out, grads = run(lambda t, zc=zc, sac=sac: kernel.rms_norm(t, weight, eps=eps, zero_centered=zc,
                                                                  scale_after_cast=sac))
        errs = [_rel_error(out, ref)] + [_rel_error(a, b) for a, b in zip(grads, ref_grads, strict=True)]
        errors.append(max(errs) if out.dtype == ref.dtype else float("inf"))
    return errors, ref.dtype


def choose_form(errors: list[float], tolerance: float) -> tuple[int | None, str]:
    """(index into FORMS of the closest form within tolerance or None, the reason): a pure decision."""
    best = min(range(len(errors)), key=lambda i: (errors[i], i))
    summary = ", ".join(f"{form_name(*FORMS[i])}: {errors[i]:.1e}" for i in range(len(errors)))
    if errors[best] <= tolerance:
        return best, f"form matched on the layer's own outputs ({form_name(*FORMS[best])}: {errors[best]:.1e})"
    return None, f"validation failed: no form of the kernel matches this layer within {tolerance:.0e} ({summary})"


def _apply(run: KindRun) -> None:
    from ..api import TOLERANCE, _device_of, _load_or_reason, kernel_info, not_validated_reason
    from ..report import Kept, Replaced

    found, skipped = find_norms(run.model)
    if not found and not skipped:
        return
    unchecked = not_validated_reason(run.backend, _device_of(run.model))
    if unchecked is not None and run.spec is not None:  # the form is read off the layer's outputs: it must run there
        run.report.notes.append(f"rms_norm unchanged: {unchecked.removeprefix('not validated: ')}")
        return
    kernel, repo_id, reason = _load_or_reason(run.spec, NAME, run.backend)
    if kernel is None:
        run.report.notes.append(f"rms_norm unchanged: {reason}")
        return
    info = kernel_info(kernel, run.device, "rms_norm")
    run.report.kept += [Kept(path, NAME, why) for path, why in skipped]
    state = NormState()
    run.state.kinds[NAME] = state
    for i, (path, module) in enumerate(found):
        tol = TOLERANCE.get(module.weight.dtype, 1e-4)
        try:
            errors, _ = _errors(module, kernel, run.mode, seed=i)
        except Exception as exc:  # a kernel (or layer) that raises keeps the layer as it is
            run.report.kept.append(Kept(path, NAME, f"kernel raised in validation: {type(exc).__name__}: {exc}"))
            continue
        index, why = choose_form(errors, tol if run.validate else float("inf"))
        if index is None:
            run.report.kept.append(Kept(path, NAME, why))
            continue
        zc, sac = FORMS[index]
        previous = module.__dict__.get("forward", _MISSING)
        hook = NormHook(kernel, module, module.forward, zc, sac)
        state.swapped.append((module, previous))
        module.__dict__["forward"] = hook
        run.report.replaced.append(Replaced(
            layer=path, kind=NAME, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="forward",
            layout=f"hidden {module.weight.shape[0]}, {str(module.weight.dtype).removeprefix('torch.')}, "
                   f"{form_name(zc, sac)}",
            max_error=errors[index] if run.validate else None, tolerance=tol if run.validate else None, why=why))
    if not state.swapped:
        run.state.kinds.pop(NAME, None)


def _restore(model: Any, state: Any) -> None:
    del model
    norms: NormState | None = state.kinds.get(NAME)
    for module, previous in reversed(norms.swapped if norms else []):
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = previous


KIND = LayerKind(
    name=NAME,
    export="rms_norm",
    finds="modules whose class is named like an RMSNorm (or marked 'RMSNorm' by HF kernels), not gated, with a 1-D "
          "weight, no bias and a numeric variance_epsilon or eps (transformers, Diffusers, torch.nn.RMSNorm)",
    contract="forward(hidden_states[..., H]) -> same shape and dtype: weight * x_normed or (1 + weight) * x_normed",
    validated_on="16 random rows (x 3) in the weight's dtype, each of the kernel's forms against the layer's forward "
                 "(training: and the gradients of x and weight); the closest form within tolerance is taken",
    apply=_apply,
    restore=_restore,
    order=2,
)
