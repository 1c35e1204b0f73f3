"""One op, several implementations, tried in order: the `implementation=` contract every kernel entry keeps.

`implementation=None` takes the declared order for the platform; a name or a sequence of names is tried in the given
order, and the first that can run wins. Unknown names raise ValueError naming the known ones, before anything runs.
Two filters decide "can run", both kept in a trace that `resolve_implementation` returns and `last_implementation`
remembers: a static one (`why_not(name, platform, interpret)`, e.g. Triton off GPU, jax not installed), and a dynamic
one (the implementation raises NotImplementedError for a shape or dtype when called; the next name is tried).
The remembered choice is per context (a ContextVar, where transformers keeps its per-forward state too): each thread
and each asyncio task reads the trace of its own calls, never a concurrent caller's.

Pure Python (no jax, no torch): torch-facing entries use it too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

#: (name, platform, interpret) -> why that implementation cannot run there, or None when it can.
WhyNot = Callable[[str, str, Any], "str | None"]
#: (name, platform, interpret) -> extra words for the trace of the chosen implementation (how it runs), or None.
Remark = Callable[[str, str, Any], "str | None"]
#: (name, trace) of a dispatch's most recent call.
Last = tuple[str | None, str | None]


def _torch_compiling() -> bool:
    """Whether torch.compile is tracing this call (torch looked up, never imported): dynamo cannot set a ContextVar,
    so a call traced into a compiled graph records nothing."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)  # None too while torch is still importing
    return compiler is not None and bool(compiler.is_compiling())


class Dispatch:
    """The implementations of one op, their order per platform, and the last choice made in the current context."""

    def __init__(
        self,
        op: str,
        implementations: Sequence[str],
        order: Mapping[str, tuple[str, ...]],
        fallback: tuple[str, ...],
        *,
        why_not: WhyNot | None = None,
        remark: Remark | None = None,
    ) -> None:
        self.op = op
        self.implementations = tuple(implementations)
        self.order = dict(order)
        self.fallback = tuple(fallback)
        for names in (*self.order.values(), self.fallback):
            unknown = [n for n in names if n not in self.implementations]
            if unknown:
                raise ValueError(f"{op}: order names unknown implementation {unknown[0]!r}")
        self._why_not = why_not
        self._remark = remark
        # one ContextVar per Dispatch, made once: each op's entry module makes its Dispatch at import
        self._last: ContextVar[Last] = ContextVar(f"{op}_last_implementation", default=(None, None))

    def exports(self) -> tuple[Callable[..., Any], ...]:
        """(implementations_for, resolve_implementation, last_implementation): the functions an entry exports."""
        return self.implementations_for, self.resolve_implementation, self.last_implementation

    def implementations_for(self, backend: str) -> tuple[str, ...]:
        """Implementations tried, in order, when none is named (unknown platforms get the portable ones)."""
        return self.order.get(backend.lower(), self.fallback)

    def candidates(self, backend: str, implementation: str | Sequence[str] | None) -> tuple[tuple[str, ...], str]:
        """(names to try, where the list came from); ValueError for an empty request or an unknown name."""
        if implementation is None:
            names, source = self.implementations_for(backend), f"default order for {backend}"
        elif isinstance(implementation, str):
            names, source = (implementation,), "requested"
        else:
            names, source = tuple(implementation), "requested order"
        known = ", ".join(self.implementations)
        if not names:
            raise ValueError(f"{self.op}: the implementation sequence is empty; known: {known}")
        for name in names:
            if name not in self.implementations:
                raise ValueError(f"unknown {self.op} implementation {name!r}; known: {known}")
        return names, source

    def plan(
        self, backend: str, implementation: str | Sequence[str] | None, interpret: Any = None
    ) -> tuple[list[str], list[str], str]:
        """(names that pass the static filter, in order; trace of those that do not; source of the list)."""
        names, source = self.candidates(backend, implementation)
        runnable, trace = [], []
        for name in names:
            why = self._why_not(name, backend, interpret) if self._why_not else None
            if why:
                trace.append(f"{name}: skipped, {why}")
            else:
                runnable.append(name)
        if not runnable:
            raise NotImplementedError(f"no {self.op} implementation fits: " + "; ".join(trace))
        return runnable, trace, source

    def _chosen(self, name: str, source: str, backend: str, interpret: Any) -> str:
        extra = self._remark(name, backend, interpret) if self._remark else None
        return f"{name}: chosen ({source}){'; ' + extra if extra else ''}"

    def resolve_implementation(
        self, backend: str, implementation: str | Sequence[str] | None = None, *, interpret: Any = None
    ) -> tuple[str, str]:
        """(first name that can run on `backend`, trace of why), without calling anything."""
        runnable, trace, source = self.plan(backend, implementation, interpret)
        return runnable[0], "; ".join([*trace, self._chosen(runnable[0], source, backend, interpret)])

    def run(
        self,
        backend: str,
        implementation: str | Sequence[str] | None,
        interpret: Any,
        call: Callable[[str], T],
        note: str | None = None,
    ) -> T:
        """call(name) for the first runnable name that does not raise NotImplementedError; records the choice
        (with `note`, this call's own detail such as how a mask was passed, added to the trace)."""
        runnable, trace, source = self.plan(backend, implementation, interpret)
        for name in runnable:
            try:
                out = call(name)
            except NotImplementedError as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                trace.append(f"{name}: skipped, refused at call: {first[:160]}")
                continue
            chosen = self._chosen(name, source, backend, interpret)
            if not _torch_compiling():
                self._last.set((name, "; ".join([*trace, chosen + (f"; {note}" if note else "")])))
            return out
        raise NotImplementedError(f"no {self.op} implementation ran: " + "; ".join(trace))

    def last_implementation(self) -> Last:
        """(name, reason) of the most recent call in this thread / asyncio task (at trace time under jit; calls
        inside a torch.compile graph are not recorded)."""
        return self._last.get()
