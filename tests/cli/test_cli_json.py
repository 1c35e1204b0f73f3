"""`--json` on every command (the keys docs/cli-json.md documents), live progress, and a pipe closed early.

Each command runs as a user runs it (a subprocess of the installed CLI) on the toy kernel, so these stay fast.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.hub_server import cli_command, hub_env, running_server
from tests.toy_folder import TOY

ROOT = Path(__file__).resolve().parents[2]

#: The documented keys (docs/cli-json.md), the spec these tests hold the CLI to.
KEYS = {
    "list": {"registry", "registry_origin", "kernels"},
    "info": {"repo_id", "source", "metadata", "refs", "variants_commit", "variants"},
    "resolve": {"repo_id", "source", "version", "commit", "ref", "reason", "framework", "system", "variants",
                "chosen"},
    "download": {"repo_id", "version", "commit", "variant", "package_dir", "files", "verified"},
    "validate": {"repo_id", "version", "commit", "variant", "backend", "jax_version", "libtpu_version",
                 "generations", "seed", "passed", "cases"},
    "lock": {"path", "kernels"},
    "publish": {"repo_id", "version", "commit", "tag", "branch", "branch_moved", "variants", "unchanged",
                "validated", "summary"},
    "report": {"out_dir", "report_json", "index_html", "seconds", "seed", "headline"},
}
CASE_KEYS = {"name", "dtype", "implementation", "mode", "passed", "max_error", "tolerance", "seconds",
             "first_call_seconds", "compile_seconds", "warm_runs", "tags", "error", "kind", "generation", "cached"}
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, env=env, timeout=300)


def json_of(out: subprocess.CompletedProcess, command: str) -> dict:
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr  # progress stays off stderr when it is not a terminal
    data = json.loads(out.stdout)  # the whole of stdout is one document
    assert KEYS[command] <= set(data), KEYS[command] - set(data)
    return data


def all_keys(value: object) -> set[str]:
    """Every key at any depth of a JSON value (values of free-form maps included: none here)."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


def test_docs_list_every_documented_key():
    doc = (ROOT / "docs" / "cli-json.md").read_text()
    for command, keys in KEYS.items():
        line = next(ln for ln in doc.splitlines() if ln.startswith(f"| `{command}"))
        assert all(f"`{k}`" in line for k in keys), (command, [k for k in keys if f"`{k}`" not in line])


