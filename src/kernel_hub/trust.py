"""Trust policy: which kernels may run without the user saying trust_remote_code=True.

Kernels from the embedded registry or a local folder are code the user already has. From the Hub,
only organisations on the trusted list load without the flag; digests are checked either way.
"""

from __future__ import annotations

import os

from .errors import KernelHubError
from .sources import LocalSource, Source

TRUSTED_ORGS = ("kernel-hub", "kernels-community")
TRUST_ENV = "KERNEL_HUB_TRUSTED_ORGS"


def trusted_orgs() -> tuple[str, ...]:
    extra = tuple(o for o in os.environ.get(TRUST_ENV, "").split(",") if o)
    return TRUSTED_ORGS + extra


def trust_decision(source: Source, repo_id: str, trust_remote_code: bool) -> tuple[bool, str]:
    """(allowed, reason): pure given the source kind and the trusted organisations."""
    if isinstance(getattr(source, "active", None) or source, LocalSource):
        return True, "local source"
    org = repo_id.split("/")[0]
    if org in trusted_orgs():
        return True, f"organisation {org} is trusted"
    if trust_remote_code:
        return True, "trust_remote_code=True"
    return False, f"organisation {org} is not trusted"


def check_trust(source: Source, repo_id: str, trust_remote_code: bool) -> None:
    allowed, reason = trust_decision(source, repo_id, trust_remote_code)
    if not allowed:
        raise KernelHubError(
            f"{repo_id}: {reason}; pass trust_remote_code=True (or --trust-remote-code), "
            f"or add the org to {TRUST_ENV}"
        )
