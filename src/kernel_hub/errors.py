"""Errors a user can act on. The CLI prints these as one line, never a traceback."""

from __future__ import annotations


class KernelHubError(Exception):
    """Base for every error that names what the user should fix."""


class KernelNotFoundError(KernelHubError):
    """The repo id is not in the registry, the store or the Hub."""


class VersionSpecError(KernelHubError):
    """A version spec does not parse, or no ref satisfies it."""


class MetadataError(KernelHubError):
    """kernel.yaml, registry.yaml or a build's metadata.json is missing or malformed."""


class NoVariantError(KernelHubError):
    """No build variant fits this system; the message carries the trace."""


class KernelImportError(KernelHubError):
    """The kernel package failed to import."""


class IntegrityError(KernelHubError):
    """A file's digest does not match its metadata or lock entry."""


class ValidationFailedError(KernelHubError):
    """The kernel's numbers did not match its reference on this device."""


class UnsafeNameError(KernelHubError):
    """A name from a user, a server, a bundle, a lock or a kernel.yaml that is not allowed where it is used."""


class TrustError(KernelHubError):
    """The repo a kernel would come from is not trusted (see trust.py): nothing of it was imported."""


class RefMovedError(KernelHubError):
    """A compare-and-swap on the Hub lost: the branch (or the commit's parent) moved since it was read (HTTP 412)."""


class KernelizeStrictError(KernelHubError):
    """kernelize(strict=True) would have kept a layer's own implementation; the model is left as it was."""


class FrameworkMismatchError(KernelHubError):
    """Tensors of one framework handed to a build of the other (torch tensors to a JAX build)."""
