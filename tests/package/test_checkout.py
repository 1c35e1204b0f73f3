"""'The checkout' only when kernel_hub runs from one: an installed package never uses what lies near it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kernel_hub
from kernel_hub.package.checkout import checkout_decision

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(kernel_hub.__file__).resolve().parent

_PROBE = r"""
import json, subprocess, sys
from pathlib import Path
import kernel_hub
from kernel_hub.package.checkout import checkout_decision
from kernel_hub.tpu import env, worker_client
from kernel_hub.report import benches, environment
from kernel_hub.load.registry import registry_location

out = {"package": str(Path(kernel_hub.__file__).resolve().parent), "checkout": str(checkout_decision().root),
       "reason": checkout_decision().reason, "env_checkout": str(env.CHECKOUT), "bench_dir": str(benches.BENCH_DIR),
       "git": list(environment.git_commit()),
       "registry": registry_location({}).origin}
try:
    out["tpu_python"] = str(env.find_tpu_python({}))
except env.TpuEnvironmentError as exc:
    out["tpu_python"] = None
seen = {}
def fake_run(cmd, child_env, *rest):
    seen["pythonpath"] = child_env.get("PYTHONPATH")
    return [], 0, ""
worker_client._run = fake_run
worker_client.run_worker(env.TpuEnv(Path(sys.executable), "0", "0"), {"mode": "noop"})
out["worker_pythonpath"] = seen["pythonpath"]
print(json.dumps(out))
"""


def _plant_checkout_look_alike(top: Path) -> None:
    """Everything a checkout has, at DIR/.. of a `pip install --target DIR`: each would run if taken for one."""
    python = top / ".venv-tpu" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho planted >&2\nexit 7\n")
    python.chmod(0o755)
    (top / "bench").mkdir()
    (top / "bench" / "x.py").write_text("raise SystemExit('planted bench ran')\n")
    worker = top / "src" / "kernel_hub" / "tpu" / "worker.py"
    worker.parent.mkdir(parents=True)
    worker.write_text("raise SystemExit('planted worker ran')\n")
    (top / "pyproject.toml").write_text('[project]\nname = "kernel-hub"\nversion = "0"\n')
    (top / "registry.yaml").write_text("kernels: []\n")
    (top / "kernels" / "pallas" / "ragged_dot").mkdir(parents=True)
    (top / ".git").mkdir()


def test_an_install_with_target_never_uses_a_planted_checkout_beside_it(tmp_path: Path) -> None:
    top = tmp_path / "top"
    site = top / "site"  # pip install --target top/site: top is DIR/..
    shutil.copytree(PACKAGE, site / "kernel_hub", ignore=shutil.ignore_patterns("__pycache__"))
    _plant_checkout_look_alike(top)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_HUB_", "HF_"))}
    env["PYTHONPATH"] = str(site)
    env["HF_HUB_DISABLE_UPDATE_CHECK"] = "1"
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["package"] == str((site / "kernel_hub").resolve())  # the copy ran, not this tree
    assert out["checkout"] == "None" and out["env_checkout"] == "None", out
    assert out["bench_dir"] == "None"
    assert out["tpu_python"] is None  # the planted .venv-tpu/bin/python is not found
    assert out["git"] == [None, None]
    assert out["registry"] == "embedded"
    planted_src = str(top / "src")
    assert not out["worker_pythonpath"] or planted_src not in out["worker_pythonpath"].split(os.pathsep)
    assert str(site) in (out["worker_pythonpath"] or "")  # what the parent had, no more


def _src_layout(root: Path, *, name: str = "kernel-hub", marker: str | None = "kernels/pallas") -> Path:
    package = root / "src" / "kernel_hub"
    package.mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    if marker:
        (root / marker).mkdir(parents=True)
    return package


def test_a_src_layout_with_the_markers_is_a_checkout(tmp_path: Path) -> None:
    assert checkout_decision(_src_layout(tmp_path / "a")).root == (tmp_path / "a").resolve()
    assert checkout_decision(_src_layout(tmp_path / "b", marker=".git")).root == (tmp_path / "b").resolve()


def test_each_missing_marker_is_refused_with_its_reason(tmp_path: Path) -> None:
    other = checkout_decision(_src_layout(tmp_path / "a", name="something-else"))
    assert other.root is None and "something-else" in other.reason
    bare = checkout_decision(_src_layout(tmp_path / "b", marker=None))
    assert bare.root is None and ".git" in bare.reason
    broken = _src_layout(tmp_path / "c")
    (tmp_path / "c" / "pyproject.toml").write_text("[project\n")
    assert checkout_decision(broken).root is None
    not_src = tmp_path / "d" / "lib" / "kernel_hub"
    not_src.mkdir(parents=True)
    assert checkout_decision(not_src).root is None


def test_this_tree_is_a_checkout() -> None:
    assert checkout_decision().root == ROOT


def test_a_fifo_or_odd_pyproject_is_no_checkout_and_never_hangs(tmp_path: Path) -> None:
    """checkout_decision runs at import: a FIFO or a `project = 5` pyproject beside src/ reads as no checkout."""
    import os

    root = tmp_path / "root"
    (root / "src" / "kernel_hub").mkdir(parents=True)
    (root / ".git").mkdir()
    os.mkfifo(root / "pyproject.toml")
    script = ("import sys\nfrom pathlib import Path\nfrom kernel_hub.package.checkout import checkout_decision\n"
              "print(checkout_decision(Path(sys.argv[1])).root)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", script, str(root / "src" / "kernel_hub")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr
    (root / "pyproject.toml").unlink()
    for body in ("project = 5\n", "x = " + "[" * 100_000 + "]" * 100_000 + "\n", 'n = ' + "9" * 5000 + "\n"):
        (root / "pyproject.toml").write_text(body)
        assert checkout_decision(root / "src" / "kernel_hub").root is None
    (root / "pyproject.toml").write_text('[project]\nname = "kernel-hub"\n')
    assert checkout_decision(root / "src" / "kernel_hub").root == root.resolve()