def test_list_info_resolve(toy_registry):
    reg = ("--registry", str(toy_registry))
    data = json_of(run(*reg, "list", "--json"), "list")
    assert [k["repo_id"] for k in data["kernels"]] == ["test-org/toy-scale"]

    data = json_of(run(*reg, "info", "test-org/toy-scale", "--json"), "info")
    assert data["metadata"]["version"] == "1.2.0" and data["metadata"]["files"] >= 1
    assert {v["name"] for v in data["variants"]} >= {"jax-cpu", "jax-tpu", "torch-cpu"}
    assert {"name", "kind", "commit"} == set(data["refs"][0])
    assert all(SNAKE.match(k) for k in all_keys(data))

    data = json_of(run(*reg, "resolve", "test-org/toy-scale", "--backend", "tpu", "--tpu-generation", "v6e",
                       "--json"), "resolve")
    assert data["chosen"] == "jax-tpu" and data["system"]["tpu_generation"] == "v6e"
    verdicts = {v["variant"]: v["accepted"] for v in data["variants"]}
    assert verdicts["jax-tpu"] is True and verdicts["torch-cpu"] is False
    out = run(*reg, "resolve", "test-org/toy-scale", "--backend", "tpu", "--tpu-generation", "v4", "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["chosen"] is None  # no fit: still one document


def test_download_and_lock(toy_registry, tmp_path):
    reg = ("--registry", str(toy_registry))
    data = json_of(run(*reg, "download", "test-org/toy-scale", "--backend", "cpu", "--json"), "download")
    assert data["variant"] == "jax-cpu" and data["files"] == 4 and data["verified"] is True
    assert Path(data["package_dir"], "__init__.py").is_file()

    lock = tmp_path / "kernel-hub.lock"
    data = json_of(run(*reg, "lock", "test-org/toy-scale", "--backend", "cpu", "-o", str(lock), "--json",
                       "--trust-remote-code"), "lock")
    assert data["path"] == str(lock) and lock.is_file()
    (k,) = data["kernels"]
    assert k["repo_id"] == "test-org/toy-scale" and k["variant"] == "jax-cpu" and k["files"] == 4


def test_validate_json_records_the_seed_and_timings():
    first = json_of(run("validate", "--path", str(TOY), "--backend", "cpu", "--seed", "11", "--json"), "validate")
    assert first["seed"] == 11 and first["passed"] is True
    case = first["cases"][0]
    assert set(case) >= CASE_KEYS
    assert case["first_call_seconds"] >= 0 and case["warm_runs"] >= 1 and case["mode"] == "auto"
    again = json_of(run("validate", "--path", str(TOY), "--backend", "cpu", "--seed", "11", "--json"), "validate")
    other = json_of(run("validate", "--path", str(TOY), "--backend", "cpu", "--seed", "12", "--json"), "validate")
    # the seed decides the inputs: the same seed gives the same errors, another seed other inputs
    assert [c["max_error"] for c in again["cases"]] == [c["max_error"] for c in first["cases"]]
    assert other["cases"][0]["max_error"] != first["cases"][0]["max_error"]
    drawn = json_of(run("validate", "--path", str(TOY), "--backend", "cpu", "--json"), "validate")
    assert isinstance(drawn["seed"], int)  # no --seed: one is drawn, and recorded


def test_validate_table_has_seed_and_live_rows_on_a_pipe():
    out = run("validate", "--path", str(TOY), "--backend", "cpu", "--seed", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "seed 5" in lines[0]
    assert lines[1].split()[:3] == ["case", "dtype", "mode"] and "first s" in lines[1] and "warm s" in lines[1]
    assert lines[2].startswith("small_f32") and lines[2].rstrip().endswith("pass")
    assert lines[-1] == "2/2 cases passed: PASSED"
    assert "\x1b[" not in out.stdout  # plain lines, no terminal codes


def test_validate_on_a_terminal_shows_rich_progress():
    """On a terminal the rows come through rich (styled, with a live bar that is cleared at the end)."""
    primary, secondary = pty.openpty()
    env = dict(os.environ, COLUMNS="160", TERM="xterm-256color")
    proc = subprocess.Popen([*cli_command(), "validate", "--path", str(TOY), "--backend", "cpu", "--seed", "3"],
                            stdin=secondary, stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    chunks, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1.0)
        if ready:
            try:
                data = os.read(primary, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(primary)
    assert proc.wait(timeout=30) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "small_f32" in text and "2/2 cases passed: PASSED" in text and "seed 3" in text
    assert "\x1b[" in text  # rich drew on the terminal (cursor moves for the live bar)


def test_publish_json(tmp_path):
    with running_server(tmp_path / "store", token="tok") as srv:
        env = hub_env(srv, tmp_path / "cache", HF_TOKEN="tok")
        out = run("publish", str(TOY), "--repo", "acme/json-toy", "--skip-validation", "--skip-tpu-compile", "--json",
                  env=env)
        data = json_of(out, "publish")
    assert data["repo_id"] == "acme/json-toy" and data["tag"] == "v1.2.0" and data["unchanged"] is False
    assert "torch-cpu" in data["variants"] and data["summary"].startswith("published acme/json-toy v1.2.0")


def test_report_json_with_every_section_skipped(tmp_path):
    data = json_of(run("report", "--out", str(tmp_path / "r"), "--skip", "validation,compile,families,benches",
                       "--seed", "9", "--json"), "report")
    assert data["seed"] == 9 and Path(data["report_json"]).is_file() and Path(data["index_html"]).is_file()
    assert data["headline"]["total"] == 0
    assert json.loads(Path(data["report_json"]).read_text())["environment"]["seed"] == 9
    out = run("report", "--out", str(tmp_path / "r"), "--skip", "benchmarks")
    assert out.returncode == 1 and "--skip takes validation, compile, families, benches" in out.stderr


@pytest.mark.parametrize("args", [
    ("list", "--json"),
    ("validate", "--path", str(TOY), "--backend", "cpu", "--json"),
    ("validate", "--path", str(TOY), "--backend", "cpu"),  # live rows into a closed pipe
])
def test_pipe_closed_early_exits_quietly(args):
    """`kernel-hub validate --json | head -1`: the reader is gone before the command writes."""
    proc = subprocess.Popen([*cli_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves at once: every write the command makes hits a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert stderr == "", stderr  # no traceback, no "Exception ignored ... BrokenPipeError"


def test_json_documents_have_snake_case_keys(toy_registry):
    reg = ("--registry", str(toy_registry))
    for args, command in ((("list", "--json"), "list"),
                          (("resolve", "test-org/toy-scale", "--backend", "cpu", "--json"), "resolve"),
                          (("download", "test-org/toy-scale", "--backend", "cpu", "--json"), "download")):
        data = json_of(run(*reg, *args), command)
        keys = all_keys(data)
        assert all(SNAKE.match(k) for k in keys), sorted(k for k in keys if not SNAKE.match(k))
