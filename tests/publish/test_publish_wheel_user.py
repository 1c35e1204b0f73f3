"""Publishing as a wheel user: `kernel-hub setup-tpu` builds the TPU environment where publish finds it with nothing
else set; re-publishing identical content stops before validating or compiling (and different content under the
same version is refused just as early); progress names each stage as it starts and counts cases as they end,
the TPU compiler's included (its events are read while the worker runs)."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.decide.variants import Variant
from kernel_hub.errors import KernelHubError
from kernel_hub.publish import release as publish_module
from kernel_hub.publish.identity import identical_release, record_paths
from kernel_hub.publish.tpu_gate import _GateProgress
from kernel_hub.tpu import setup_env as setup
from kernel_hub.tpu import worker_client
from kernel_hub.tpu.env import TpuEnvironmentError, find_tpu_python
from kernel_hub.ui.progress import Progress
from tests.client_env import child_env
from tests.toy_folder import copy_toy

TOKEN = "wheel-token"


class Recorder(Progress):
    """Every progress call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def phase(self, description: str, total: int | None = None, *, announce: bool = True) -> None:
        self.calls.append(("phase", description, total))

    def advance(self, steps: int = 1) -> None:
        self.calls.append(("advance", steps))


# -- setup-tpu ------------------------------------------------------------------------------------------------
def test_the_plan_takes_the_installed_jax_with_its_tpu_extra(tmp_path: Path) -> None:
    plan = setup.plan_setup(tmp_path / "env", "0.10.2")
    assert plan.install[0] == "jax[tpu]==0.10.2" and set(setup.WORKER_DEPENDS) <= set(plan.install)
    assert plan.python == tmp_path / "env" / "bin" / "python"
    bare = setup.plan_setup(tmp_path / "env", None)
    assert bare.install[0] == f"jax[tpu]=={setup.TESTED_JAX}" and "no jax installed" in bare.jax_reason
    [command] = plan.commands(["--find-links=/w"])
    assert command[:4] == [str(plan.python), "-m", "pip", "install"] and "--find-links=/w" in command


