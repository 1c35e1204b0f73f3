"""The report's family matrix: kernelize on a tiny model of every family the tests cover, with the registry's
kernels (every declared layer kind: MoE experts, attention, RMSNorm), and what happened: replaced, kept with
the reason, the error.

Each family: build it (random weights, from its config; models.py), run its default forward, kernelize, run
again (output error vs the default), restore, run again (bit-identical?). The families are a data table
(family_specs), the same builders tests/layers/test_kernelize*.py use.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from ..ui.progress import Progress
from ..verify.numerics import TOLERANCE, relative_error
from . import models
from .schema import FamilyRow

if TYPE_CHECKING:
    import torch

#: A family's tiny model and the forward whose output the page compares before and after kernelize.
Built: TypeAlias = "tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]"


class _Kinded(Protocol):
    kind: str  # the layer kind a kernelize report line is about

#: Output error allowed after kernelize (f32 models; the per-layer validation uses the same bar).
OUTPUT_TOLERANCE = TOLERANCE["float32"]
#: Families in a quick report: one MoE family, one attention-only, one Diffusers.
QUICK_FAMILIES = ("qwen3_moe", "llama", "flux")


@dataclass(frozen=True)
class FamilySpec:
    family: str
    library: str  # "transformers" | "diffusers"
    kind: str  # "moe" | "attention" | "diffusion"
    module: str  # the transformers/diffusers module that must exist for the family to run
    build: Callable[[], Built]


def _text_forward(model: torch.nn.Module) -> torch.Tensor:
    import torch

    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=x, use_cache=False)
    logits = getattr(out, "logits", None)
    return (logits if logits is not None else out.last_hidden_state).float()


def _text(build: Callable[[], torch.nn.Module]) -> Callable[[], Built]:
    return lambda: (build(), _text_forward)


def _diffusion(family: str) -> Callable[[], Built]:
    def build() -> Built:
        import torch

        model, inputs = models.diffusers_model(family)

        def forward(m: torch.nn.Module) -> torch.Tensor:
            with torch.no_grad():
                return m(**inputs, return_dict=False)[0].float()

        return model, forward

    return build


def family_specs() -> list[FamilySpec]:
    """Every family the kernelize tests cover, in the order the page lists them."""
    specs = [FamilySpec(f, "transformers", "moe", f"transformers.models.{models.FAMILIES[f][0]}",
                        _text(lambda f=f: models.tiny_model(f))) for f in models.family_names()]
    specs += [FamilySpec(f, "transformers", "moe", f"transformers.models.{f}",
                         _text(lambda f=f: models.generic_tiny_model(f))) for f in models.GENERIC_FAMILIES]
    specs += [FamilySpec(f, "transformers", "moe", f"transformers.models.{models.HAND_FAMILIES[f][0]}",
                         _text(lambda f=f: models.hand_tiny_model(f))) for f in models.hand_family_names()]
    specs.append(FamilySpec("llama", "transformers", "attention", "transformers.models.llama",
                            _text(models.llama)))
    specs += [FamilySpec(f, "diffusers", "diffusion", "diffusers", _diffusion(f)) for f in models.DIFFUSERS_FAMILIES]
    return specs


def _count(items: Sequence[_Kinded]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item.kind] = out.get(item.kind, 0) + 1
    return out


def run_family(spec: FamilySpec) -> FamilyRow:
    """kernelize one family's tiny model; every failure becomes the row's status and reason, never a raise."""
    import torch

    from kernel_hub import kernelize, kernelize_report, restore

    start = time.perf_counter()
    base = dict(family=spec.family, library=spec.library, kind=spec.kind)
    if importlib.util.find_spec(spec.module.split(".")[0]) is None or (
            "." in spec.module and importlib.util.find_spec(spec.module) is None):
        return FamilyRow(**base, status="skipped", replaced={}, kept={}, reasons=[f"{spec.module} is not installed"],
                         max_layer_error=None, output_error=None, restored=None, seconds=0.0)
    stage = "build"
    try:
        model, forward = spec.build()
        stage = "default forward"
        before = forward(model)
        stage = "kernelize"
        report = kernelize_report(kernelize(model))
        stage = "kernelized forward"
        after = forward(model)
        stage = "restore"
        restore(model)
        restored = bool(torch.equal(forward(model), before))
    except Exception as exc:  # a family that does not build or run is a row, not a crash
        message = str(exc).splitlines()[0][:200] if str(exc) else ""
        return FamilyRow(**base, status="error", replaced={}, kept={}, reasons=[f"{stage}: {type(exc).__name__}: "
                         f"{message}"], max_layer_error=None, output_error=None, restored=None,
                         seconds=time.perf_counter() - start)
    errors = [r.max_error for r in report.replaced if r.max_error is not None]
    out_err = relative_error(after, before) if report.replaced else 0.0
    reasons = list(dict.fromkeys(f"{k.kind}: {k.reason}" for k in report.kept))
    if not report.replaced:
        status = "kept"
    elif not out_err <= OUTPUT_TOLERANCE:
        status = "error"
        reasons.insert(0, f"output differs from the default by {out_err:.2e} (> {OUTPUT_TOLERANCE:.0e})")
    elif not restored:
        status = "error"
        reasons.insert(0, "restore() did not give bit-identical outputs")
    else:
        status = "partial" if report.kept else "replaced"
    return FamilyRow(**base, status=status, replaced=_count(report.replaced), kept=_count(report.kept),
                     reasons=reasons, max_layer_error=max(errors) if errors else None,
                     output_error=out_err if out_err != float("inf") else None, restored=restored,
                     seconds=time.perf_counter() - start)


def run_families(*, quick: bool, progress: Progress, only: tuple[str, ...] | None = None) -> list[FamilyRow]:
    specs = family_specs()
    wanted = only or (QUICK_FAMILIES if quick else None)
    if wanted:
        specs = [s for s in specs if s.family in wanted]
    progress.phase("kernelize families", len(specs))
    rows = []
    for spec in specs:
        row = run_family(spec)
        rows.append(row)
        what = ", ".join(f"{n} {k}" for k, n in row.replaced.items()) or "nothing"
        kept = ", ".join(f"{n} {k}" for k, n in row.kept.items())
        detail = f"replaced {what}" + (f"; kept {kept}" if kept else "")
        if row.status in ("error", "skipped"):
            detail = row.reasons[0]
        progress.row(f"  {row.status:<8} {spec.library:<12} {spec.family:<22} {detail}",
                     ok=None if row.status == "skipped" else row.status != "error")
        progress.advance()
    return rows
