"""Implementation choice for the Tokamax wrappers: a declared order per backend, tried in turn, with a trace.

Shared by tokamax_ragged_dot and tokamax_attention (the attention package holds a symlink to this file;
`kernel-hub publish` copies its content, so each published package stays self-contained).

Two filters, both reported: a static one (an implementation cannot run on this backend at all: Mosaic
off TPU/GPU, Triton off GPU) decided here without calling anything, and a dynamic one (Tokamax raises
NotImplementedError for a shape or dtype it does not support) caught at trace time by `run_in_order`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

#: Backends each Tokamax kernel family can run on; everything else ("xla", hub paths) runs anywhere.
NEEDS_BACKEND: dict[str, tuple[str, ...]] = {
    "mosaic": ("tpu", "cuda", "gpu"),
    "triton": ("cuda", "gpu", "rocm"),
    "cudnn": ("cuda", "gpu"),
}


def ensure_flags_parsed() -> None:
    """Tokamax 0.0.12 reads its options through absl and parses sys.argv when absl has not: under pytest
    or any CLI with its own options that raises UnrecognizedFlagError. Mark absl flags parsed (defaults)
    unless the host program parsed them already, in which case its values stand."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def candidates(
    order: Mapping[str, tuple[str, ...]],
    known: Sequence[str],
    backend: str,
    implementation: str | Sequence[str] | None,
    fallback: tuple[str, ...],
) -> tuple[tuple[str, ...], str]:
    """(names to try, where the list came from): the declared order for `backend`, or the request."""
    if implementation is None:
        names, source = order.get(backend.lower(), fallback), f"default order for {backend}"
    elif isinstance(implementation, str):
        names, source = (implementation,), "requested"
    else:
        names, source = tuple(implementation), "requested order"
    if not names:
        raise ValueError("implementation sequence is empty")
    for name in names:
        if name not in known:
            raise ValueError(f"unknown implementation {name!r}; known: {', '.join(known)}")
    return names, source


def static_filter(names: Sequence[str], backend: str) -> tuple[list[str], list[str]]:
    """(names that can run on `backend`, trace entries for those that cannot)."""
    runnable, trace = [], []
    for name in names:
        allowed = NEEDS_BACKEND.get(name)
        if allowed is not None and backend.lower() not in allowed:
            trace.append(f"{name}: skipped, needs {'/'.join(allowed)} (backend is {backend})")
            continue
        runnable.append(name)
    return runnable, trace


def resolve(
    order: Mapping[str, tuple[str, ...]],
    known: Sequence[str],
    backend: str,
    implementation: str | Sequence[str] | None,
    fallback: tuple[str, ...],
    what: str,
) -> tuple[list[str], list[str], str]:
    """(runnable names in order, trace so far, source); NotImplementedError with the trace if none."""
    names, source = candidates(order, known, backend, implementation, fallback)
    runnable, trace = static_filter(names, backend)
    if not runnable:
        raise NotImplementedError(f"no {what} implementation fits: " + "; ".join(trace))
    return runnable, trace, source


def run_in_order(
    runnable: Sequence[str],
    trace: list[str],
    source: str,
    call: Callable[[str], T],
    what: str,
    remark: Callable[[str], str | None] = lambda name: None,
) -> tuple[T, str, str]:
    """(result, name that ran, reason): the first of `runnable` whose call does not raise
    NotImplementedError; each refusal is kept in the reason with Tokamax's own message."""
    trace = list(trace)
    for name in runnable:
        try:
            out = call(name)
        except NotImplementedError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            trace.append(f"{name}: skipped, tokamax: {first[:160]}")
            continue
        extra = remark(name)
        trace.append(f"{name}: chosen ({source}){'; ' + extra if extra else ''}")
        return out, name, "; ".join(trace)
    raise NotImplementedError(f"no {what} implementation ran: " + "; ".join(trace))
