"""The suite's run order (tests/schedule.py): heaviest scopes first, each scope whole, weights read from a real
`--durations=0` report, and every recorded scope still a module or class of the tree."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import schedule

ROOT = Path(__file__).resolve().parents[2]


def test_scope_is_the_module_or_the_class() -> None:
    assert schedule.scope_of("tests/a/test_x.py::test_one[p-1]") == "tests/a/test_x.py"
    assert schedule.scope_of("tests/a/test_x.py::TestC::test_two") == "tests/a/test_x.py::TestC"


def test_heaviest_scopes_run_first_and_the_rest_keep_their_order() -> None:
    ids = ["a.py::t1", "b.py::t1", "c.py::K::t1", "a.py::t2", "d.py::t1", "c.py::K::t2", "b.py::t2"]
    weights = {"c.py::K": 90.0, "b.py": 50.0, "unknown.py": 500.0}
    got = [ids[i] for i in schedule.heaviest_first(ids, weights)]
    assert got == ["c.py::K::t1", "c.py::K::t2", "b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "d.py::t1"]
    assert [ids[i] for i in schedule.heaviest_first(ids, {})] == ids


def test_weights_sum_a_scopes_phases_from_a_durations_report() -> None:
    report = [
        "============================== slowest durations ===============================",
        "60.50s call     tests/x/test_a.py::test_one[p]",
        "12.25s setup    tests/x/test_a.py::test_one[p]",
        "30.00s call     tests/x/test_b.py::TestK::test_two",
        "15.00s teardown tests/x/test_b.py::TestK::test_two",
        "39.90s call     tests/x/test_c.py::test_light",
        "(2 durations < 0.005s hidden.  Use -vv to show these durations.)",
        "99.00s something else entirely",
    ]
    got = schedule.scope_seconds(report)
    assert got == {"tests/x/test_a.py": 72.8, "tests/x/test_b.py::TestK": 45.0}
    assert list(got) == ["tests/x/test_a.py", "tests/x/test_b.py::TestK"]


def test_a_missing_or_broken_weights_file_keeps_file_order(tmp_path: Path) -> None:
    assert schedule.load(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert schedule.load(tmp_path / "bad.json") == {}
    (tmp_path / "list.json").write_text("[1, 2]")
    assert schedule.load(tmp_path / "list.json") == {}


def test_every_recorded_scope_is_still_in_the_tree() -> None:
    """A renamed module or class leaves its weight behind and runs unweighted: the file must follow renames."""
    weights = schedule.load()
    assert weights, f"{schedule.SECONDS_FILE} is empty"
    for scope in weights:
        path, _, cls = scope.partition("::")
        assert (ROOT / path).is_file(), f"{scope}: no such test module"
        if cls:
            tree = ast.parse((ROOT / path).read_text())
            classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
            assert cls in classes, f"{scope}: no class {cls} in {path}"
