"""The suite's order: its heaviest scopes first, so the two workers finish together.

`make test` runs pytest-xdist with --dist loadscope --no-loadscope-reorder: each worker takes a whole module (or a
test class) at a time, in collection order. Left in file order, a scope of one long compile that is collected last
runs alone at the end while the other worker idles; started first, it runs beside many short scopes. The weights are
seconds measured on a 2-core machine (scope_seconds.json: the scopes that took 40 s or more), refreshed with

    .venv/bin/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder --durations=0 > run.log
    .venv/bin/python -m tests.schedule run.log

A scope missing from the file keeps its place after the weighted ones; a stale weight only costs balance.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

SECONDS_FILE = Path(__file__).with_name("scope_seconds.json")
#: Scopes lighter than this are left in collection order (sorting them gains nothing measurable).
MIN_SECONDS = 40.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+)")


def scope_of(nodeid: str) -> str:
    """The scope pytest-xdist's loadscope gives a test: its module, or its class when it has one."""
    return nodeid.rsplit("::", 1)[0]


def heaviest_first(nodeids: Sequence[str], seconds: Mapping[str, float]) -> list[int]:
    """Indices of `nodeids` in run order: scopes with a weight first, heaviest first, then the rest; each scope's
    tests keep their own order (a stable sort), so module fixtures are built once."""
    return sorted(range(len(nodeids)), key=lambda i: -seconds.get(scope_of(nodeids[i]), 0.0))


def scope_seconds(log_lines: Iterable[str], min_seconds: float = MIN_SECONDS) -> dict[str, float]:
    """Seconds per scope summed from pytest's `--durations=0` report (setup, call and teardown of each test), the
    scopes of at least `min_seconds`, heaviest first."""
    total: dict[str, float] = defaultdict(float)
    for line in log_lines:
        match = _DURATION.match(line)
        if match:
            total[scope_of(match.group(2))] += float(match.group(1))
    kept = {scope: round(s, 1) for scope, s in total.items() if s >= min_seconds}
    return dict(sorted(kept.items(), key=lambda kv: -kv[1]))


def load(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The recorded weights ({} where the file is missing or unreadable: the suite then runs in file order)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.schedule PYTEST_LOG (a run with --durations=0)", file=sys.stderr)
        return 2
    weights = scope_seconds(Path(argv[0]).read_text().splitlines())
    if not weights:
        print(f"{argv[0]} has no --durations=0 report", file=sys.stderr)
        return 1
    SECONDS_FILE.write_text(json.dumps(weights, indent=1) + "\n")
    print(f"wrote {len(weights)} scopes to {SECONDS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
