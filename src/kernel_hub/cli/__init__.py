"""The `kernel-hub` command (entry point `kernel_hub.cli:main`).

Every subcommand has --help, exits non-zero on failure, and prints exactly one line for a user error (a bad
argument, file, spec or repo), never a traceback. The parsers live in parser.py, which imports no command: each
command group's module (catalog, loading, authoring, tools, serve) is imported when one of its commands runs, so
`kernel-hub --help` stays fast. `--json` (list, info, resolve, download, validate, lock, publish, report) prints
one JSON document with snake_case keys (docs/cli-json.md) and nothing else on stdout; long commands show live
progress (progress.py). A reader that closes the pipe early (`| head`) ends the command quietly (exit 141, no
traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import KernelHubError
from ..load.registry import REGISTRY_ENV
from ..ui.display import one_line
from .common import DEBUG_ENV, simulated_backend, table, trust_setting
from .parser import build_parser

__all__ = ["build_parser", "main", "simulated_backend"]

# Names the tests (and older callers) know from the single-file cli.py.
_trust, _table = trust_setting, table


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
        print(f"{where}: error: {one_line(exc, limit=None)}", file=sys.stderr)
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
        detail: Any = one_line(exc, limit=None)[:300]
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
