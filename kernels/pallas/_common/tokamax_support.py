"""What the Tokamax wrappers share: which backend each Tokamax kernel family needs, and absl flag set-up.

The wrappers run Tokamax's ops through `dispatch.Dispatch` with `tokamax_why_not` as its static filter; Tokamax's
own NotImplementedError for a shape or dtype is the dynamic one (the next name is tried, the refusal kept in the
trace).
"""

from __future__ import annotations

from typing import Any

#: Backends each Tokamax kernel family can run on; everything else ("xla", hub paths) runs anywhere.
NEEDS_BACKEND: dict[str, tuple[str, ...]] = {
    "mosaic": ("tpu", "cuda", "gpu"),
    "triton": ("cuda", "gpu", "rocm"),
    "cudnn": ("cuda", "gpu"),
}


def tokamax_why_not(name: str, platform: str, interpret: Any) -> str | None:
    """Why Tokamax's `name` cannot run on `platform` with this `interpret`, or None when it can."""
    allowed = NEEDS_BACKEND.get(name)
    if allowed is None:
        return None  # plain XLA: runs anywhere, interpret= does not apply
    if platform.lower() not in allowed:
        return f"needs {'/'.join(allowed)} (platform is {platform})"
    if interpret not in (None, False):
        return "Tokamax's Pallas ops choose their own mode (interpret= must be None or False)"
    return None


def ensure_flags_parsed() -> None:
    """Tokamax 0.0.12 reads its options through absl and parses sys.argv when absl has not: under pytest or any
    CLI with its own options that raises UnrecognizedFlagError. Mark absl flags parsed (defaults) unless the host
    program parsed them already, in which case its values stand."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
