"""pytest-xdist's loadscope scheduling, made to finish when a worker process dies.

pytest-xdist 3.8.0's LoadScopeScheduling deadlocks after a worker crash (pytest-dev/pytest-xdist issues 1323, 1327,
1378): `remove_node` puts the dead worker's whole workload back on the queue, its finished scopes too, which later go
out as empty work units that never report completion; the test it died on is queued again and may take the next
worker down with it; and a replacement worker given a single one-test unit waits forever for a second. The suite then
idles until CI's time limit. Here the scheduler keeps only unfinished scopes and gives a worker that joins late a
second unit or its shutdown, as the initial distribution does, and never work before its collection has arrived
(two workers dying together leave two replacements collecting at once).

A test whose worker dies runs once more, first in its scope's queue, on a fresh worker: a worker that kept its
compiled programs could run out of memory mappings after thousands of unrelated compiles and die in the next one
(docs/install.md; conftest now releases them each module), which says nothing about the test it happened in. A test
that kills a second worker fails, as xdist reports any crash; every crash, rerun or not, is listed in the run's
summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController


def running_test(workload: dict[str, dict[str, bool]]) -> str | None:
    """The test a worker was running when it died: the first unfinished one of its workload (None: it had finished)."""
    return next((nodeid for unit in workload.values() for nodeid, done in unit.items() if not done), None)


def requeue(workload: dict[str, dict[str, bool]], rerun: bool = False
            ) -> tuple[str | None, dict[str, dict[str, bool]]]:
    """(the test a worker died on, the scopes to run again) from its workload {scope: {nodeid: done}}: the first
    unfinished test of its first unfinished scope is the one it was running. It counts as done unless `rerun`;
    scopes with nothing left to run are dropped."""
    crashed = running_test(workload)
    again = {}
    for scope, unit in workload.items():
        left = {nodeid: done or (nodeid == crashed and not rerun) for nodeid, done in unit.items()}
        if not all(left.values()):
            again[scope] = left
    return crashed, again


class CrashSafeLoadScope(LoadScopeScheduling):
    """LoadScopeScheduling whose recovery from a dead worker cannot deadlock and reruns the crashed test once (see
    the module docstring)."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        self.crashes: list[tuple[str, str, bool]] = []  # (worker, test, run again)

    def remove_node(self, node: WorkerController) -> str | None:
        workload = self.assigned_work.pop(node)
        crashed = running_test(workload)
        if crashed is None:  # a worker that finished its work: nothing to hand out again
            return None
        rerun = all(test != crashed for _, test, _ in self.crashes)
        self.crashes.append((node.gateway.id, crashed, rerun))
        _, again = requeue(workload, rerun=rerun)
        self.workqueue.update(again)
        if rerun:  # first in line: the next worker to ask takes it
            self.workqueue.move_to_end(next(iter(again)), last=False)
        for other in self.assigned_work:
            if other in self.registered_collections:  # a replacement still collecting gets work once it has
                self._reschedule(other)
        return None if rerun else crashed

    def schedule(self) -> None:
        if self.collection is None:  # the first distribution
            super().schedule()
            return
        # A replacement worker's collection arrived. Work goes to the workers whose collections are in: another
        # replacement may still be collecting (two workers died close together), and xdist's own loop would look its
        # collection up and fail; it gets work when its own arrives. Two passes: a second unit, or shutdown, so a
        # one-test unit can finish (the first distribution's rule).
        for _ in range(2):
            for node in self.nodes:
                if node in self.registered_collections:
                    self._reschedule(node)


def crash_lines(crashes: list[tuple[str, str, bool]]) -> list[str]:
    """The run summary's account of its worker crashes, one line each."""
    return [f"{worker} died running {test}: " + ("it runs again on a fresh worker" if rerun else
                                                "it had killed a worker before: failed")
            for worker, test, rerun in crashes]


_SCHEDULER = pytest.StashKey[CrashSafeLoadScope]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    """--dist loadscope runs on CrashSafeLoadScope; every other mode keeps xdist's own scheduler."""
    if config.getvalue("dist") == "loadscope":
        scheduler = CrashSafeLoadScope(config, log)
        config.stash[_SCHEDULER] = scheduler
        return scheduler
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    scheduler = config.stash.get(_SCHEDULER, None)
    if scheduler is not None and scheduler.crashes:
        terminalreporter.write_sep("=", f"{len(scheduler.crashes)} worker crash(es)", red=True)
        for line in crash_lines(scheduler.crashes):
            terminalreporter.write_line(line)
