"""`kernel-hub serve`: the command. The server itself needs the `hub` extra (starlette, uvicorn, dulwich), so it
is imported when the command runs: without it the command says which package is missing in one line."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

from ..errors import KernelHubError


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..server import Limits, serve
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
