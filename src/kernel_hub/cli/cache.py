"""`kernel-hub cache ls` and `kernel-hub cache prune` (kernel_hub.load.cache_admin). Light parser; the roots are read
when the command runs: KERNELS_CACHE (else HF_HUB_CACHE) and KERNEL_HUB_CACHE."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, command: Callable[[str, str], Callable[[argparse.Namespace], int]]
               ) -> None:
    p = sub.add_parser("cache", help="list or prune the kernel caches (cache ls, cache prune)",
                       description="What the kernel caches hold: each kernel repo in the Hub cache (KERNELS_CACHE, "
                       "else HF_HUB_CACHE) and each part of kernel-hub's cache (KERNEL_HUB_CACHE), with sizes. "
                       "prune removes named repos or, with --all, everything listed; only inside those roots.")
    verbs = p.add_subparsers(dest="cache_command", metavar="ls|prune", required=True)
    ls = verbs.add_parser("ls", help="list the cached kernel repos and kernel-hub's cache parts")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=command("cache", "cmd_cache_ls"))
    prune = verbs.add_parser("prune", help="remove cached kernel repos (or everything with --all)")
    prune.add_argument("repos", nargs="*", metavar="ORG/NAME", help="kernel repos to remove from the cache")
    prune.add_argument("--all", action="store_true", help="remove everything `cache ls` lists")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    prune.set_defaults(func=command("cache", "cmd_cache_prune"))


def _roots() -> tuple[Path, Path]:
    from pathlib import Path

    from huggingface_hub import constants

    from ..decide.hf_conventions import kernels_cache
    from ..decide.system import cache_root

    return kernels_cache() or Path(constants.HF_HUB_CACHE), cache_root()


def cmd_cache_ls(args: argparse.Namespace) -> int:
    from ..load.cache_admin import cache_entries, human
    from .common import print_json

    hub_root, kh_root = _roots()
    entries = cache_entries(hub_root, kh_root)
    if args.json:
        print_json({"hub_cache": str(hub_root), "kernel_hub_cache": str(kh_root),
                    "entries": [{"kind": e.kind, "name": e.name, "path": str(e.path), "bytes": e.size}
                                for e in entries]})
        return 0
    print(f"Hub cache: {hub_root}\nkernel-hub cache: {kh_root}")
    if not entries:
        print("nothing cached")
    for e in entries:
        print(f"{e.kind:<11} {e.name:<48} {human(e.size):>10}")
    print(f"total {human(sum(e.size for e in entries))}")
    return 0


def cmd_cache_prune(args: argparse.Namespace) -> int:
    from ..load.cache_admin import cache_entries, human, prune, prune_plan

    hub_root, kh_root = _roots()
    chosen, why = prune_plan(cache_entries(hub_root, kh_root), args.repos, args.all)
    size = human(sum(e.size for e in chosen))
    if args.dry_run:
        for e in chosen:
            print(f"would remove {e.path} ({human(e.size)})")
        print(f"would free {size} ({why})")
        return 0
    freed = prune(chosen)
    print(f"removed {len(chosen)} entries, {human(freed)} ({why})")
    return 0
