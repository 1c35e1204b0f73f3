"""kernel-depends as a graph: each dependency loaded once per graph, a bounded depth, one short error.

Why: a kernel-builder build names the kernels it needs (`kernel-depends`), and those name theirs. Loaded path by path,
a diamond repeated n levels deep loads 2^n times, and a long chain recursed until Python's stack gave out, each level
wrapping the error below it. Here one graph walk per top-level load (get_kernel, a locked load, a lock) remembers
every dependency it has loaded, refuses a cycle and anything deeper than MAX_DEPENDS_DEPTH, and the error names the
chain once, shortened to its ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from ..errors import KernelHubError

T = TypeVar("T")

#: Most levels of kernel-depends below the kernel asked for (HF kernels' builds use one or two).
MAX_DEPENDS_DEPTH = 16

#: Repos shown at each end of a chain in an error; the middle is counted, not listed.
_CHAIN_ENDS = 3


def chain_text(chain: tuple[str, ...]) -> str:
    """`a -> b -> c`, or the first and last few with the count between: an error line stays short."""
    if len(chain) <= 2 * _CHAIN_ENDS + 1:
        return " -> ".join(chain)
    hidden = len(chain) - 2 * _CHAIN_ENDS
    return " -> ".join([*chain[:_CHAIN_ENDS], f"... ({hidden} more) ...", *chain[-_CHAIN_ENDS:]])


@dataclass
class Graph:
    """One top-level load's walk: what each dependency key loaded to (so a diamond loads its shared node once)."""

    loaded: dict[Any, Any] = field(default_factory=dict)


_GRAPH: contextvars.ContextVar[Graph | None] = contextvars.ContextVar("kernel_hub_depends_graph", default=None)
_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("kernel_hub_depends_chain", default=())


@contextlib.contextmanager
def walk(repo_id: str) -> Iterator[Graph]:
    """The graph this load belongs to (a new one at the top), with `repo_id` on the chain while its dependencies
    load below it."""
    graph = _GRAPH.get()
    top = graph is None
    if graph is None:
        graph = Graph()
    g_token = _GRAPH.set(graph) if top else None
    c_token = _CHAIN.set((*_CHAIN.get(), repo_id))
    try:
        yield graph
    finally:
        _CHAIN.reset(c_token)
        if g_token is not None:
            _GRAPH.reset(g_token)


def _mark(exc: KernelHubError) -> KernelHubError:
    exc.__kernel_depends__ = True  # type: ignore[attr-defined]
    return exc


def load_dependency(graph: Graph, repo_id: str, key: Hashable, what: str, load: Callable[[], T]) -> T:
    """`load()` for dependency `repo_id` of the kernel on top of the chain, once per `key` in this graph; a cycle, a
    chain deeper than MAX_DEPENDS_DEPTH, or a failure below -> one KernelHubError naming the chain (a failure
    further down passes up unchanged, already named)."""
    chain = _CHAIN.get()
    if repo_id in chain:
        raise _mark(KernelHubError(f"kernel-depends cycle {chain_text((*chain, repo_id))}"))
    if key in graph.loaded:
        return graph.loaded[key]
    if len(chain) > MAX_DEPENDS_DEPTH:
        raise _mark(KernelHubError(
            f"kernel-depends deeper than {MAX_DEPENDS_DEPTH} levels: {chain_text((*chain, repo_id))}"))
    try:
        got = load()
    except KernelHubError as exc:
        if getattr(exc, "__kernel_depends__", False):
            raise
        raise _mark(type(exc)(f"{chain_text(chain)}: kernel-depends {repo_id} ({what}) did not load: {exc}")) from None
    graph.loaded[key] = got
    return got


@contextlib.contextmanager
def hf_kernel_deps(deps: dict[str, ModuleType]) -> Iterator[None]:
    """While a kernel-builder kernel imports, HF kernels' `get_kernel_dep(repo)` answers with `deps` (kernels
    written for HF kernels ask for their dependencies that way); nothing where there are none or HF kernels is
    not installed."""
    if not deps or importlib.util.find_spec("kernels") is None:
        yield
        return
    try:
        from kernels._internals.deps import use_kernel_deps
    except ImportError:
        yield
        return
    with use_kernel_deps(deps):
        yield
