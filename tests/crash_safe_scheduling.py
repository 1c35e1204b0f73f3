"""pytest-xdist's loadscope scheduling, made to finish when a worker process dies.

pytest-xdist 3.8.0's LoadScopeScheduling deadlocks after a worker crash (pytest-dev/pytest-xdist issues 1323, 1327,
1378): `remove_node` puts the dead worker's whole workload back on the queue, its finished scopes too, which later go
out as empty work units that never report completion; the test it died on is queued again and may take the next
worker down with it; and a replacement worker given a single one-test unit waits forever for a second. The suite then
idles until CI's time limit. Here the scheduler keeps only unfinished scopes, counts the crashed test as done (xdist
has already reported it failed), and gives a worker that joins late a second unit or its shutdown, as the initial
distribution does. A crash then costs one failed test, and the run ends with every other result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController


def requeue(workload: dict[str, dict[str, bool]]) -> tuple[str | None, dict[str, dict[str, bool]]]:
    """(the test a worker died on, the scopes to run again) from its workload {scope: {nodeid: done}}: the first
    unfinished test of its first unfinished scope is the one it was running; it counts as done, and scopes with
    nothing left to run are dropped."""
    crashed = next((nodeid for unit in workload.values() for nodeid, done in unit.items() if not done), None)
    again = {}
    for scope, unit in workload.items():
        left = {nodeid: done or nodeid == crashed for nodeid, done in unit.items()}
        if not all(left.values()):
            again[scope] = left
    return crashed, again


class CrashSafeLoadScope(LoadScopeScheduling):
    """LoadScopeScheduling whose recovery from a dead worker cannot deadlock (see the module docstring)."""

    def remove_node(self, node: WorkerController) -> str | None:
        crashed, again = requeue(self.assigned_work.pop(node))
        if crashed is None:  # a worker that finished its work: nothing to hand out again
            return None
        self.workqueue.update(again)
        for other in self.assigned_work:
            if other in self.registered_collections:  # a replacement still collecting gets work once it has
                self._reschedule(other)
        return crashed

    def schedule(self) -> None:
        joining = self.collection is not None  # a replacement worker: the first distribution is over
        super().schedule()
        if joining:  # a second unit, or shutdown, so a one-test unit can finish (the first distribution's rule)
            for node in self.nodes:
                self._reschedule(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    """--dist loadscope runs on CrashSafeLoadScope; every other mode keeps xdist's own scheduler."""
    if config.getvalue("dist") == "loadscope":
        return CrashSafeLoadScope(config, log)
    return None
