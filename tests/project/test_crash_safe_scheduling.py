"""A worker process that dies mid-run costs one failed test: the run goes on, runs everything else once, and ends
(pytest-xdist 3.8.0's own loadscope deadlocks here; tests/crash_safe_scheduling.py says why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.client_env import child_env
from tests.crash_safe_scheduling import requeue

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


def test_a_crashed_worker_fails_one_test_and_the_run_ends(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (tmp_path / "test_b.py").write_text("import os\n\ndef test_crash():\n    os._exit(1)\n\n"
                                        "def test_after():\n    pass\n")
    (tmp_path / "test_c.py").write_text("def test_alone():\n    pass\n")
    (tmp_path / "test_d.py").write_text("import os\n\ndef test_crash_alone():\n    os._exit(1)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.crash_safe_scheduling", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder", "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path, env=child_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 4 passed" in out, out
    assert "test_b.py::test_crash" in out and "test_d.py::test_crash_alone" in out, out



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
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.crash_safe_scheduling", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder", "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path, env=child_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert "INTERNALERROR" not in out, out
    assert done.returncode == 1, out
    assert "1 failed, 3 passed" in out, out
