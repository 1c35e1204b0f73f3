"""`kernel-hub init` and `publish`: start a kernel folder, and release one."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ..publish.release import publish
from ..scaffold import init
from ..ui.progress import progress
from .common import print_json


def cmd_init(args: argparse.Namespace) -> int:
    target = init(args.name, args.dir, args.template, args.repo)
    print(f"wrote {target} ({args.template} op). Next:")
    print(f"  kernel-hub validate --path {target}")
    print(f"  kernel-hub validate --path {target} --tpu v5e,v6e")
    print(f"  kernel-hub publish {target} --repo ORG/NAME --endpoint http://127.0.0.1:8080  # kernel-hub serve's port")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    with progress(json_output=args.json) as live:
        live.phase(f"publishing {args.path}")
        result = publish(args.path, repo_id=args.repo, endpoint=args.endpoint, token=args.token,
                         skip_validation=args.skip_validation, skip_tpu_compile=args.skip_tpu_compile,
                         log=live.row, progress=live)
    if args.json:
        print_json({**asdict(result), "summary": result.summary()})
    else:
        print(result.summary())
    return 0
