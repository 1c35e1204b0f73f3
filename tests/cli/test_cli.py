"""The CLI: --help everywhere, non-zero exits, one line (no traceback) for user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

COMMANDS = ["list", "info", "resolve", "download", "validate", "bench", "demo", "serve", "publish", "lock", "report",
            "init"]


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kernel_hub.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_top_level_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in COMMANDS:
        assert command in out.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help(command):
    out = run(command, "--help")
    assert out.returncode == 0 and "usage: kernel-hub " + command in out.stdout


def _one_line_error(out):
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def test_list_shows_the_registry(toy_registry):
    out = run("--registry", str(toy_registry), "list", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert data["registry"] == str(toy_registry) and data["registry_origin"] == "$KERNEL_HUB_REGISTRY"
    assert data["kernels"] == [{"repo_id": "test-org/toy-scale", "default_spec": ">=1.0,<2", "source_version": "1.2.0",
                                "backends": ["cpu"], "layers": [], "bench": None}]


def test_resolve_prints_trace_for_simulated_tpu(toy_registry):
    out = run("--registry", str(toy_registry), "resolve", "test-org/toy-scale", "--backend", "tpu",
              "--tpu-generation", "v6e")
    assert out.returncode == 0, out.stderr
    assert "chosen    jax-tpu" in out.stdout and "reject torch-cpu" in out.stdout.replace("  ", " ")


def test_resolve_no_fit_exits_nonzero(toy_registry):
    out = run("--registry", str(toy_registry), "resolve", "test-org/toy-scale", "--backend", "tpu",
              "--tpu-generation", "v4")
    assert out.returncode == 1 and "TPU v4 not among v5e, v6e" in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("resolve", "test-org/unknown"), "pass version= or revision="),
        (("resolve", "test-org/unknown", "--version", "1"), "Hub at http://127.0.0.1:9: listing refs"),
        (("resolve", "test-org/toy-scale", "--version", ">=1,,"), "not a PEP 440 specifier"),
        (("resolve", "test-org/toy-scale", "--version", ">=9"), "no release matches"),
        (("info", "bad"), "ORG/NAME"),
    ],
)
def test_user_errors_are_one_line(toy_registry, args, needle):
    # A repo outside the registry goes to the Hub: point it at a closed loopback port.
    env = dict(os.environ)  # HF_ENDPOINT is a closed loopback port (conftest)
    line = _one_line_error(run("--registry", str(toy_registry), *args, env=env))
    assert needle in line


def test_malformed_registry_is_one_line(tmp_path):
    bad = tmp_path / "registry.yaml"
    bad.write_text("kernels: [\n")
    line = _one_line_error(run("--registry", str(bad), "list"))
    assert "malformed YAML" in line


def test_validate_local_kernel_path(toy_kernel):
    out = run("validate", "--path", str(toy_kernel), "--backend", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["passed"] is True


def test_download_fetches_and_checks(toy_registry):
    out = run("--registry", str(toy_registry), "download", "test-org/toy-scale", "--backend", "cpu")
    assert out.returncode == 0, out.stderr
    assert "[jax-cpu]" in out.stdout and "files     4 (sha256 checked)" in out.stdout


def test_bench_without_script_is_one_line(toy_registry):
    line = _one_line_error(run("--registry", str(toy_registry), "bench", "test-org/toy-scale"))
    assert "no benchmark script" in line


def test_help_stays_light():
    code = ("import sys\nfrom kernel_hub import cli\nassert cli.main(['--help']) == 0\n"
            "print(sorted(m for m in ('jax', 'torch', 'transformers', 'huggingface_hub', 'numpy', 'starlette') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_cli_code_lives_in_the_cli_package_only():
    import ast
    from pathlib import Path

    import kernel_hub

    root = Path(kernel_hub.__file__).parent
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "cli":  # the kernel_hub.cli package
            continue
        names = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not {n for n in names if n.startswith("cmd_") or n in ("add_parser", "add_parsers")}, path
