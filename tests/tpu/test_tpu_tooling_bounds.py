"""The TPU tooling never trusts the TPU environment's Python to behave: a version probe that floods stdout is cut at a
small cap (the child killed), one that prints JSON other than an object is one clear error, `setup-tpu` stops a pip
that never finishes, and a worker that stops reporting after its hello is stopped after the stall limit, not after
half an hour. Fake Pythons are shell scripts; each call runs in a thread with a guard so a regression fails instead
of hanging."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.tpu import env as tpu_env_module
from kernel_hub.tpu import setup_env
from kernel_hub.tpu.capped_run import run_capped
from kernel_hub.tpu.compile_gate.worker_pool import compile_in_worker
from kernel_hub.tpu.env import TpuEnv, TpuEnvironmentError, probe_answer, tpu_env
from kernel_hub.tpu.worker_client import STALL_ENV, run_worker, stall_seconds
from tests.client_env import child_env

SRC = Path(__file__).resolve().parents[2] / "src"


def _finishes(call, seconds: float = 120.0):
    """(value, error) of `call()` run in a daemon thread; fails the test if it has not returned in `seconds`."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return out.get("value"), out.get("error")


def _fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_probe_that_floods_stdout_is_cut_at_the_cap(tmp_path: Path) -> None:
    """In a child with a memory limit and a timeout: a regression fails here instead of eating the machine."""
    python = _fake_python(tmp_path, "exec yes '{\"jax\": \"0.10.2\", \"libtpu\": \"0.0.52\"}'\n")
    script = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))\n"
              "from kernel_hub.tpu.env import tpu_env, ENV_VAR, TpuEnvironmentError\n"
              "try:\n    tpu_env({ENV_VAR: sys.argv[1]}, checkout=None)\n"
              "except TpuEnvironmentError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(python)], env=child_env(PYTHONPATH=str(SRC)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"printed more than {tpu_env_module.PROBE_MAX_BYTES} bytes" in proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1


