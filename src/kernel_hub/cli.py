"""The `kernel-hub` command: every subcommand's parser and its cmd_ function (serve's live in hub_cli.py).

Every subcommand has --help, exits non-zero on failure, and prints exactly one line for a user error (a bad
argument, file, spec or repo), never a traceback. Heavy imports (jax, torch, huggingface_hub, the server)
happen inside the commands, so `kernel-hub --help` stays fast. `--json` (list, info, resolve, download, validate,
lock, publish, report) prints one JSON document with snake_case keys (docs/cli-json.md) and nothing else on
stdout; long commands show live progress (progress.py). A reader that closes the pipe early (`| head`) ends
the command quietly (exit 141, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .buildfmt import FRAMEWORKS
from .display import clean, clean_data, clean_lines
from .errors import KernelHubError
from .hub_cli import add_parsers as add_serve_parser
from .registry import REGISTRY_ENV
from .system import BACKENDS

DEBUG_ENV = "KERNEL_HUB_DEBUG"
_TPU_GENERATION = re.compile(r"^v\d+[a-z]?$")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2)."""

    commands: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _one_line(text: str) -> str:
    """A message as one printable line (its strings may come from a server or a metadata file: display.clean)."""
    return clean(" ".join(line.strip() for line in text.splitlines() if line.strip()))


def _spec(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


def _trust(value: list[str] | None) -> bool | list[str]:
    """--trust-remote-code: absent -> False, bare -> True, with values -> those repos/orgs."""
    if value is None:
        return False
    return list(value) or True


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _add_json_arg(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON (keys: docs/cli-json.md)")


def _version_of(what: str, value: str | None) -> str | None:
    if value is None:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(value))
    except InvalidVersion:
        raise KernelHubError(f"{what} {value!r} is not a version like 0.10.2") from None


def _add_version_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", dest="spec", help="int major (1) or PEP 440 spec ('>=1.0,<2'); default: registry")
    p.add_argument("--revision", help="any branch, tag or commit (instead of --version)")
    _add_target_args(p)


def _add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, help="override the detected backend")
    p.add_argument("--framework", choices=FRAMEWORKS, default="jax", help="tensors the build takes")


def _add_trust_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-remote-code", nargs="*", metavar="REPO_OR_ORG", default=None,
                   help="run code from repos outside the trusted organisations: bare, any repo; with values, "
                        "those repos (ORG/NAME) and organisations (ORG). Put it after the repo ids")


# -- commands -------------------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    from .metadata import load_metadata
    from .registry import load_registry, registry_location

    if args.hub:
        return _list_hub(args)
    registry = load_registry()
    kernels = [{"repo_id": e.repo_id, "default_spec": e.version,
                "source_version": load_metadata(e.source).version if e.source and e.source.is_dir() else None,
                "backends": list(e.backends), "layers": list(e.layers), "bench": str(e.bench) if e.bench else None}
               for e in registry.entries]
    location = registry_location()
    if args.json:
        _print_json({"registry": str(location.path), "registry_origin": location.origin, "kernels": kernels})
        return 0
    rows = [("repo", "default spec", "source version", "backends", "layers")]
    rows += [(k["repo_id"], k["default_spec"] or "-", k["source_version"] or "-", ",".join(k["backends"]) or "-",
              ",".join(k["layers"]) or "-") for k in kernels]
    print(clean(location.describe()))
    print(_table(rows))
    return 0


