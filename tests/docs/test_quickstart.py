"""The README's quickstart is a file that runs: examples/quickstart.py builds its inputs, checks the kernel against
its own NumPy loop and passes three validation cases, in seconds, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.client_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_and_passes():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True,
                          timeout=300, env=child_env(PYTHONPATH=str(ROOT / "src")), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "from local " in proc.stdout  # it says which source served the kernel
    assert "3/3 cases passed" in proc.stdout and "max relative error" in proc.stdout


def test_the_readme_points_at_it():
    readme = (ROOT / "README.md").read_text()
    assert "examples/quickstart.py" in readme
