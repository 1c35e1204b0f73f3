"""`kernel-hub serve`: the command. The server needs the `hub` extra (starlette, uvicorn, dulwich): without it
the command says which package is missing, in one line."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import Any

from ..errors import KernelHubError, TrustError
from ..load.trust import TRUST_ENV, env_trusted_orgs
from ..names import check_repo_id

_MISSING = ""
try:
    from ..server import Limits, serve
except ImportError as exc:  # the hub extra is optional: only this command needs it
    Limits, serve, _MISSING = None, None, exc.name or "the hub extra"  # type: ignore[assignment,misc]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """serve's arguments checked (one line each) and turned into kernel_hub.server.serve's keywords; the store
    folder is created."""
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
    return dict(store=store, host=args.host, port=args.port, token=token, read_token_required=args.read_token_required,
                trusted_orgs=reported_trusted_orgs(args.trusted_org), log_level=args.log_level, limits=limits)


def reported_trusted_orgs(flag: list[str] | None) -> tuple[str, ...]:
    """The orgs serve tells HF `kernels` are trusted publishers: --trusted-org when given, else the ones
    KERNEL_HUB_TRUSTED_ORGS names, which is what kernel-hub's own client trusts at this server."""
    orgs = tuple(flag) if flag is not None else env_trusted_orgs()
    for org in orgs:
        try:
            check_repo_id(f"{org}/x")
        except KernelHubError:
            source = "--trusted-org" if flag is not None else TRUST_ENV
            raise TrustError(f"{source}: {org!r} is not an organisation name") from None
    return orgs


def cmd_serve(args: argparse.Namespace) -> int:
    if serve is None:
        raise KernelHubError(f"serve needs {_MISSING}: pip install 'kernel-hub[hub]'")
    options = serve_options(args)
    try:
        serve(**options)
    except OSError as exc:  # port in use, permission denied, unknown host
        raise KernelHubError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0
