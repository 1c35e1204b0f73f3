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


def cmd_serve(args: argparse.Namespace) -> int:
    import shutil

    from .server import serve

    if shutil.which("git") is None:
        raise KernelHubError("serve needs the git CLI on PATH (the store is bare git repositories)")
    if not 0 < args.port < 65536:
        raise KernelHubError(f"--port must be in 1..65535, got {args.port}")
    if not _is_loopback(args.host) and not args.token:
        raise KernelHubError(f"refusing to serve on non-loopback host {args.host} without --token")
    store = Path(args.store)
    if store.exists() and not store.is_dir():
        raise KernelHubError(f"--store {store} exists and is not a folder")
    token = args.token or None
    if args.read_token_required and not token:
        raise KernelHubError("--read-token-required needs --token")
    try:
        serve(store, host=args.host, port=args.port, token=token, read_token_required=args.read_token_required,
              trusted_orgs=args.trusted_org, test_hooks=args.test_hooks, log_level=args.log_level)
    except OSError as exc:  # port in use, permission denied
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
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument("--token", default=os.environ.get("KERNEL_HUB_SERVE_TOKEN"),
                   help="token that writes must present (default: $KERNEL_HUB_SERVE_TOKEN; none: read-only)")
    p.add_argument("--read-token-required", action="store_true", help="reads need the token too")
    p.add_argument("--trusted-org", action="append", default=None, metavar="ORG",
                   help="report ORG as a trusted kernel publisher (repeatable; default: every org in the store)")
    p.add_argument("--test-hooks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
