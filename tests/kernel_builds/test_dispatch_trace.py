"""The shared dispatch's remembered choice (`last_implementation()`) is per context: two threads, or two asyncio
tasks, each read the trace of their own call, interleaved so that both calls have run before either reads; and a
call traced by torch.compile(fullgraph=True) does not break the graph (dynamo cannot set a ContextVar: such a call
records nothing)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

_SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "pallas" / "_common" / "dispatch.py"


@pytest.fixture(scope="module")
def dispatch():
    name = "kh_test_dispatch"
    spec = importlib.util.spec_from_file_location(name, _SOURCE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.compile looks the module up by name
    spec.loader.exec_module(module)  # no relative imports: the file alone is the module
    yield module
    del sys.modules[name]


def _op(dispatch):
    return dispatch.Dispatch("op", ("a", "b"), {"cpu": ("a", "b")}, ("a",))


def test_each_thread_reads_its_own_trace(dispatch):
    d = _op(dispatch)
    both_ran = threading.Barrier(2, timeout=30)
    read: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def caller(name: str) -> None:
        try:
            assert d.run("cpu", name, None, str.upper) == name.upper()
            both_ran.wait()  # the other thread's call has run too: a process-wide record holds only one of them
            read[name] = d.last_implementation()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert read == {"a": ("a", "a: chosen (requested)"), "b": ("b", "b: chosen (requested)")}
    assert d.last_implementation() == (None, None)  # this thread called nothing


def test_each_asyncio_task_reads_its_own_trace(dispatch):
    d = _op(dispatch)

    async def main() -> dict[str, tuple]:
        both_ran = asyncio.Barrier(2)

        async def caller(name: str) -> tuple:
            d.run("cpu", name, None, str.upper)
            await both_ran.wait()
            return d.last_implementation()

        a, b = await asyncio.gather(caller("a"), caller("b"))
        return {"a": a, "b": b}

    assert asyncio.run(main()) == {"a": ("a", "a: chosen (requested)"), "b": ("b", "b: chosen (requested)")}


def test_a_call_inside_torch_compile_traces_without_a_graph_break(dispatch):
    torch = pytest.importorskip("torch")
    d = _op(dispatch)
    d.run("cpu", "b", None, str.upper)

    def f(x):
        return d.run("cpu", None, None, lambda name: x * 2 if name == "a" else x)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
    assert d.last_implementation()[0] == "b"  # the eager call's record; the compiled call made none
    f(torch.ones(3))
    assert d.last_implementation() == ("a", "a: chosen (default order for cpu)")
