"""Run a test worker script in a subprocess with N simulated CPU devices (XLA's host-platform device count), so the
test process itself keeps its one device; the worker prints one JSON object as its last line of output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_worker(script: str, devices: int = 8, timeout: int = 900) -> Any:
    """The JSON a worker in tests/ printed last, run on `devices` simulated devices; AssertionError with its stderr's
    tail when it fails."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    done = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
