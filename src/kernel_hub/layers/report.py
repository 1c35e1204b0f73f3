"""What kernelize did, layer by layer: printable as a table, serialisable as JSON."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Replaced:
    layer: str  # module path in the model
    kind: str  # layer kind, e.g. "moe_experts"
    repo_id: str
    version: str | None
    commit: str | None  # commit of the build, or its source path for local builds
    variant: str | None  # build variant, e.g. "torch-cpu"
    implementation: str  # what runs, e.g. "torch-native grouped loop (2 workers)"
    route: str  # "interface" (ExpertsInterface) or "forward" (instance forward)
    layout: str
    max_error: float | None  # validation error vs the previous implementation (None: not validated)
    tolerance: float | None = None
    # Why the numbers were not checked although validation was asked for, e.g. "not validated: needs a TPU (...)";
    # None when they were checked (max_error) or validate=False.
    not_validated: str | None = None
    why: str | None = None  # why this implementation (e.g. expert weights packed or not, and the reason)
    quantized: str | None = None  # kernelize(quantize=): the weight format the block reads (kinds/experts/quantize.py)
    bytes_before: int | None = None  # its expert weights' bytes before quantizing (bfloat16 for an FP8 model)
    bytes_after: int | None = None  # and the bytes it reads now (quantized weights + scales)
    # The convention the kernel ran through: "moe_experts" / "ragged_dot" (kernel-hub's contract) or
    # "experts_forward" (transformers' experts functions); None for kinds with one convention.
    convention: str | None = None


@dataclass(frozen=True)
class Kept:
    layer: str
    kind: str
    reason: str


@dataclass
class KernelizeReport:
    model: str
    mode: str
    backend: str
    replaced: list[Replaced] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.replaced)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        unchecked = sum(r.not_validated is not None for r in self.replaced)
        note = f" ({unchecked} not validated: {_short(self.replaced)})" if unchecked else ""
        return f"{len(self.replaced)} layer(s) kernelized{note}, {len(self.kept)} kept"

    def __str__(self) -> str:
        lines = [f"kernelize {self.model} (mode={self.mode}, backend={self.backend}): {self.summary()}"]
        if self.replaced:
            rows = [("layer", "kernel", "variant", "implementation", "route", "max error")]
            for r in self.replaced:
                err = "not validated" if r.max_error is None else f"{r.max_error:.2e}"
                if r.not_validated is not None:
                    err = f"not validated: {_short([r])}"
                if r.max_error is not None and r.tolerance is not None:
                    err += f" (tol {r.tolerance:.0e})"
                via = f" via {r.convention}" if r.convention else ""
                rows.append((r.layer, f"{r.repo_id}@{r.version or (r.commit or '?')[:12]}{via}",
                             r.variant or "-", r.implementation, r.route, err))
            lines += _table(rows)
            whys = [(r.layer, r.why) for r in self.replaced if r.why]
            if whys:
                lines.append("why:")
                lines += _table([("layer", "implementation choice")] + whys)
            quantized = [r for r in self.replaced if r.quantized]
            if quantized:  # max error / bound are the columns above: the error against the block's own layer
                lines.append("quantized expert weights:")
                lines += _table([("layer", "format", "bytes before", "bytes after")] + [
                    (r.layer, r.quantized or "", f"{r.bytes_before or 0:,}", f"{r.bytes_after or 0:,}")
                    for r in quantized])
        if self.kept:
            lines.append("kept (default implementation):")
            lines += _table([("layer", "reason")] + [(k.layer, k.reason) for k in self.kept])
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


#: A note that a whole kind kept its layers: "<kind> unchanged: why" / "<kind> kept: why" (load.py, the kinds' flows).
_KIND_KEPT = re.compile(r"^(\w+) (?:unchanged|kept): (.+)$", re.S)


def strict_failures(report: KernelizeReport, skipped: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(layer, why) for every layer a strict kernelize may not keep: each kept row, and each kind that kept all of
    its layers (its note), except kinds the caller left alone on purpose (`skipped`: mapping value None)."""
    out = [(k.layer, k.reason) for k in report.kept if k.kind not in skipped]
    for note in report.notes:
        match = _KIND_KEPT.match(note)
        if match and match.group(1) not in skipped:
            out.append((f"every {match.group(1)} layer", match.group(2)))
    return out


def _short(rows: list[Replaced]) -> str:
    """The common head of the rows' not-validated reasons ("needs a TPU"), for the summary and the table."""
    reasons = {r.not_validated.removeprefix("not validated: ").split(" (")[0] for r in rows if r.not_validated}
    return "; ".join(sorted(reasons))


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
