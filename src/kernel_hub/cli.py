"""The `kernel-hub` command. Every subcommand has --help, exits non-zero on failure, and prints one
clear line for a user error (no traceback)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import KernelHubError
from .registry import REGISTRY_ENV

# Subcommands that live in their own modules: (module, name). Each module has add_parser(sub) -> parser
# with set_defaults(func=...). Missing optional modules are skipped.
_PLUGINS = ("kernel_hub.hub_cli",)


def _add_version_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", dest="spec", help="int major (1) or PEP 440 spec ('>=1.0,<2'); default: registry")
    p.add_argument("--revision", help="any branch, tag or commit (instead of --version)")
    p.add_argument("--backend", choices=["tpu", "cuda", "rocm", "cpu"], help="override the detected backend")
    p.add_argument("--framework", choices=["jax", "torch"], default="jax", help="tensors the build takes")


def _spec(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


def cmd_list(args: argparse.Namespace) -> int:
    from .metadata import load_metadata
    from .registry import load_registry

    registry = load_registry()
    rows = [("repo", "default spec", "source version", "backends", "layers")]
    for e in registry.entries:
        version = load_metadata(e.source).version if e.source and e.source.is_dir() else "-"
        rows.append((e.repo_id, e.version or "-", version, ",".join(e.backends) or "-", ",".join(e.layers) or "-"))
    if args.json:
        print(json.dumps([dict(zip(rows[0], r, strict=True)) for r in rows[1:]], indent=2))
        return 0
    print(_table(rows))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .api import source_for
    from .registry import load_registry
    from .sources import LocalSource

    registry = load_registry()
    source = source_for(args.repo, registry)
    refs = source.refs(args.repo)
    print(f"repo      {args.repo}")
    if isinstance(source, LocalSource):
        m = source.metadata
        print(f"source    {source.kernel_dir}")
        print(f"name      {m.name}  version {m.version}  license {m.license or '-'}")
        print(f"about     {m.description}")
        print(f"package   {m.python_name} ({len(source.digests)} files, commit {source.commit[:12]})")
        print(f"replaces  {', '.join(m.replaces) or '-'}")
    print("refs      " + ", ".join(f"{r.name} ({r.kind}) {r.commit[:12]}" for r in refs))
    entry = registry.get(args.repo)
    spec = entry.version if entry else None
    if spec or refs:
        from .versions import resolve

        res = resolve(refs, version=_spec(spec) if spec else None, revision=None if spec else refs[0].name)
        print("variants  at " + res.commit[:12] + ":")
        for v in source.variants(args.repo, res.commit):
            gens = f" tpu {','.join(v.tpu_generations)}" if v.tpu_generations else ""
            reqs = " ".join(f"{d}{s}" for d, s in v.requires)
            print(f"  {v.name:<12} {v.framework:<6} {v.backend:<5} entry {v.entry}{gens}  {reqs}")
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .api import plan_load
    from .system import SystemFacts, detect

    system: SystemFacts | None = None
    if args.backend or args.tpu_generation:
        base = detect(args.framework) if not args.backend else SystemFacts(backend=args.backend)
        from .system import installed_version

        system = replace(base, backend=args.backend or base.backend, tpu_generation=args.tpu_generation,
                         jax_version=args.jax_version or installed_version("jax"),
                         torch_version=args.torch_version or installed_version("torch"))
    plan = plan_load(args.repo, version=_spec(args.spec), revision=args.revision, framework=args.framework,
                     system=system)
    print(plan.describe())
    return 0 if plan.choice.variant is not None else 1


def cmd_validate(args: argparse.Namespace) -> int:
    from .api import get_kernel, get_local_kernel
    from .validation import validate

    if args.path:
        module = get_local_kernel(args.path, backend=args.backend, framework=args.framework)
    else:
        module = get_kernel(args.repo, version=_spec(args.spec), revision=args.revision, backend=args.backend,
                            framework=args.framework)
    report = validate(module, backend=args.backend, tags=tuple(args.tag) or None, seed=args.seed, tpu=args.tpu)
    print(report.to_json() if args.json else report)
    return 0 if report.passed else 1


def cmd_download(args: argparse.Namespace) -> int:
    from .api import plan_load
    from .errors import NoVariantError

    plan = plan_load(args.repo, version=_spec(args.spec), revision=args.revision, backend=args.backend,
                     framework=args.framework)
    if plan.choice.variant is None:
        raise NoVariantError(f"no build of {args.repo} fits this system (see: kernel-hub resolve {args.repo})")
    build = plan.source.fetch(args.repo, plan.resolution.commit, plan.choice.variant)
    print(f"{args.repo} {plan.resolution.version or plan.resolution.commit[:12]} [{build.variant.name}]")
    print(f"package   {build.package_dir}")
    print(f"files     {len(build.digests)} (sha256 checked)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    from .registry import load_registry

    entry = load_registry().require(args.repo)
    if entry.bench is None or not entry.bench.is_file():
        raise KernelHubError(f"{args.repo} has no benchmark script in the registry ('bench:' key)")
    return subprocess.call([sys.executable, str(entry.bench), *args.bench_args])


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(quick=args.quick)


def _tpu_generations(text: str) -> tuple[str, ...]:
    from .tpu.chips import parse_generations

    try:
        return parse_generations(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-hub",
        description="Load, verify, validate and publish accelerator kernels (Pallas first) on the Hugging Face Hub.",
        epilog="Examples:\n  kernel-hub list\n  kernel-hub resolve kernel-hub/ragged-dot-tpu --backend tpu "
        "--tpu-generation v5e\n  kernel-hub validate kernel-hub/ragged-dot-tpu\n  kernel-hub demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--registry", help="registry.yaml to use (default: the embedded one, or $KERNEL_HUB_REGISTRY)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="kernels in the registry", description="List the kernels the registry knows.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="one kernel: metadata, refs, variants",
                       description="Show a kernel's metadata, its refs (tags, branches) and build variants.")
    p.add_argument("repo", help="repo id, e.g. kernel-hub/ragged-dot-tpu")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("resolve", help="print the version and variant decisions (the trace)",
                       description="Resolve a version spec to a commit and choose the build variant for this "
                       "system (or a simulated one), printing every variant accepted or rejected and why.")
    p.add_argument("repo", help="repo id")
    _add_version_args(p)
    p.add_argument("--tpu-generation", help="simulate a TPU generation (v4, v5e, v5p, v6e, v7x)")
    p.add_argument("--jax-version", help="simulate an installed jax version")
    p.add_argument("--torch-version", help="simulate an installed torch version")
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("validate", help="check a kernel's numbers against its reference here",
                       description="Run the kernel's validation cases on this backend against its reference "
                       "(tolerance by dtype; NaN never passes). Exit 1 if any case fails.")
    p.add_argument("repo", nargs="?", default="kernel-hub/ragged-dot-tpu", help="repo id (default: the ragged dot)")
    p.add_argument("--path", help="validate a local kernel folder instead of a repo")
    _add_version_args(p)
    p.add_argument("--tag", action="append", default=[], help="only cases with this tag (decode, prefill, edge, ...)")
    p.add_argument("--seed", type=int, help="random seed for the inputs (default: fresh)")
    p.add_argument("--tpu", metavar="GENS", type=_tpu_generations,
                   help="also compile every TPU case with the real TPU compiler for these generations, e.g. "
                   "v5e,v6e (also v4, v5p, v7x); needs the TPU environment (make setup-tpu)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("download", help="fetch and verify the build that fits, without importing it",
                       description="Resolve, choose the variant and fetch only its files into the cache, "
                       "checking every sha256. Prints where the package is.")
    p.add_argument("repo", help="repo id")
    _add_version_args(p)
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("bench", help="run a kernel's benchmark against its alternatives",
                       description="Run the benchmark script the registry names for a kernel (medians of "
                       "interleaved runs, ratio table, JSON out). Arguments after the repo go to the script, "
                       "e.g. kernel-hub bench kernel-hub/ragged-dot-tpu --quick.")
    p.add_argument("repo", help="repo id")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the script (try --help)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="load, validate and race the ragged dot (offline)",
                       description="Load the ragged-dot kernel from the embedded registry, validate it here, run "
                       "a decode-shaped MoE ragged dot through it and through jax.lax.ragged_dot, check they agree "
                       "and print timings and the ratio. Needs no network and no token.")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.set_defaults(func=cmd_demo)

    for plugin in _PLUGINS:
        try:
            module = importlib.import_module(plugin)
        except ImportError:
            continue
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if args.registry:
        os.environ[REGISTRY_ENV] = str(Path(args.registry).resolve())
    try:
        return int(func(args) or 0)
    except KernelHubError as exc:
        print(f"kernel-hub {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