def _list_hub(args: argparse.Namespace) -> int:
    """`list --hub ORG`: the kernel repos an endpoint holds for an organisation (GET /api/kernels?author=ORG,
    through huggingface_hub's HTTP session and headers)."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    from .hub import HubSource
    from .names import check_repo_id

    if "/" in args.hub:
        raise KernelHubError(f"--hub takes an organisation (ORG, e.g. acme), got {args.hub!r}")
    org = check_repo_id(f"{args.hub}/x", "--hub organisation").split("/")[0]
    api = HubSource(args.endpoint).api
    try:
        response = get_session().get(f"{api.endpoint.rstrip('/')}/api/kernels", params={"author": org},
                                     headers=api._build_hf_headers())
        hf_raise_for_status(response)
        found = response.json()
        if not isinstance(found, list):
            raise ValueError("the answer is not a list of repos")
        repos = [{"repo_id": check_repo_id(str(r.get("id")), "a listed repo id"), "sha": r.get("sha"),
                  "last_modified": r.get("lastModified")} for r in found]
    except Exception as exc:  # the endpoint's refusal, an unreachable host, a malformed answer: one line
        raise KernelHubError(f"listing {org} at {api.endpoint} failed: {_one_line(str(exc))[:200]}") from None
    if args.json:
        _print_json({"org": org, "endpoint": api.endpoint, "repos": repos})
        return 0
    if not repos:
        print(f"{org}: no kernel repos at {api.endpoint}")
        return 0
    print(_table([("repo", "commit", "last modified"),
                  *((r["repo_id"], str(r["sha"] or "-")[:12], str(r["last_modified"] or "-")) for r in repos)]))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from .scaffold import init

    target = init(args.name, args.dir, args.template, args.repo)
    print(f"wrote {target} ({args.template} template). Next:")
    print(f"  kernel-hub validate --path {target}")
    print(f"  kernel-hub validate --path {target} --tpu v5e,v6e")
    print(f"  kernel-hub publish {target} --repo ORG/NAME --endpoint URL")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    data = _info_data(args.repo)
    if args.json:
        _print_json(data)  # json.dumps escapes every control character, and (ensure_ascii) every non-ASCII one
        return 0
    data = clean_data(data)  # names, descriptions and compile records come from a server or metadata
    print(f"repo      {data['repo_id']}")
    print(f"source    {data['source']}")
    m = data["metadata"]
    if m is not None:
        print(f"name      {m['name']}  version {m['version']}  license {m['license'] or '-'}")
        print(f"about     {m['description']}")
        print(f"package   {m['python_name']} ({m['files']} files, commit {m['commit'][:12]})")
        print(f"replaces  {', '.join(m['replaces']) or '-'}")
    print("refs      " + (", ".join(f"{r['name']} ({r['kind']}) {r['commit'][:12]}" for r in data["refs"]) or "none"))
    if data["variants_commit"] is not None:
        print("variants  at " + data["variants_commit"][:12] + ":")
        for v in data["variants"]:
            gens = f" tpu {','.join(v['tpu_generations'])}" if v["tpu_generations"] else ""
            reqs = " ".join(f"{d}{s}" for d, s in v["requires"])
            print(f"  {v['name']:<12} {v['framework']:<6} {v['backend']:<5} entry {v['entry']}{gens}  {reqs}")
        tpu = [v for v in data["variants"] if "tpu_compile" in v]
        if tpu:
            print("tpu compile (recorded in the release):")
            for v in tpu:
                first, *rest = v["tpu_compile"]
                print(f"  {v['name']:<12} {first}")
                for line in rest:
                    print(f"  {'':<12} {line}")
    return 0


def _info_data(repo_id: str) -> dict[str, Any]:
    """What `kernel-hub info` shows, as data: the --json document and the text's one source."""
    from .planning import source_for
    from .registry import load_registry
    from .sources import LocalSource
    from .versions import resolve

    registry = load_registry()
    source = source_for(repo_id, registry)
    refs = source.refs(repo_id)
    metadata = None
    if isinstance(source, LocalSource):
        m = source.metadata
        metadata = {"name": m.name, "version": m.version, "license": m.license, "description": m.description,
                    "python_name": m.python_name, "files": len(source.digests), "commit": source.commit,
                    "replaces": list(m.replaces)}
    entry = registry.get(repo_id)
    spec = entry.version if entry else None
    variants: list[dict[str, Any]] = []
    commit = None
    if spec or refs:
        res = resolve(refs, version=_spec(spec) if spec else None, revision=None if spec else refs[0].name)
        commit = res.commit
        found = source.variants(repo_id, res.commit)
        published = getattr(getattr(source, "active", None) or source, "published_metadata", None)
        declared = published(repo_id, res.commit) if published is not None else None
        if declared is not None:  # a Hub release, cached or not: its kernel.yaml says what each variant requires
            by_name = {v.name: v for v in declared.variants}
            found = [by_name.get(v.name, v) for v in found]
        variants = [{"name": v.name, "framework": v.framework, "backend": v.backend, "entry": v.entry,
                     "tpu_generations": list(v.tpu_generations), "requires": [list(r) for r in v.requires]}
                    for v in found]
        for d, v in zip(variants, found, strict=True):
            if v.backend == "tpu":
                d["tpu_compile"] = _tpu_compile_lines(source, repo_id, res.commit, v)
    return {"repo_id": repo_id, "source": source.describe(), "metadata": metadata,
            "refs": [{"name": r.name, "kind": r.kind, "commit": r.commit} for r in refs],
            "variants_commit": commit, "variants": variants}