def test_setup_builds_links_kernel_hub_and_is_found_by_default(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A real venv (without pip: the fake pip below stands in for the ~700 MB download) at the default place;
    kernel_hub imports there through the link, and find_tpu_python takes it with nothing set."""
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "cache"))
    builder = venv.EnvBuilder
    monkeypatch.setattr(setup.venv, "EnvBuilder", lambda **kw: builder(**{**kw, "with_pip": False}))
    asked: list[list[str]] = []

    def fake_pip(command, **kwargs):
        asked.append(command)
        site = next(Path(command[0]).parents[1].glob("lib/python*/site-packages"))
        for dist, version in (("jax", "0.10.2"), ("libtpu", "0.0.52")):
            info = site / f"{dist}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    with pytest.raises(TpuEnvironmentError, match="kernel-hub setup-tpu"):
        find_tpu_python({}, checkout=None)
    lines: list[str] = []
    python = setup.setup_tpu(run=fake_pip, log=lines.append)
    target = tmp_path / "cache" / "tpu-env"
    assert python == target / "bin" / "python" and len(asked) == 1 and "jax[tpu]==" in " ".join(asked[0])
    assert find_tpu_python({}, checkout=None) == python
    assert lines[0].startswith(f"TPU environment: {target}") and lines[-1].startswith("ready:")
    where = subprocess.run([str(python), "-c", "import kernel_hub, json; print(json.dumps(kernel_hub.__file__))"],
                           capture_output=True, text=True, timeout=60,
                           env=child_env({"PATH": "/usr/bin:/bin"}))  # no PYTHONPATH: only the link finds it
    assert where.returncode == 0, where.stderr
    ours = Path(setup.__file__).resolve().parents[1]
    assert Path(json.loads(where.stdout)).resolve().parent == ours

    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "Collecting jax\nERROR: No matching distribution\n")

    with pytest.raises(TpuEnvironmentError, match="failed \\(exit 1\\): ERROR: No matching distribution"):
        setup.setup_tpu(run=failing_pip, log=lambda _: None)


def test_setup_tpu_dry_run_builds_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["setup-tpu", "--dir", str(tmp_path / "env"), "--dry-run", "--pip-arg=--no-index"]) == 0
    out = capsys.readouterr().out
    assert f"would build {tmp_path / 'env'}" in out and "pip install" in out and "--no-index" in out
    assert not (tmp_path / "env").exists()


# -- identical content before validating ----------------------------------------------------------------------
def test_identical_release_compares_everything_but_the_compile_record() -> None:
    tpu, cpu = Variant("jax-tpu", "jax", "tpu"), Variant("jax-cpu", "jax", "cpu")
    ignore = record_paths([tpu, cpu])
    assert ignore == {"build/jax-tpu/metadata.json", publish_module.fmt.bundle_path("jax-tpu")}
    local = {"build/jax-cpu.tar": "a", publish_module.fmt.bundle_path("jax-tpu"): "record-1"}
    assert identical_release(local, {**local, publish_module.fmt.bundle_path("jax-tpu"): "record-2"}, ignore)[0]
    same, reason = identical_release(local, {**local, "build/jax-cpu.tar": "b"}, ignore)
    assert not same and reason == "build/jax-cpu.tar differs"
    same, reason = identical_release(local, {"build/jax-cpu.tar": "a", "build/x": "c"}, ignore)
    assert not same and reason == "build/x is only in the published release"
    assert identical_release(local, {}, ignore)[0] is False
    only_tpu = {publish_module.fmt.bundle_path("jax-tpu"): "record-1"}  # nothing left to compare: cannot tell
    assert identical_release(only_tpu, {publish_module.fmt.bundle_path("jax-tpu"): "record-2"}, ignore)[0] is None


def test_republishing_stops_before_validating_and_progress_starts_at_once(server, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    repo = "acme/wheel-toy"
    live = Recorder()
    first = publish_module.publish(copy_toy(tmp_path / "a"), repo_id=repo, endpoint=server.url, token=TOKEN,
                                   skip_tpu_compile=True, log=lambda _: None, progress=live)
    assert not first.unchanged and first.validated
    phases = [c for c in live.calls if c[0] == "phase"]
    assert phases[0][1] == f"checking {repo} at {server.url}"  # said before any slow step
    validating = [c for c in phases if c[1].startswith("validating ")]
    assert validating and all(isinstance(c[2], int) and c[2] > 0 for c in validating)
    assert live.calls.count(("advance", 1)) == sum(c[2] for c in validating)  # one step per finished case
    assert phases[-1][1] == f"uploading {repo} v1.2.0"

    def no_work(*args, **kwargs):
        raise AssertionError("validated or compiled although the release is already published")

    monkeypatch.setattr(publish_module, "validate_local", no_work)
    monkeypatch.setattr(publish_module, "run_gate", no_work)
    server.reset()
    lines: list[str] = []
    # no TPU environment and no --skip-tpu-compile: an unchanged release needs neither
    monkeypatch.setenv("KERNEL_HUB_TPU_PYTHON", str(tmp_path / "no-python"))
    same = publish_module.publish(copy_toy(tmp_path / "b"), repo_id=repo, endpoint=server.url, token=TOKEN,
                                  log=lines.append)
    assert same.unchanged and same.commit == first.commit and not same.validated
    assert "nothing to do" in same.summary() and any("not validating or compiling again" in ln for ln in lines)
    assert not [r for r in server.requests() if r[0] == "POST"]  # nothing written
    with pytest.raises(KernelHubError, match=r"already published with different content \(build/\S+ differs\); bump"):
        publish_module.publish(copy_toy(tmp_path / "c", ops_extra="\n# changed\n"), repo_id=repo, endpoint=server.url,
                               token=TOKEN, skip_tpu_compile=True, log=lambda _: None)


# -- the TPU compiler's progress ---------------------------------------------------------------------------------
def test_gate_progress_counts_every_case_of_every_generation() -> None:
    live = Recorder()
    hook = _GateProgress(live, "TPU compile gate (v5e, v6e)", 2)
    for event in ({"event": "hello"}, {"event": "cases", "names": ["a", "b", "c"]},
                  {"event": "cases", "names": ["a", "b", "c"]}, *[{"event": "start"}, {"event": "result"}] * 6):
        hook(event)
    assert live.calls[0] == ("phase", "TPU compile gate (v5e, v6e): compiling", 6)  # counted once, both workers
    assert live.calls[1:] == [("advance", 1)] * 6


def test_worker_events_arrive_while_the_worker_still_runs(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    child = ("import json, sys, time\n"
             "with open(sys.argv[1], 'a') as f: f.write(json.dumps({'event': 'cases', 'names': ['a']}) + '\\n')\n"
             "time.sleep(3)\n"
             "with open(sys.argv[1], 'a') as f: f.write(json.dumps({'event': 'done'}) + '\\n')\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(events)])
    seen: list[tuple[str, bool]] = []
    assert worker_client._follow(proc, events, lambda e: seen.append((e["event"], proc.poll() is None)), timeout=60,
                                 stall=60) is None  # None: it ended by itself
    assert seen == [("cases", True), ("done", False)]  # the first while it ran, the last after it ended
