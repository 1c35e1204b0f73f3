"""`kernel-hub serve`: its parser and command. cli.py registers it through `add_parsers`; the server's heavy
imports happen inside the command, so `--help` stays fast."""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from .errors import KernelHubError


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _size(text: str) -> int:
    """A byte count for argparse: 1048576, 512K, 512M, 2G (binary units)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(value[-1:], 1)
    try:
        size = int(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K/M/G)") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return size


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"not a number of seconds in (0, 3600]: {text!r}")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server import Limits, serve
    except ImportError as exc:
        raise KernelHubError(f"serve needs {exc.name or 'the hub extra'}: pip install 'kernel-hub[hub]'") from None

    if not 0 <= args.port < 65536:
        raise KernelHubError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if not _is_loopback(args.host) and not args.token:
        raise KernelHubError(f"refusing to serve on non-loopback host {args.host} without --token")
    token = args.token or None
    if args.read_token_required and not token:
        raise KernelHubError("--read-token-required needs --token")
    store = Path(args.store)
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelHubError(f"--store {store}: {exc.strerror or exc}") from None
    limits = Limits(max_commit_bytes=args.max_commit_size, max_json_bytes=args.max_json_size,
                    header_timeout=args.header_timeout, body_timeout=args.body_timeout)
    try:
        serve(store, host=args.host, port=args.port, token=token, read_token_required=args.read_token_required,
              trusted_orgs=args.trusted_org, test_hooks=args.test_hooks, log_level=args.log_level, limits=limits)
    except OSError as exc:  # port in use, permission denied, unknown host
        raise KernelHubError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register serve on the main parser."""
    p = sub.add_parser(
        "serve", help="serve a local store of kernel repos over the Hub HTTP API",
        description="Serve bare git repositories under --store over the subset of the Hugging Face Hub HTTP "
                    "API that huggingface_hub and HF `kernels` use. Point HF_ENDPOINT at it. Writes need "
                    "--token; reads are open unless --read-token-required.",
    )
    p.add_argument("--store", required=True, help="folder holding the repositories (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0: any free port, printed)")
    p.add_argument("--token", default=os.environ.get("KERNEL_HUB_SERVE_TOKEN"),
                   help="token that writes must present (default: $KERNEL_HUB_SERVE_TOKEN; none: read-only)")
    p.add_argument("--read-token-required", action="store_true", help="reads need the token too")
    p.add_argument("--trusted-org", action="append", default=None, metavar="ORG",
                   help="report ORG as a trusted kernel publisher (repeatable; default: every org in the store)")
    p.add_argument("--max-commit-size", type=_size, default=512 << 20, metavar="SIZE",
                   help="largest commit body (default 512M; K/M/G suffixes)")
    p.add_argument("--max-json-size", type=_size, default=2 << 20, metavar="SIZE",
                   help="largest body of every other request (default 2M)")
    p.add_argument("--header-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                   help="close a connection whose request headers take longer (default 10)")
    p.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="refuse a body that stalls this long, or averages under 64 KiB/s past it (default 30)")
    p.add_argument("--test-hooks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