def _tpu_compile_lines(source: Any, repo_id: str, commit: str, variant: Any) -> list[str]:
    """What a published TPU variant's metadata.json records about the compile gate (its bundle is fetched and
    verified; nothing is imported). A source folder is not a release: it records nothing."""
    from . import buildfmt as fmt
    from .sources import LocalSource

    if isinstance(getattr(source, "active", None) or source, LocalSource):
        return ["not compiled for TPU (a source folder, not a release: `kernel-hub validate --path DIR --tpu "
                "v5e,v6e` compiles it)"]
    try:
        build = source.fetch(repo_id, commit, variant)
        info = fmt.read_build_info(Path(build.package_dir).parent, f"{repo_id}@{commit[:12]}", variant.name)
    except KernelHubError as exc:  # a build that cannot be fetched or verified: say so, show the rest
        return [f"compile record unreadable: {_one_line(str(exc))[:200]}"]
    if info.tpu_compile is None:
        return ["not compiled for TPU (the release records no compile matrix)"]
    return info.tpu_compile.lines()


def simulated_backend(backend: str | None, tpu_generation: str | None) -> tuple[str | None, str]:
    """resolve's backend: --tpu-generation alone implies --backend tpu (and says so); with another backend it is a
    contradiction, refused in one line."""
    if tpu_generation is None:
        return backend, ""
    if backend is None:
        return "tpu", f"--tpu-generation {tpu_generation} implies --backend tpu"
    if backend != "tpu":
        raise KernelHubError(f"--tpu-generation {tpu_generation} simulates a TPU, but --backend is {backend}: "
                             "drop one of them")
    return backend, ""


def cmd_resolve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .planning import plan_load
    from .system import SystemFacts, detect, installed_version

    if args.tpu_generation is not None and not _TPU_GENERATION.match(args.tpu_generation):
        raise KernelHubError(f"--tpu-generation {args.tpu_generation!r} is not a TPU generation like v5e or v6e")
    args.backend, implied = simulated_backend(args.backend, args.tpu_generation)
    if implied:
        print(implied, file=sys.stderr)
    jax_version = _version_of("--jax-version", args.jax_version)
    torch_version = _version_of("--torch-version", args.torch_version)
    system: SystemFacts | None = None
    if args.backend or args.tpu_generation or jax_version or torch_version:
        base = detect(args.framework) if not args.backend else SystemFacts(backend=args.backend)
        system = replace(base, backend=args.backend or base.backend, tpu_generation=args.tpu_generation,
                         jax_version=jax_version or installed_version("jax"),
                         torch_version=torch_version or installed_version("torch"))
    plan = plan_load(args.repo, version=_spec(args.spec), revision=args.revision, framework=args.framework,
                     system=system)
    if args.json:
        r = plan.resolution
        _print_json({"repo_id": plan.repo_id, "source": plan.source.describe(), "version": r.version,
                     "commit": r.commit, "ref": r.ref, "reason": r.reason, "framework": plan.framework,
                     "system": plan.system.to_dict(),
                     "variants": [{"variant": d.variant, "accepted": d.accepted, "reason": d.reason}
                                  for d in plan.choice.trace],
                     "chosen": plan.choice.variant.name if plan.choice.variant else None})
    else:
        print(clean_lines(plan.describe()))
    return 0 if plan.choice.variant is not None else 1


