"""`kernel-hub setup-tpu`: build the TPU environment the compile gate needs (kernel_hub.tpu.setup_env), for a
kernel-hub installed from a wheel (a checkout has `make setup-tpu`). Its parser is light: nothing is imported
until the command runs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def add_parser(sub: argparse._SubParsersAction, command: Callable[[str, str], Callable[[argparse.Namespace], int]]
               ) -> None:
    p = sub.add_parser("setup-tpu", help="build the TPU environment the publish gate and validate --tpu need",
                       description="Create a virtual environment with jax[tpu] (the real TPU compiler, libtpu, "
                       "~700 MB) and what kernel-hub's TPU worker imports, link this kernel-hub into it, and check "
                       "it answers. Default folder: $KERNEL_HUB_CACHE/tpu-env (~/.cache/kernel_hub/tpu-env), "
                       "found there by publish and validate --tpu with nothing else set. Run again to update.")
    p.add_argument("--dir", help="where to build it (then set KERNEL_HUB_TPU_PYTHON=DIR/bin/python)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the pip command, build nothing")
    p.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for pip install (repeatable), e.g. --pip-arg=--find-links=/wheels")
    p.add_argument("--pip-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the pip install after this long (default 1800)")
    p.set_defaults(func=command("setup_tpu", "cmd_setup_tpu"))


def cmd_setup_tpu(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..decide.system import installed_version
    from ..tpu.setup_env import PIP_TIMEOUT, plan_setup, setup_tpu

    target = Path(args.dir).expanduser() if args.dir else None
    if args.dry_run:
        plan = plan_setup(target, installed_version("jax"))
        print(f"would build {plan.target} ({plan.jax_reason})")
        for command in plan.commands(args.pip_arg):
            print("  " + " ".join(command))
        print(f"  then link kernel_hub into it ({plan.target}/kernel_hub_link)")
        return 0
    python = setup_tpu(target, pip_args=args.pip_arg,
                       pip_timeout=PIP_TIMEOUT if args.pip_timeout is None else args.pip_timeout)
    if args.dir:
        print(f"set KERNEL_HUB_TPU_PYTHON={python} for publish and validate --tpu to use it")
    return 0
