"""`kernel-hub validate`, `download`, `lock`: load (or only fetch) a kernel as get_kernel would."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..api import get_kernel, get_local_kernel, validate
from ..decide.variants import KERNEL_BUILDER
from ..errors import VersionSpecError
from ..load.lock import fetch_locked, lock
from ..load.planning import plan_load
from ..tpu.env import tpu_env
from ..ui.progress import progress
from ..verify.results import CASE_COLUMNS, NumericResult, case_cells
from ..verify.validation import new_seed
from .common import print_json, trust_setting, version_spec


def cmd_validate(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else new_seed()
    widths = [44, 8, 16, 10, 9, 5, 8, 8]

    def row(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]

    if args.tpu:
        tpu_env()  # no TPU environment: its one line now, before jax or any case loads
    with progress(json_output=args.json) as live:
        live.phase(f"loading {args.path or args.repo}", announce=False)  # jax and the kernel: seconds
        if args.path:
            module = get_local_kernel(args.path, backend=args.backend, framework=args.framework)
        else:
            module = get_kernel(args.repo, version=version_spec(args.spec), revision=args.revision,
                                backend=args.backend, framework=args.framework, lockfile=args.lockfile,
                                trust_remote_code=trust_setting(args.trust_remote_code))
        info = module.__kernel_hub__

        def started(total: int) -> None:
            live.phase(f"validating {info.repo_id}", total, announce=False)
            live.row(f"{info.repo_id} {info.version or info.commit[:12]} [{info.variant}], seed {seed}: {total} cases")
            live.row(row(CASE_COLUMNS))

        def finished(_i: int, _total: int, case: NumericResult) -> None:
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
    with progress(json_output=args.json) as live:
        if args.lockfile:
            if args.spec is not None or args.revision is not None:
                raise VersionSpecError("a lock file fixes the version: drop --version/--revision or --lockfile")
            live.phase(f"fetching {args.repo} as {args.lockfile} locks it")
            entry, build = fetch_locked(args.repo, lockfile=args.lockfile, framework=args.framework)
            version, commit = entry.version, entry.commit
        else:
            live.phase(f"resolving {args.repo}")
            plan = plan_load(args.repo, version=version_spec(args.spec), revision=args.revision,
                             backend=args.backend, framework=args.framework)
            variant = plan.chosen_variant()
            version, commit = plan.resolution.version, plan.resolution.commit
            live.row(f"resolved  {plan.resolution.reason}")
            live.phase(f"fetching [{variant.name}] and checking every sha256")
            build = plan.download()  # imports nothing: no trust needed
    data = {"repo_id": args.repo, "version": version, "commit": commit, "variant": build.variant.name,
            "package_dir": str(build.package_dir), "files": len(build.digests), "verified": True,
            "verification": build.verified}
    if args.json:
        print_json(data)
        return 0
    print(f"{args.repo} {version or commit[:12]} [{build.variant.name}]")
    print(f"package   {build.package_dir}")
    how = f"checked: {build.verified}" if build.variant.dialect == KERNEL_BUILDER else "sha256 checked"
    print(f"files     {len(build.digests)} ({how})")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    out = Path(args.output)
    locked = lock(args.repos or None, version=version_spec(args.spec), revision=args.revision, framework=args.framework,
                  backend=args.backend, path=out, trust_remote_code=trust_setting(args.trust_remote_code))
    if args.json:
        print_json({"path": str(out), "kernels": [
            {"repo_id": k.repo_id, "version": k.version, "commit": k.commit, "variant": k.variant["name"],
             "files": len(k.files), "source": k.source, "location": k.location} for k in locked.kernels]})
        return 0
    for k in locked.kernels:
        print(f"locked {k.repo_id} {k.version or '-'} at {k.commit[:12]} [{k.variant['name']}] "
              f"({len(k.files)} files, {k.source})")
    print(f"wrote {out}")
    return 0
