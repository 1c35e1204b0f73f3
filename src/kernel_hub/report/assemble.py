"""`kernel-hub report`: run every section, assemble the Report, write report.json and index.html.

Sections, in order: validation (every registry kernel, every mode this machine offers), the TPU compile gate
(when the TPU environment is there), the kernelize family matrix, the benches. `quick` runs one case per
(mode, dtype), the smoke TPU cases for v5e, three families and the cheapest bench: every part of the page,
in about a minute.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..ui.progress import Progress
from .schema import Compile, Headline, Report, Validation


@dataclass(frozen=True)
class Options:
    quick: bool = False
    seed: int | None = None
    generations: tuple[str, ...] | None = None  # TPU compile (None: all known; quick: v5e)
    tpu_cases: str = "smoke"  # "smoke" or "all" (every TPU case: ~10 min a kernel for 5 generations, cached)
    families: tuple[str, ...] | None = None  # None: all (quick: a few)
    benches: tuple[str, ...] | None = None  # None: all (quick: one)
    sections: tuple[str, ...] = ("validation", "compile", "families", "benches")


def headline(validation: Validation, compile_: Compile, families: list) -> Headline:
    num_pass = sum(c.passed for c in validation.cases)
    num_total = len(validation.cases)
    comp_pass = sum(c.passed for c in compile_.cases)
    comp_total = len(compile_.cases)
    passed, total = num_pass + comp_pass, num_total + comp_total
    rate = passed / total if total else 0.0
    kernels = len({c.kernel for c in validation.cases})
    modes = len({c.mode for c in validation.cases})
    fam_ok = sum(f.status == "replaced" for f in families)
    fam_part = sum(f.status == "partial" for f in families)
    fam_bad = sum(f.status in ("error", "kept") for f in families)
    gens = ", ".join(compile_.generations)
    compile_text = (f"TPU compile: {comp_pass} of {comp_total} {compile_.selection} cases compile for {gens} "
                    f"(libtpu {compile_.libtpu})" if compile_.available
                    else f"TPU compile: not run ({compile_.reason})")
    return Headline(
        passed=passed, total=total, rate=rate,
        validation=f"validation: {num_pass} of {num_total} cases pass across {kernels} kernels and {modes} modes",
        compile=compile_text,
        families=f"kernelize: {fam_ok} of {len(families)} model families fully replaced, {fam_part} partly, "
                 f"{fam_bad} kept or failing",
        text=f"{passed} of {total} checks pass ({100 * rate:.1f}%)")


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """transformers/diffusers warnings and log lines would bury the live rows. Their loggers are configured by
    the libraries on first use, so their own verbosity switches are used (and put back after)."""
    import importlib
    import importlib.util

    switches = []
    for lib in ("transformers", "diffusers"):
        if importlib.util.find_spec(lib) is not None:
            lib_logging = importlib.import_module(f"{lib}.utils.logging")
            switches.append((lib_logging, lib_logging.get_verbosity()))
            lib_logging.set_verbosity_error()
    others = [logging.getLogger(n) for n in ("jax", "absl")]
    levels = [lg.level for lg in others]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in others:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(others, levels, strict=True):
                lg.setLevel(level)
            for lib_logging, verbosity in switches:
                lib_logging.set_verbosity(verbosity)


def build_report(options: Options, progress: Progress) -> Report:
    from ..load.registry import load_registry
    from ..verify.validation import new_seed
    from .benches import run_benches
    from .environment import environment
    from .families import run_families
    from .validation_section import run_compile, run_validation

    start = time.perf_counter()
    seed = options.seed if options.seed is not None else new_seed()
    registry = load_registry()
    repo_ids = [e.repo_id for e in registry.entries]
    with _quiet_libraries():
        validation = (run_validation(repo_ids, seed=seed, quick=options.quick, progress=progress)
                      if "validation" in options.sections else Validation(seed=seed, runs=[], cases=[], matrix=[]))
        if "compile" in options.sections:
            dirs = {e.repo_id: e.source for e in registry.entries if e.source is not None and e.source.is_dir()}
            compile_ = run_compile(dirs, options.generations, quick=options.quick, cases=options.tpu_cases,
                                   progress=progress)
        else:
            compile_ = Compile(available=False, reason="not asked for", generations=[], selection=options.tpu_cases,
                               jax=None, libtpu=None, cases=[], matrix=[])
        families = (run_families(quick=options.quick, progress=progress, only=options.families)
                    if "families" in options.sections else [])
    benches = (run_benches(quick=options.quick, progress=progress, only=options.benches)
               if "benches" in options.sections else [])
    return Report(quick=options.quick, seconds=time.perf_counter() - start, environment=environment(seed),
                  headline=headline(validation, compile_, families), validation=validation, compile=compile_,
                  families=families, benches=benches)


def write_report(report: Report, out_dir: str | Path) -> tuple[Path, Path]:
    """report.json and index.html in `out_dir` (created), each written whole or not at all."""
    from .html import render

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "report.json", out / "index.html"
    for path, text in zip(paths, (report.model_dump_json(indent=2) + "\n", render(report)), strict=True):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return paths


def summary_lines(report: Report, paths: Sequence[Path]) -> list[str]:
    """What `kernel-hub report` prints at the end: the headline, per kernel/mode pass rates, benches."""
    h = report.headline
    lines = [f"{h.text}", f"  {h.validation}", f"  {h.compile}", f"  {h.families}"]
    for cell in report.validation.matrix:
        if cell.passed != cell.total:
            lines.append(f"  failing: {cell.kernel} {cell.column} {cell.dtype}: {', '.join(cell.failed[:3])}")
    lines += [f"wrote {p}" for p in paths]
    lines.append(f"report took {report.seconds:.0f} s (seed {report.environment.seed})")
    return lines
