"""A kernel caught writing weights is kept out of the whole model, not only out of the layer it was caught on.

Why: validation runs a kind's layers one after the other (experts blocks, norms) or in one forward (attention); a
kernel whose write shows only on a later layer (it writes once it has seen that layer, or writes another block's
weights) passed on the layers validated before, and in the forward it then ran there and wrote what it was caught
writing. A kernel that wrote weights, another layer's tensors or its inputs once is not trusted on any layer: every
layer of the kind is put back (the kind's own restore, exact) and the report says on which layer it was caught.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .report import Kept, KernelizeReport, Replaced
from .weights_guard import INPUTS_MODIFIED, OUTSIDE_MODIFIED, WEIGHTS_MODIFIED

#: How a kept row's reason starts when the kernel wrote what it must not (weights_guard's refusals).
_WROTE = (WEIGHTS_MODIFIED, OUTSIDE_MODIFIED, INPUTS_MODIFIED)


@dataclass(frozen=True)
class ReportMark:
    """Where a kind's rows start in the report: what one kind's apply added is what comes after."""

    kept: int
    replaced: int

    @classmethod
    def of(cls, report: KernelizeReport) -> ReportMark:
        return cls(len(report.kept), len(report.replaced))


def caught_writing(report: KernelizeReport, kind: str, mark: ReportMark) -> Kept | None:
    """Pure decision: the first row `kind` added since `mark` whose kernel wrote what it must not (None: none)."""
    return next((k for k in report.kept[mark.kept:] if k.kind == kind and k.reason.startswith(_WROTE)), None)


def keep_out_rows(report: KernelizeReport, kind: str, mark: ReportMark, caught: Kept) -> list[Replaced]:
    """Turn every row `kind` replaced since `mark` into a kept row saying where its kernel was caught; returns the
    rows turned (the caller puts those layers back)."""
    added = report.replaced[mark.replaced:]
    turned = [r for r in added if r.kind == kind]
    report.replaced[mark.replaced:] = [r for r in added if r.kind != kind]
    why = f"kept out of the whole model: on {caught.layer} the kernel was caught: {caught.reason}"
    report.kept += [Kept(r.layer, kind, why) for r in turned]
    if turned:
        report.notes.append(f"{kind}: the kernel wrote what it must not while validating {caught.layer}; every "
                            f"{kind} layer stays on its own implementation")
    return turned


def keep_out_if_caught(report: KernelizeReport, kind: str, mark: ReportMark, undo: Callable[[], None]) -> None:
    """After `kind` ran: if its kernel was caught writing, turn its replaced rows into kept ones and `undo` the kind
    (its own restore)."""
    caught = caught_writing(report, kind, mark)
    if caught is not None and keep_out_rows(report, kind, mark, caught):
        undo()