def test_run_capped_keeps_at_most_the_cap_and_kills() -> None:
    done = run_capped([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
                      timeout=60, max_bytes=1000)
    assert done.returncode is None and len(done.stdout) == 1000 and "more than 1000 bytes" in done.problem
    quiet = run_capped([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1, max_bytes=10)
    assert quiet.returncode is None and "within 1 s" in quiet.problem
    ok = run_capped([sys.executable, "-c", "print('hi')"], timeout=60, max_bytes=10)
    assert (ok.returncode, ok.stdout, ok.problem) == (0, b"hi\n", None)


@pytest.mark.parametrize("line", ["[1, 2]", "5", '"jax"', "null", '{"jax": 5, "libtpu": "x"}',
                                  '{"jax": "' + "9" * 100 + '"}', "[" * 100_000, ""])
def test_a_probe_answer_that_is_not_an_object_of_versions_is_refused(line: str) -> None:
    with pytest.raises((ValueError, RecursionError)):
        probe_answer((line + "\n").encode())


def test_a_non_object_answer_is_one_environment_error(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "echo '[\"jax\", \"libtpu\"]'\n")
    tpu_env_module._probe.cache_clear()
    _, error = _finishes(lambda: tpu_env({tpu_env_module.ENV_VAR: str(python)}, checkout=None))
    assert isinstance(error, TpuEnvironmentError) and "not an object" in str(error)
    assert probe_answer(b'noise\n{"jax": "0.10.2", "libtpu": null}\n') == ("0.10.2", None)


def test_a_worker_that_hangs_after_hello_is_stopped_at_the_stall_limit(tmp_path: Path) -> None:
    """The fake worker writes its hello event, then hangs: stopped after the stall limit with one clear error."""
    python = _fake_python(tmp_path, 'echo \'{"event": "hello", "jax": "0.10.2", "libtpu": "0.0.52"}\' >> "$4"\n'
                          "echo 'compiler warming up' >&2\nexec sleep 600\n")
    env = TpuEnv(python, "0.10.2", "0.0.52")
    value, error = _finishes(lambda: run_worker(env, {"mode": "compile"}, stall=1.0))
    assert error is None
    events, status, stderr = value
    assert [e["event"] for e in events] == ["hello"] and status == -1
    assert stderr.strip().splitlines()[-1] == f"stopped: no progress for 1 s (set {STALL_ENV} to allow longer)"


def test_the_compile_gate_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = _fake_python(tmp_path, 'echo \'{"event": "hello"}\' >> "$4"\nexec sleep 600\n')
    monkeypatch.setenv(STALL_ENV, "1")

    class Package:
        def request(self) -> dict:
            return {}

    _, error = _finishes(lambda: compile_in_worker(TpuEnv(python, "0", "0"), Package(), ("v5e",)))
    assert isinstance(error, TpuEnvironmentError)
    assert "before compiling anything: stopped: no progress for 1 s" in str(error) and "\n" not in str(error)


def test_a_worker_that_keeps_reporting_runs_past_the_stall_limit(tmp_path: Path) -> None:
    body = "".join(f'sleep 0.4; echo \'{{"event": "row", "i": {i}}}\' >> "$4"\n' for i in range(6))
    python = _fake_python(tmp_path, body + 'echo \'{"event": "done"}\' >> "$4"\n')
    value, error = _finishes(lambda: run_worker(TpuEnv(python, "0", "0"), {"mode": "x"}, stall=1.5))
    assert error is None
    events, status, _ = value
    assert status == 0 and [e.get("i") for e in events if e["event"] == "row"] == list(range(6))


@pytest.mark.parametrize(("raw", "expected"), [("", 300.0), ("45", 45.0), (" 2.5 ", 2.5)])
def test_the_stall_limit_is_configurable(raw: str, expected: float) -> None:
    assert stall_seconds({STALL_ENV: raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "soon", "1e400"])
def test_a_bad_stall_limit_is_one_error(raw: str) -> None:
    with pytest.raises(TpuEnvironmentError, match=STALL_ENV):
        stall_seconds({STALL_ENV: raw})


def test_setup_tpu_stops_a_pip_that_never_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip gets a timeout; running past it is one TpuEnvironmentError (the real subprocess.run kills pip)."""
    target = tmp_path / "env"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").write_text("")
    seen: dict[str, object] = {}

    def slow_pip(command, **kwargs):
        seen.update(kwargs)
        return subprocess.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=kwargs["timeout"])

    _, error = _finishes(lambda: setup_env.setup_tpu(target, run=slow_pip, log=lambda _: None, pip_timeout=1))
    assert seen["timeout"] == 1
    assert isinstance(error, TpuEnvironmentError) and "did not finish within 1 s" in str(error)
    assert "--pip-timeout" in str(error)


def test_setup_tpu_cli_takes_a_pip_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    asked: dict[str, object] = {}

    def fake_setup(target, *, pip_args, pip_timeout):
        asked.update(target=target, pip_timeout=pip_timeout)
        return tmp_path / "python"

    monkeypatch.setattr(setup_env, "setup_tpu", fake_setup)
    assert cli.main(["setup-tpu", "--dir", str(tmp_path / "e"), "--pip-timeout", "90"]) == 0
    assert asked["pip_timeout"] == 90.0
    assert cli.main(["setup-tpu", "--dir", str(tmp_path / "e")]) == 0
    assert asked["pip_timeout"] == setup_env.PIP_TIMEOUT


def test_a_long_compile_step_reports_while_it_runs_and_stops_reporting_after() -> None:
    """worker.working: "working" events at its interval while the step runs (so a compile of minutes is never taken
    for a hang), with the step and the seconds so far; none once the step is over (a hang elsewhere still stalls)."""
    import threading
    import time

    from kernel_hub.tpu.worker_common import working

    seen: list[dict] = []
    lock = threading.Lock()

    def emit(record: dict) -> None:
        with lock:
            seen.append(record)

    with working(emit, {"generation": "v7x", "name": "case"}, every=0.05):
        time.sleep(0.5)
    after = len(seen)
    time.sleep(0.3)
    assert after >= 3 and len(seen) == after  # beats during the step, none after it
    assert all(e["event"] == "working" and e["generation"] == "v7x" and e["name"] == "case" for e in seen)
    times = [e["seconds"] for e in seen]
    assert times == sorted(times) and 0 < times[0] <= times[-1] <= 0.6
    with pytest.raises(ValueError), working(emit, {"name": "failing"}, every=0.05):
        raise ValueError("the compile raised")
    time.sleep(0.2)
    assert all(e["name"] != "failing" or e["seconds"] < 0.2 for e in seen)  # a failing step stops beating too


def test_the_worker_runs_without_a_persistent_compilation_cache(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile-only TPU client cannot read a persistent-cache entry back: the worker never gets the folder, while
    the rest of the caller's environment reaches it."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-cache"))
    monkeypatch.setenv("KH_TEST_MARKER", "kept")
    python = _fake_python(tmp_path, 'printf \'{"event": "env", "cache": "%s", "marker": "%s"}\\n\' '
                                    '"${JAX_COMPILATION_CACHE_DIR-unset}" "$KH_TEST_MARKER" >> "$4"\n')
    value, error = _finishes(lambda: run_worker(TpuEnv(python, "0", "0"), {"mode": "x"}, stall=30))
    assert error is None
    events, status, _ = value
    assert status == 0 and events == [{"event": "env", "cache": "unset", "marker": "kept"}], events
