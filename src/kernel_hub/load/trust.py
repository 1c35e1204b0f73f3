"""Trust policy: which kernels may run. One check, on every path that imports or locks a kernel.

Kernels from a folder on this machine (the registry's source paths, get_local_kernel) are code the user already
has. From a Hub, the repo actually fetched (a registry entry's `hub:` repo, not the alias) must be trusted: its
organisation is on the trusted list (KERNEL_HUB_TRUSTED_ORGS adds to it), or the caller said so with
`trust_remote_code`: True trusts every repo; a list trusts what it names, as in HF `kernels`, an entry "org"
every repo of that organisation and "org/name" that one repo. Digests are checked either way. The server's own
claims about trusted publishers are never asked: a hostile server would say yes.

`kernel-hub serve` answers HF `kernels`' question (is this org a trusted publisher?) from the same setting: by
default the orgs KERNEL_HUB_TRUSTED_ORGS names where it runs, and no other, so both clients reach one decision for
one server (docs/trust.md).

The default organisations are trusted only at the default endpoint (https://huggingface.co), where those
organisations are who they say. At any other endpoint (a mirror, `kernel-hub serve`) whoever holds that server's
write token chooses what `kernel-hub/...` holds, so trust there is explicit: KERNEL_HUB_TRUSTED_ORGS or
trust_remote_code, and the refusal names both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import TrustError, UnsafeNameError
from ..names import check_repo_id
from ..sources.base import Origin

TRUSTED_ORGS = ("kernel-hub", "kernels-community")
DEFAULT_ENDPOINT = "https://huggingface.co"
TRUST_ENV = "KERNEL_HUB_TRUSTED_ORGS"
CLI_FLAG = "--trust-remote-code, or --trust ORG_OR_REPO"

@dataclass(frozen=True)
class TrustPolicy:
    """What a caller trusts beyond the trusted organisations, checked once at the public edge (trust_policy) so the
    loading code below never reads the raw setting.

    everything: every repo (trust_remote_code=True). named: repos ("org/name") and organisations ("org"), each checked.
    """

    everything: bool = False
    named: tuple[str, ...] = ()

    def grant(self, repo_id: str) -> str | None:
        """Why this policy trusts `repo_id` (None: it does not)."""
        org = repo_id.split("/")[0]
        if self.everything:
            return "trust_remote_code=True"
        if repo_id in self.named:
            return f"trust_remote_code names {repo_id}"
        if org in self.named:
            return f"trust_remote_code names organisation {org}"
        return None


#: The default: nothing beyond the trusted organisations (and KERNEL_HUB_TRUSTED_ORGS).
NOTHING_EXTRA = TrustPolicy()

#: What `trust_remote_code` accepts at the public edge: a bool, or repos ("org/name") and organisations ("org") to
#: trust (a list, tuple, set or iterator: never a mapping); None is the default (nothing beyond the trusted
#: organisations); a TrustPolicy already read passes as it is.
TrustSetting = bool | str | list[str] | tuple[str, ...] | set[str] | frozenset[str] | Iterator[str] | TrustPolicy | None


def trust_policy(value: TrustSetting) -> TrustPolicy:
    """The policy a public `trust_remote_code` value asks for; the one place a raw setting is read.

    Args:
        value: True (every repo), False/None (none beyond the trusted organisations), repos/organisations, or a
            TrustPolicy (an edge handing its caller's policy to another public function).
    Returns:
        The TrustPolicy, each named entry checked.
    Raises:
        TrustError: a value of another type, or an entry that is not ORG or ORG/NAME.
    """
    if isinstance(value, TrustPolicy):
        return value
    if value is None or isinstance(value, bool):
        return TrustPolicy(everything=bool(value))
    if isinstance(value, str):
        entries: tuple[object, ...] = (value,)
    elif isinstance(value, list | tuple | set | frozenset | Iterator):
        entries = tuple(value)
    else:  # a mapping would read as its keys ({"acme": False} trusting acme): refused, as any other type
        raise TrustError(f"trust_remote_code must be True/False or a list of repos/orgs ('org', 'org/name'), not "
                         f"{type(value).__name__}")
    named: list[str] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise TrustError(f"trust_remote_code entries must be 'org' or 'org/name' strings, got "
                             f"{type(entry).__name__}")
        try:
            check_repo_id(entry if "/" in entry else f"{entry}/x")
        except UnsafeNameError:
            raise TrustError(f"trust_remote_code entry {entry[:80]!r} is not a repo (ORG/NAME) or an organisation "
                             "(ORG)") from None
        named.append(entry)
    return TrustPolicy(named=tuple(named))


def is_default_endpoint(location: str) -> bool:
    return location.rstrip("/").lower() == DEFAULT_ENDPOINT


def default_orgs_for(origin: Origin) -> tuple[str, ...]:
    """The organisations trusted without being named: TRUSTED_ORGS at the default endpoint, none elsewhere."""
    return TRUSTED_ORGS if origin.kind == "local" or is_default_endpoint(origin.location) else ()


def env_trusted_orgs() -> tuple[str, ...]:
    """The organisations KERNEL_HUB_TRUSTED_ORGS names (comma-separated), in order."""
    return tuple(o.strip() for o in os.environ.get(TRUST_ENV, "").split(",") if o.strip())


def trusted_orgs(origin: Origin | None = None) -> tuple[str, ...]:
    """The default organisations (for `origin`'s endpoint; all of them when no origin is given) and
    KERNEL_HUB_TRUSTED_ORGS."""
    return (TRUSTED_ORGS if origin is None else default_orgs_for(origin)) + env_trusted_orgs()


def trust_decision(origin: Origin, policy: TrustPolicy, orgs: tuple[str, ...]) -> tuple[bool, str]:
    """(allowed, reason) for loading code from `origin`. Pure: the trusted organisations are an argument."""
    if origin.kind == "local":
        return True, f"local folder {origin.location}"
    repo = origin.repo_id
    org = repo.split("/")[0]
    if org in orgs:
        return True, f"organisation {org} is trusted"
    granted = policy.grant(repo)
    if granted is not None:
        return True, granted
    untrusted = f"organisation {org} is not trusted"
    if org in TRUSTED_ORGS:
        untrusted = (f"organisation {org} is trusted by default only at {DEFAULT_ENDPOINT}, not at "
                     f"{origin.location} (whoever can write there chooses what it holds)")
    if policy.named:
        return False, f"{repo} is not among trust_remote_code {list(policy.named)} and {untrusted}"
    return False, untrusted


def check_trust(origin: Origin, policy: TrustPolicy, asked_for: str | None = None) -> None:
    """Raise TrustError (one line, naming the ways to trust it) unless `origin` may run; every path that imports
    or locks a kernel calls this on the repo it fetches."""
    allowed, reason = trust_decision(origin, policy, trusted_orgs(origin))
    if not allowed:
        alias = f" (registry alias {asked_for})" if asked_for and asked_for != origin.repo_id else ""
        raise TrustError(
            f"{origin.repo_id}{alias} from {origin.location}: {reason}; pass trust_remote_code=True or a list naming "
            f"the repo or its organisation (CLI: {CLI_FLAG}), or add the organisation to {TRUST_ENV} "
            f"({TRUST_ENV}={origin.repo_id.split('/')[0]})"
        )
