"""Variant choice: (the builds a kernel offers, this system) -> one build, with a trace.

Pure: takes the system as an argument, so every decision can be replayed for a simulated TPU v5e, a
CUDA box or a laptop. The trace records every variant accepted or rejected with the reason; errors and
`kernel-hub resolve` print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .builder_names import judge_builder, parse_builder_name, preference
from .system import SystemFacts

UNIVERSAL = "universal"


@dataclass(frozen=True)
class Variant:
    name: str                                  # "jax-tpu", "torch-cpu", ...
    framework: str                             # "jax" | "torch"
    backend: str                               # "tpu" | "cuda" | "rocm" | "cpu" | "universal"
    entry: str = "__init__.py"                 # file that becomes the package __init__
    tpu_generations: tuple[str, ...] = ()      # empty: any generation
    requires: tuple[tuple[str, str], ...] = ()  # (distribution, PEP 440 spec)
    #: "kernel-hub": our `build/<name>.tar` bundles; "kernel-builder": the Hub build tool's `build/<name>/` trees,
    #: whose name says everything a choice needs (builder_names.py)
    dialect: str = "kernel-hub"


KERNEL_HUB, KERNEL_BUILDER = "kernel-hub", "kernel-builder"
DIALECTS = (KERNEL_HUB, KERNEL_BUILDER)


@dataclass(frozen=True)
class Decision:
    variant: str
    accepted: bool
    reason: str


@dataclass(frozen=True)
class Choice:
    variant: Variant | None
    trace: tuple[Decision, ...] = field(default_factory=tuple)

    def trace_lines(self) -> list[str]:
        marks = {True: "accept", False: "reject"}
        chosen = self.variant.name if self.variant else None
        lines = []
        for d in self.trace:
            mark = "choose" if d.variant == chosen else marks[d.accepted]
            lines.append(f"  {mark:<7}{d.variant:<14} {d.reason}" if len(d.variant) >= 14
                         else f"  {mark:<7}{d.variant:<14}{d.reason}")
        return lines


def _requirement_problem(dist: str, spec: str, system: SystemFacts) -> str | None:
    have = system.framework_version(dist)
    if have is None:
        return f"needs {dist}{spec}, not installed"
    try:
        ok = Version(have) in SpecifierSet(spec, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return f"cannot compare {dist} {have} with {spec!r}"
    return None if ok else f"needs {dist}{spec}, have {have}"


def judge(variant: Variant, system: SystemFacts, framework: str) -> Decision:
    """Accept or reject one variant on `system` for tensors of `framework`, saying why."""
    if variant.dialect == KERNEL_BUILDER:
        named = parse_builder_name(variant.name)
        if named is None:
            return Decision(variant.name, False, "not a torch variant name kernel-builder writes (noarch or arch)")
        accepted, reason = judge_builder(named, system, framework)
        return Decision(variant.name, accepted, reason)
    if variant.framework != framework:
        return Decision(variant.name, False, f"framework {variant.framework}, asked for {framework}")
    if variant.backend not in (system.backend, UNIVERSAL):
        return Decision(variant.name, False, f"backend {variant.backend}, this system is {system.backend}")
    if system.backend == "tpu" and variant.tpu_generations:
        if system.tpu_generation is None:
            pass  # unknown generation: do not reject, the kernel checks at trace time
        elif system.tpu_generation not in variant.tpu_generations:
            listed = ", ".join(variant.tpu_generations)
            return Decision(variant.name, False, f"TPU {system.tpu_generation} not among {listed}")
    for dist, spec in variant.requires:
        problem = _requirement_problem(dist, spec, system)
        if problem:
            return Decision(variant.name, False, problem)
    detail = [f"{variant.framework} on {system.backend}"]
    if system.backend == "tpu":
        detail.append(f"TPU {system.tpu_generation or 'generation unknown'}")
    detail += [f"{dist} {system.framework_version(dist)} in {spec}" for dist, spec in variant.requires]
    return Decision(variant.name, True, ", ".join(detail))


def _preference(v: Variant) -> tuple[int, ...]:
    """Sort key, best first: kernel-builder arch builds (HF kernels' order), then a build for this backend, then a
    universal one."""
    named = parse_builder_name(v.name) if v.dialect == KERNEL_BUILDER else None
    if named is not None:
        return preference(named)
    return (1, int(v.backend == UNIVERSAL), 0, 0, 0, 0)


def choose_variant(variants: list[Variant], system: SystemFacts, framework: str = "jax") -> Choice:
    """The best accepted variant (by _preference, then file order); the trace keeps every decision."""
    decisions = [judge(v, system, framework) for v in variants]
    accepted = [v for v, d in zip(variants, decisions, strict=True) if d.accepted]
    accepted.sort(key=_preference)
    return Choice(accepted[0] if accepted else None, tuple(decisions))


def preferred_names(system: SystemFacts, framework: str) -> list[str]:
    """Conventional variant names for this system, best first: a source can fetch these without a listing."""
    return [f"{framework}-{system.backend}", f"{framework}-{UNIVERSAL}"]