def cmd_validate(args: argparse.Namespace) -> int:
    from .api import get_kernel, get_local_kernel, validate
    from .progress import progress
    from .validation import CASE_COLUMNS, case_cells, new_seed

    seed = args.seed if args.seed is not None else new_seed()
    widths = [44, 8, 16, 10, 9, 5, 8, 8]

    def row(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]

    if args.tpu:
        from .tpu.env import tpu_env

        tpu_env()  # no TPU environment: its one line now, before jax or any case loads
    with progress(json_output=args.json) as live:
        live.phase(f"loading {args.path or args.repo}", announce=False)  # jax and the kernel: seconds
        if args.path:
            module = get_local_kernel(args.path, backend=args.backend, framework=args.framework)
        else:
            module = get_kernel(args.repo, version=_spec(args.spec), revision=args.revision, backend=args.backend,
                                framework=args.framework, trust_remote_code=_trust(args.trust_remote_code),
                                lockfile=args.lockfile)
        info = module.__kernel_hub__

        def started(total: int) -> None:
            live.phase(f"validating {info.repo_id}", total, announce=False)
            live.row(f"{info.repo_id} {info.version or info.commit[:12]} [{info.variant}], seed {seed}: {total} cases")
            live.row(row(CASE_COLUMNS))

        def finished(_i: int, _total: int, case: Any) -> None:
            live.row(row(case_cells(case)), ok=case.passed)
            live.advance()

        if args.tpu:
            live.row(f"then compiling the TPU cases for {', '.join(args.tpu)} (libtpu, in .venv-tpu)")
        report = validate(module, backend=args.backend, tags=tuple(args.tag) or None, seed=seed, tpu=args.tpu,
                          on_start=started, on_case=finished)
    if args.json:
        print(report.to_json())
    else:
        compiled = report.compile_lines()
        if compiled:
            print("\n".join(compiled))
        print(report.summary())
    return 0 if report.passed else 1


