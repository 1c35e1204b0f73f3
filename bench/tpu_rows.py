"""The one way a bench script runs its TPU half: the script again, with `--in-tpu-env`, in the TPU environment's
Python (libtpu lives there, apart from the ordinary venv), its rows read back as the JSON lines it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows_from_tpu_env(script: str, args: list[str]) -> tuple[list[dict], int]:
    """Run `script --in-tpu-env *args` in the TPU environment.

    Returns:
      (the rows it printed, 0), or ([], its exit status or 1) when it failed or printed none (its stderr's tail is
      printed to stderr then).
    """
    sys.path.insert(0, str(ROOT / "src"))
    from kernel_hub.tpu.env import tpu_env

    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT / "src"), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    done = subprocess.run([str(tpu_env().python), script, "--in-tpu-env", *args], capture_output=True, text=True,
                          env={**os.environ, **env})
    rows = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not rows:
        print(done.stderr[-3000:], file=sys.stderr)
        return [], done.returncode or 1
    return rows, 0
