"""A worker process that dies mid-run: its test runs once more on a fresh worker and fails if it kills that one too;
the run goes on, runs everything else once, and ends (pytest-xdist 3.8.0's own loadscope deadlocks here;
tests/crash_safe_scheduling.py says why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.client_env import child_env
from tests.crash_safe_scheduling import crash_lines, requeue

ROOT = Path(__file__).resolve().parents[2]


def test_requeue_drops_finished_scopes_and_counts_the_crashed_test_done() -> None:
    workload = {"a.py": {"a.py::t1": True, "a.py::t2": True},
                "b.py": {"b.py::t1": True, "b.py::crash": False, "b.py::after": False},
                "c.py": {"c.py::t1": False}}
    crashed, again = requeue(workload)
    assert crashed == "b.py::crash"
    assert again == {"b.py": {"b.py::t1": True, "b.py::crash": True, "b.py::after": False},
                     "c.py": {"c.py::t1": False}}
    assert requeue({"a.py": {"a.py::t1": True}}) == (None, {})
    assert requeue({"b.py": {"b.py::only": False}}) == ("b.py::only", {})


def test_requeue_for_a_rerun_keeps_the_crashed_test_to_run() -> None:
    workload = {"a.py": {"a.py::t1": True}, "b.py": {"b.py::t1": True, "b.py::crash": False, "b.py::after": False}}
    crashed, again = requeue(workload, rerun=True)
    assert crashed == "b.py::crash"
    assert again == {"b.py": {"b.py::t1": True, "b.py::crash": False, "b.py::after": False}}
    assert requeue({"b.py": {"b.py::only": False}}, rerun=True) == ("b.py::only", {"b.py": {"b.py::only": False}})
    first, second = crash_lines([("gw1", "b.py::crash", True), ("gw2", "b.py::crash", False)])
    assert first.startswith("gw1 ") and "b.py::crash" in first and "again" in first and "failed" not in first
    assert second.startswith("gw2 ") and "b.py::crash" in second and "failed" in second and "again" not in second


def _run(folder: Path) -> tuple[int, str]:
    # its own --basetemp (a dot folder: not collected), so the inner session's exit does not clear out older
    # /tmp/pytest-of-<user> folders (earlier runs' wheel venvs among them) inside this test
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.crash_safe_scheduling", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder", "-o", "addopts=",
         "--basetemp", str(folder / ".basetemp"), str(folder)],
        cwd=folder, env=child_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_a_crashed_worker_fails_one_test_and_the_run_ends(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (tmp_path / "test_b.py").write_text("import os\n\ndef test_crash():\n    os._exit(1)\n\n"
                                        "def test_after():\n    pass\n")
    (tmp_path / "test_c.py").write_text("def test_alone():\n    pass\n")
    (tmp_path / "test_d.py").write_text("import os\n\ndef test_crash_alone():\n    os._exit(1)\n")
    code, out = _run(tmp_path)
    assert code == 1, out
    assert "2 failed, 4 passed" in out, out
    assert "test_b.py::test_crash" in out and "test_d.py::test_crash_alone" in out, out
    assert "4 worker crash(es)" in out and out.count("it had killed a worker before: failed") == 2, out



def test_a_worker_finishing_after_a_crash_leaves_the_collecting_replacement_alone(tmp_path: Path) -> None:
    # Both workers are told to shut down once the first distribution empties the queue. One crashes, its last test
    # goes back on the queue and a replacement starts collecting (slowed down here); the other ends its session
    # while the replacement still collects. That worker's removal must not hand work to the replacement before
    # its collection arrives (xdist raised KeyError there and left the requeued tests unrun).
    (tmp_path / "conftest.py").write_text(
        "import os\nimport time\nfrom pathlib import Path\n\n"
        "MARK = Path(__file__).parent / 'crashed'\n\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    if MARK.exists():\n        time.sleep(4)\n\n"
        "def pytest_sessionfinish(session):\n"
        "    if os.environ.get('PYTEST_XDIST_WORKER'):\n        time.sleep(4)\n")
    (tmp_path / "test_a.py").write_text(
        "import os\nimport time\nfrom pathlib import Path\n\n"
        "def test_first():\n    time.sleep(1.5)\n\n"
        "def test_crash():\n    (Path(__file__).parent / 'crashed').touch()\n    os._exit(1)\n\n"
        "def test_after_the_crash():\n    pass\n")
    (tmp_path / "test_b.py").write_text("def test_quick():\n    pass\n")
    code, out = _run(tmp_path)
    assert "INTERNALERROR" not in out, out
    assert code == 1, out
    assert "1 failed, 3 passed" in out, out


def test_a_test_that_passes_on_a_fresh_worker_after_a_crash_passes(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import os\nfrom pathlib import Path\n\n"
        "def test_before():\n    pass\n\n"
        "def test_crashes_once():\n    mark = Path(__file__).parent / 'crashed'\n"
        "    if not mark.exists():\n        mark.touch()\n        os._exit(1)\n\n"
        "def test_after():\n    pass\n")
    (tmp_path / "test_b.py").write_text("def test_other():\n    pass\n")
    code, out = _run(tmp_path)
    assert code == 0, out
    assert "4 passed" in out and "failed" not in out, out
    assert "1 worker crash(es)" in out and "died running test_a.py::test_crashes_once: it runs again" in out, out


def test_two_workers_dying_together_both_get_replaced_and_the_run_ends(tmp_path: Path) -> None:
    # Each worker dies once, a second apart; the first replacement finishes collecting while the second still
    # collects (slowed down here). The first one's arrival must not hand work to the second before its collection
    # does (xdist's own loop raised KeyError there: an INTERNALERROR that ended the whole run).
    (tmp_path / "conftest.py").write_text(
        "import time\nfrom pathlib import Path\n\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    if any(Path(__file__).parent.glob('crashed_*')):\n        time.sleep(3)\n")
    for name, delay in (("a", 0), ("b", 1)):
        (tmp_path / f"test_{name}.py").write_text(
            "import os\nimport time\nfrom pathlib import Path\n\n"
            f"def test_{name}_dies_once():\n    mark = Path(__file__).parent / 'crashed_{name}'\n"
            f"    if not mark.exists():\n        time.sleep({delay})\n        mark.touch()\n        os._exit(1)\n\n"
            f"def test_{name}_after():\n    pass\n")
    (tmp_path / "test_c.py").write_text("def test_c_one():\n    pass\n\ndef test_c_two():\n    pass\n")
    code, out = _run(tmp_path)
    assert "INTERNALERROR" not in out, out
    assert code == 0, out
    assert "6 passed" in out and "failed" not in out, out
    assert "2 worker crash(es)" in out and out.count("it runs again on a fresh worker") == 2, out