def cmd_download(args: argparse.Namespace) -> int:
    """Fetch and verify, import nothing: no trust needed, every name and digest still checked."""
    from .errors import VersionSpecError
    from .progress import progress

    with progress(json_output=args.json) as live:
        if args.lockfile:
            from .lock import fetch_locked

            if args.spec is not None or args.revision is not None:
                raise VersionSpecError("a lock file fixes the version: drop --version/--revision or --lockfile")
            live.phase(f"fetching {args.repo} as {args.lockfile} locks it")
            entry, build = fetch_locked(args.repo, lockfile=args.lockfile, framework=args.framework)
            version, commit = entry.version, entry.commit
        else:
            from .planning import plan_load

            live.phase(f"resolving {args.repo}")
            plan = plan_load(args.repo, version=_spec(args.spec), revision=args.revision, backend=args.backend,
                             framework=args.framework)
            if plan.choice.variant is None:
                raise plan.no_fit()
            version, commit = plan.resolution.version, plan.resolution.commit
            live.row(f"resolved  {plan.resolution.reason}")
            live.phase(f"fetching [{plan.choice.variant.name}] and checking every sha256")
            build = plan.fetch(None)  # imports nothing: no trust needed
    data = {"repo_id": args.repo, "version": version, "commit": commit, "variant": build.variant.name,
            "package_dir": str(build.package_dir), "files": len(build.digests), "verified": True}
    if args.json:
        _print_json(data)
        return 0
    print(f"{args.repo} {version or commit[:12]} [{build.variant.name}]")
    print(f"package   {build.package_dir}")
    print(f"files     {len(build.digests)} (sha256 checked)")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from .lock import lock

    out = Path(args.output)
    locked = lock(args.repos or None, version=_spec(args.spec), revision=args.revision, framework=args.framework,
                  backend=args.backend, path=out, trust_remote_code=_trust(args.trust_remote_code))
    if args.json:
        _print_json({"path": str(out), "kernels": [
            {"repo_id": k.repo_id, "version": k.version, "commit": k.commit, "variant": k.variant["name"],
             "files": len(k.files), "source": k.source, "location": k.location} for k in locked.kernels]})
        return 0
    for k in locked.kernels:
        print(f"locked {k.repo_id} {k.version or '-'} at {k.commit[:12]} [{k.variant['name']}] "
              f"({len(k.files)} files, {k.source})")
    print(f"wrote {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .progress import progress
    from .publish import publish

    with progress(json_output=args.json) as live:
        live.phase(f"publishing {args.path}")
        result = publish(args.path, repo_id=args.repo, endpoint=args.endpoint, token=args.token,
                         skip_validation=args.skip_validation, skip_tpu_compile=args.skip_tpu_compile,
                         log=live.row)
    if args.json:
        _print_json({**asdict(result), "summary": result.summary()})
    else:
        print(result.summary())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    from .registry import load_registry

    entry = load_registry().require(args.repo)
    if entry.bench is None:
        raise KernelHubError(f"{args.repo} has no benchmark script in the registry ('bench:' key)")
    if not entry.bench.is_file():  # the wheel embeds kernels, not bench/
        raise KernelHubError(f"{args.repo}: benchmark {entry.bench} not found; benchmarks ship with a checkout of "
                             "kernel-hub, not with the wheel: run kernel-hub bench from a clone")
    return subprocess.call([sys.executable, str(entry.bench), *args.bench_args])


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(quick=args.quick)


def cmd_report(args: argparse.Namespace) -> int:
    from .progress import progress
    from .report.runner import Options, build_report, summary_lines, write_report

    def names(text: str | None) -> tuple[str, ...] | None:
        return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None

    from .report.benches import BENCHES
    from .report.families import family_specs

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
        _print_json({"out_dir": str(Path(args.out)), "report_json": str(paths[0]), "index_html": str(paths[1]),
                     "seconds": report.seconds, "seed": report.environment.seed,
                     "headline": report.headline.model_dump()})
    else:
        print("\n".join(summary_lines(report, paths)))
    return 0


def _tpu_generations(text: str) -> tuple[str, ...]:
    from .tpu.chips import parse_generations

    try:
        return parse_generations(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[clean(v) for v in r] for r in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# -- parsers --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kernel-hub",
        description="Load, verify, validate and publish accelerator kernels (Pallas first) on the Hugging Face Hub.",
        epilog="Examples:\n  kernel-hub list\n  kernel-hub resolve kernel-hub/ragged-dot-tpu --backend tpu "
        "--tpu-generation v5e\n  kernel-hub validate kernel-hub/ragged-dot-tpu\n  kernel-hub demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--registry", help="registry.yaml to use (default: the embedded one, or $KERNEL_HUB_REGISTRY)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", help="kernels in the registry", description="List the kernels the registry knows.")
    p.add_argument("--hub", metavar="ORG", help="list the repos an endpoint holds for this organisation instead")
    p.add_argument("--endpoint", help="Hub endpoint for --hub (default: $HF_ENDPOINT or huggingface.co)")
    _add_json_arg(p, "the registry")
    p.set_defaults(func=cmd_list)

    from .scaffold import DEFAULT_TEMPLATE, TEMPLATES

    p = sub.add_parser("init", help="start a new kernel folder from a template",
                       description="Write DIR/NAME/: kernel.yaml, the package (a small working Pallas kernel with "
                       "its reference, a CPU path and interpret support, the contract hooks), validation cases, "
                       "TPU compile cases, a torch entry, tests and a card with the commands to run next. The "
                       "folder needs nothing beside it. Refuses a bad name or an existing folder, writing nothing.")
    p.add_argument("name", help="kernel and package name (a Python name, e.g. my_kernel)")
    p.add_argument("--dir", default=".", help="where to create NAME/ (default: the current folder)")
    p.add_argument("--template", choices=TEMPLATES, default=DEFAULT_TEMPLATE, help="which kernel to start from")
    p.add_argument("--repo", help="repo id written to kernel.yaml (default: my-org/NAME)")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("info", help="one kernel: metadata, refs, variants, TPU compile record",
                       description="Show a kernel's metadata, its refs (tags, branches) and build variants, and for "
                       "each TPU variant of a release the compile matrix publish recorded (generations, jax and "
                       "libtpu versions, cases compiled per generation), or 'not compiled for TPU'.")
    p.add_argument("repo", help="repo id, e.g. kernel-hub/ragged-dot-tpu")
    _add_json_arg(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("resolve", help="print the version and variant decisions (the trace)",
                       description="Resolve a version spec to a commit and choose the build variant for this "
                       "system (or a simulated one), printing every variant accepted or rejected and why.")
    p.add_argument("repo", help="repo id")
    _add_version_args(p)
    p.add_argument("--tpu-generation", help="simulate a TPU generation (v4, v5e, v5p, v6e, v7x); implies --backend tpu")
    p.add_argument("--jax-version", help="simulate an installed jax version")
    p.add_argument("--torch-version", help="simulate an installed torch version")
    _add_json_arg(p, "the decisions")
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("validate", help="check a kernel's numbers against its reference here",
                       description="Run the kernel's validation cases on this backend against its reference "
                       "(tolerance by dtype; NaN never passes). Exit 1 if any case fails.")
    p.add_argument("repo", nargs="?", default="kernel-hub/ragged-dot-tpu", help="repo id (default: the ragged dot)")
    p.add_argument("--path", help="validate a local kernel folder instead of a repo")
    _add_version_args(p)
    p.add_argument("--lockfile", help="load exactly what this lock file records (see kernel-hub lock)")
    _add_trust_arg(p)
    p.add_argument("--tag", action="append", default=[], help="only cases with this tag (decode, prefill, edge, ...)")
    p.add_argument("--seed", type=int, help="random seed for the inputs (default: fresh; printed, and recorded in "
                   "the JSON, so a run can be repeated)")
    p.add_argument("--tpu", metavar="GENS", type=_tpu_generations,
                   help="also compile every TPU case with the real TPU compiler for these generations, e.g. "
                   "v5e,v6e (also v4, v5p, v7x); needs the TPU environment (make setup-tpu)")
    _add_json_arg(p, "the report")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("download", help="fetch and verify the build that fits, without importing it",
                       description="Resolve, choose the variant and fetch only its files into the cache, "
                       "checking every sha256. Prints where the package is. Imports nothing.")
    p.add_argument("repo", help="repo id")
    _add_version_args(p)
    p.add_argument("--lockfile", help="fetch exactly what this lock file records")
    _add_json_arg(p)
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("lock", help="pin kernels to a commit and variant with every file's sha256",
                       description="Resolve each kernel as get_kernel would (trust check included) and write a "
                       "lock file (repo, spec, version, commit, variant, where it came from, sha256 of every file). "
                       "kernel_hub.get_locked_kernel loads exactly that.")
    p.add_argument("repos", nargs="*", help="ORG/NAME repo ids (default: every kernel in the registry)")
    _add_version_args(p)
    p.add_argument("--output", "-o", default=os.environ.get("KERNEL_HUB_LOCK") or "kernel-hub.lock",
                   help="lock file (default kernel-hub.lock, or $KERNEL_HUB_LOCK)")
    _add_trust_arg(p)
    _add_json_arg(p, "what was locked")
    p.set_defaults(func=cmd_lock)

    p = sub.add_parser("publish", help="build, validate and upload a kernel folder to the Hub",
                       description="Build the HF kernels-compatible layout of a kernel folder (build/<variant>/ ...), "
                       "validate it on this machine, compile every TPU case for each generation its TPU variants "
                       "declare (the real TPU compiler in the TPU environment, make setup-tpu; the matrix is "
                       "recorded in the release), upload it through huggingface_hub, tag v<version> and move "
                       "branch v<major>. An existing version with different content is refused; the same content "
                       "is a no-op.")
    p.add_argument("path", help="kernel folder holding kernel.yaml (e.g. kernels/pallas/ragged_dot)")
    p.add_argument("--repo", help="ORG/NAME on the Hub (default: repo_id in kernel.yaml)")
    p.add_argument("--endpoint", help="Hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token", help="write token (default: $HF_TOKEN or the saved login)")
    p.add_argument("--skip-validation", action="store_true", help="publish without validating (says so)")
    p.add_argument("--skip-tpu-compile", action="store_true",
                   help="publish TPU variants without the TPU compile gate (says so; recorded as 'not compiled')")
    _add_json_arg(p)
    p.set_defaults(func=cmd_publish)

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

    p = sub.add_parser("report", help="validation dashboard: report.json and a static index.html",
                       description="Validate every registry kernel on every mode this machine offers (CPU paths, "
                       "Pallas interpreted, the TPU simulator with race detection, torch entries), compile TPU cases "
                       "per generation when the TPU environment is there (make setup-tpu), kernelize a tiny "
                       "model of every covered family (transformers MoE and attention, Diffusers), run the benches, "
                       "and write OUT/report.json (schema: docs/report-schema.json) and OUT/index.html (open it in "
                       "a browser; no server). A full report takes several minutes, --quick about one.")
    p.add_argument("--out", default="report", help="output folder (default: ./report)")
    p.add_argument("--quick", action="store_true",
                   help="one case per mode and dtype, TPU smoke cases for v5e, three families, one bench")
    p.add_argument("--seed", type=int, help="random seed for the validation inputs (default: fresh; recorded)")
    p.add_argument("--tpu", metavar="GENS", type=_tpu_generations,
                   help="TPU generations to compile for (default: all known; --quick: v5e)")
    p.add_argument("--tpu-cases", choices=("smoke", "all"), default="smoke",
                   help="which TPU cases to compile: smoke (each kernel's first forward and backward case; default) "
                   "or all (~60 a kernel: ~10 min a kernel for five generations on 2 cores, then cached)")
    p.add_argument("--families", metavar="NAMES", help="only these families (comma list, e.g. qwen3_moe,llama,flux)")
    p.add_argument("--benches", metavar="NAMES", help="only these benches (comma list, e.g. ragged_dot,attention)")
    p.add_argument("--skip", metavar="SECTIONS", help="leave out sections: validation, compile, families, benches")
    _add_json_arg(p, "where the files went and the headline")
    p.set_defaults(func=cmd_report)

    add_serve_parser(sub)
    parser.commands = tuple(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 failed, 2 bad usage, 130 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error, already printed as one line (2)
        return exc.code if isinstance(exc.code, int) else 2
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        commands = ", ".join(parser.commands)
        print(f"kernel-hub: error: name a command ({commands}); see kernel-hub --help", file=sys.stderr)
        return 2
    if args.registry:
        os.environ[REGISTRY_ENV] = str(Path(args.registry).resolve())
    where = f"kernel-hub {args.command}"
    try:
        status = int(func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here rather than at exit, where it would print a warning
        return status
    except BrokenPipeError:
        return _pipe_closed()
    except KernelHubError as exc:
        print(f"{where}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a file or folder the user named that cannot be read or written
        name = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"{where}: error: {exc.strerror or type(exc).__name__}:{name}", file=sys.stderr)
        return 1
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        detail: Any = _one_line(str(exc))[:300]
        print(f"{where}: internal error: {type(exc).__name__}: {detail} (set {DEBUG_ENV}=1 for the traceback)",
              file=sys.stderr)
        return 1


def _pipe_closed() -> int:
    """The reader went away (`kernel-hub validate --json | head -1`): say nothing more. Output still buffered for
    stdout goes to /dev/null, so the interpreter's flush at exit does not print a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
