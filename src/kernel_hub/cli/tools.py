"""`kernel-hub bench`, `demo`, `report`: run a kernel's benchmark, the offline demo, the dashboard."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..demo.run import run_demo
from ..errors import KernelHubError
from ..load.registry import load_registry
from ..report.assemble import Options, build_report, summary_lines, write_report
from ..report.benches import BENCHES
from ..report.families import family_specs
from ..ui.progress import progress
from .common import print_json


def cmd_bench(args: argparse.Namespace) -> int:


    entry = load_registry().require(args.repo)
    if entry.bench is None:
        raise KernelHubError(f"{args.repo} has no benchmark script in the registry ('bench:' key)")
    if not entry.bench.is_file():  # the wheel embeds kernels, not bench/
        raise KernelHubError(f"{args.repo}: benchmark {entry.bench} not found; benchmarks ship with a checkout of "
                             "kernel-hub, not with the wheel: run kernel-hub bench from a clone")
    return subprocess.call([sys.executable, str(entry.bench), *args.bench_args])


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(quick=args.quick)


def cmd_report(args: argparse.Namespace) -> int:
    def names(text: str | None) -> tuple[str, ...] | None:
        return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


    sections = ("validation", "compile", "families", "benches")
    skip = set(names(args.skip) or ())
    if skip - set(sections):
        raise KernelHubError(f"--skip takes {', '.join(sections)}; got {', '.join(sorted(skip - set(sections)))}")
    for flag, given, known in (("--families", names(args.families), [f.family for f in family_specs()]),
                               ("--benches", names(args.benches), [b.name for b in BENCHES])):
        unknown = sorted(set(given or ()) - set(known))
        if unknown:
            raise KernelHubError(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise KernelHubError(f"--out {args.out} is a file; name a folder (it is created if missing)")
    options = Options(quick=args.quick, seed=args.seed, generations=args.tpu, tpu_cases=args.tpu_cases,
                      families=names(args.families),
                      benches=names(args.benches), sections=tuple(s for s in sections if s not in skip))
    with progress(json_output=args.json) as live:
        report = build_report(options, live)
    paths = write_report(report, args.out)
    if args.json:
        print_json({"out_dir": str(Path(args.out)), "report_json": str(paths[0]), "index_html": str(paths[1]),
                     "seconds": report.seconds, "seed": report.environment.seed,
                     "headline": report.headline.model_dump()})
    else:
        print("\n".join(summary_lines(report, paths)))
    return 0
