"""Every bad input to the CLI is one line on stderr and a non-zero exit, never a traceback: bad arguments to every
command, bad registries, kernel.yaml files, lock files, repo ids, specs and paths. Each row also names a word of
the message, so a row cannot pass on the generic fallback for unexpected errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub import cli
from tests.toy_folder import copy_toy

HASH = "ab" * 32
COMMIT = "cd" * 20
VARIANT = {"name": "jax-cpu", "framework": "jax", "backend": "cpu", "entry": "__init__.py", "tpu_generations": [],
           "requires": {}}
ENTRY = {"repo_id": "test-org/toy-scale", "spec": {"version": 1}, "version": "1.2.0", "commit": COMMIT,
         "variant": VARIANT, "files": {"__init__.py": HASH}, "source": "hub", "location": "http://127.0.0.1:9"}


def _lock(**changes) -> str:
    return json.dumps({"kernel-hub-lock": 1, "kernels": [{**ENTRY, **changes}]})


YAML_EDITS = {  # kernel folders whose kernel.yaml is wrong in one way: (old text, new text)
    "yaml_malformed": ("name: toy_scale", "name: [unclosed"),
    "yaml_not_mapping": None,
    "yaml_version_list": ("version: 1.2.0", "version: [1]"),
    "yaml_version_bad": ("version: 1.2.0", "version: one"),
    "yaml_variants_not_list": ("variants:\n", "variants: 5\nold_variants:\n"),
    "yaml_missing_name": ("name: toy_scale\n", ""),
    "yaml_python_name": ("python_name: toy_scale", "python_name: ../x"),
    "yaml_repo_id": ("repo_id: test-org/toy-scale", "repo_id: nope"),
    "yaml_variant_climbing": ("  - name: jax-cpu", "  - name: '../../../tmp/victim'"),
    "yaml_framework": ("    framework: jax\n    backend: cpu", "    framework: tensorflow\n    backend: cpu"),
}

R_ID = "test-org/toy-scale"
LOCKS = {
    "lock_not_json": "{not json",
    "lock_list": "[]",
    "lock_wrong_format": json.dumps({"kernel-hub-lock": 99, "kernels": []}),
    "lock_kernels_not_list": json.dumps({"kernel-hub-lock": 1, "kernels": {}}),
    "lock_missing_field": json.dumps({"kernel-hub-lock": 1, "kernels": [{k: v for k, v in ENTRY.items()
                                                                          if k != "commit"}]}),
    "lock_unknown_field": _lock(extra=1),
    "lock_commit": _lock(commit="../../etc"),
    "lock_variant": _lock(variant={**VARIANT, "name": "/tmp/victim"}),
    "lock_file_climbing": _lock(files={"../../x.py": HASH}),
    "lock_file_digest": _lock(files={"__init__.py": "not-a-digest"}),
    "lock_file_pyc": _lock(files={"__pycache__/ops.cpython-311.pyc": HASH}),
    "lock_source": _lock(source="ftp"),
    "lock_repo": _lock(repo_id="../x"),
    "lock_nested": '{"kernel-hub-lock": 1, "kernels": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "lock_key_twice": '{"kernel-hub-lock": 1, "kernels": [], "kernels": []}',
    "hf_lock_twice": json.dumps([{"dependency": {"repo-id": R_ID, "version": 1}, "lock": {"commit": "a" * 40}}] * 2),
    "hf_lock_negative": json.dumps([{"dependency": {"repo-id": R_ID, "version": -1}, "lock": {"commit": "a" * 40}}]),
    "hf_lock_long_version": '[{"dependency": {"repo-id": "' + R_ID + '", "version": ' + "9" * 5000 + '}}]',
}

REGISTRIES = {
    "reg_malformed": "kernels: [\n",
    "reg_kernels_not_list": "kernels: 5\n",
    "reg_no_repo_id": "kernels:\n  - source: x\n",
    "reg_layers": "kernels: []\nlayers: 5\n",
    "reg_bad_repo": "kernels:\n  - repo_id: ../../etc\n    version: '1'\n",
}


@pytest.fixture
def paths(tmp_path: Path, toy_registry: Path, toy_kernel: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every file and folder the table names, built once per test."""
    monkeypatch.setenv("KERNEL_HUB_BACKEND", "cpu")            # decisions without importing jax
    monkeypatch.delenv("KERNEL_HUB_SERVE_TOKEN", raising=False)
    out = {"toy": str(toy_kernel), "tmp": str(tmp_path), "missing": str(tmp_path / "missing"),
           "empty_dir": str(tmp_path / "empty"), "a_file": str(tmp_path / "a_file.txt")}
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file.txt").write_text("x")
    for name, edit in YAML_EDITS.items():
        folder = tmp_path / name
        copy_toy(folder)
        meta = folder / "kernel.yaml"
        if edit is None:
            meta.write_text("- just\n- a list\n")
        else:
            assert edit[0] in meta.read_text(), name
            meta.write_text(meta.read_text().replace(edit[0], edit[1], 1))
        out[name] = str(folder)
    broken = tmp_path / "broken_import"
    copy_toy(broken)
    (broken / "toy_scale" / "ops.py").write_text("raise SystemExit('kernel exits at import')\n")
    out["broken_import"] = str(broken)
    link_out = tmp_path / "link_out"
    copy_toy(link_out)
    (link_out / "toy_scale" / "etc").symlink_to("/etc")
    out["link_out"] = str(link_out)
    for name, text in {**LOCKS, **REGISTRIES}.items():
        (tmp_path / name).write_text(text)
        out[name] = str(tmp_path / name)
    (tmp_path / "lock_binary").write_bytes(b"\xff\xfe\x00garbage")
    out["lock_binary"] = str(tmp_path / "lock_binary")
    os.mkfifo(tmp_path / "lock_fifo")
    out["lock_fifo"] = str(tmp_path / "lock_fifo")
    return out


R = "test-org/toy-scale"
BAD = [
    # usage, any command
    ([], "name a command"),
    (["frobnicate"], "invalid choice"),
    (["--registry"], "expected one argument"),
    (["--registry", "{missing}", "list"], "not found"),
    # bad registries
    (["--registry", "{reg_malformed}", "list"], "malformed YAML"),
    (["--registry", "{reg_kernels_not_list}", "list"], "kernels"),
    (["--registry", "{reg_no_repo_id}", "list"], "repo_id"),
    (["--registry", "{reg_layers}", "list"], "layers"),
    (["--registry", "{reg_bad_repo}", "lock", "-o", "{tmp}/x.lock"], "../../etc"),
    # list / info
    (["list", "extra"], "unrecognized arguments"),
    (["info"], "required"),
    (["info", "bad"], "ORG/NAME"),
    (["info", "../etc/passwd"], "ORG/NAME"),
    (["info", "/abs"], "repo id"),
    (["info", "a/b--c"], "repo id"),
    (["info", "test-org/unknown"], "Hub at http://127.0.0.1:9"),
    # resolve
    (["resolve", R, "--version", ">=1,,"], "PEP 440"),
    (["resolve", R, "--version", ">=9"], "no release matches"),
    (["resolve", R, "--version", "7"], "no branch v7"),
    (["resolve", R, "--version", "1", "--revision", "v1"], "not both"),
    (["resolve", R, "--revision", "nope"], "no ref or commit"),
    (["resolve", R, "--revision=--force"], "not a valid branch or tag name"),
    (["resolve", R, "--backend", "quantum"], "invalid choice"),
    (["resolve", R, "--tpu-generation", "huge"], "TPU generation"),
    (["resolve", R, "--jax-version", "banana"], "not a version"),
    (["resolve", R, "--version"], "expected one argument"),
    (["resolve", R, "--version", "9" * 5000], "5000 digits"),
    (["resolve", R, "--version", ">=" + "9" * 5000], "not a PEP 440 specifier"),
    (["resolve", R, "--version", "\u00b2"], "not a PEP 440 specifier"),
    # download
    (["download", "bad"], "ORG/NAME"),
    (["download", R, "--version", "abc"], "PEP 440"),
    (["download", R, "--backend", "cuda"], "fits this system"),
    (["download", R, "--framework", "tensorflow"], "invalid choice"),
    (["download", R, "--lockfile", "{missing}"], "no lock file"),
    (["download", R, "--lockfile", "{lock_commit}"], "40-hex commit"),
    (["download", R, "--version", "1", "--lockfile", "{lock_commit}"], "lock file fixes the version"),
    # validate and bad kernel.yaml
    (["validate", "--path", "{missing}"], "not a kernel folder"),
    (["validate", "--path", "{a_file}"], "not a kernel folder"),
    (["validate", "--path", "{empty_dir}"], "kernel.yaml"),
    (["validate", "--seed", "abc"], "invalid int value"),
    (["validate", "test-org/unknown", "--version", "1"], "Hub at http://127.0.0.1:9"),
    (["validate", "--path", "{broken_import}"], "kernel exits at import"),
    (["validate", "--path", "{yaml_malformed}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_not_mapping}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_version_list}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_version_bad}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_variants_not_list}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_missing_name}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_python_name}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_repo_id}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_framework}"], "kernel.yaml"),
    (["validate", "--path", "{yaml_variant_climbing}"], "../../../tmp/victim"),
    (["validate", "acme/x", "--version", "1", "--trust-remote-code=../x"], "trust_remote_code entry"),
    # bad lock files, through validate --lockfile
    (["validate", R, "--lockfile", "{lock_not_json}"], "not valid JSON"),
    (["validate", R, "--lockfile", "{lock_list}"], "is not in"),  # an empty HF kernels.lock: locks nothing
    (["validate", R, "--lockfile", "{lock_wrong_format}"], "not a kernel-hub lock file"),
    (["validate", R, "--lockfile", "{lock_kernels_not_list}"], "must be a list"),
    (["validate", R, "--lockfile", "{lock_missing_field}"], "missing field 'commit'"),
    (["validate", R, "--lockfile", "{lock_unknown_field}"], "unknown field 'extra'"),
    (["validate", R, "--lockfile", "{lock_variant}"], "not a variant name"),
    (["validate", R, "--lockfile", "{lock_file_climbing}"], "relative path"),
    (["validate", R, "--lockfile", "{lock_file_digest}"], "no sha256"),
    (["validate", R, "--lockfile", "{lock_file_pyc}"], "bytecode"),
    (["validate", R, "--lockfile", "{lock_source}"], "source must be"),
    (["validate", R, "--lockfile", "{lock_repo}"], "repo_id"),
    (["validate", R, "--lockfile", "{lock_binary}"], "not a text file"),
    (["validate", R, "--lockfile", "{empty_dir}"], "is a folder"),
    (["validate", R, "--lockfile", "{lock_nested}"], "nested"),
    (["validate", R, "--lockfile", "{lock_key_twice}"], "twice in one object"),
    (["validate", R, "--lockfile", "{hf_lock_twice}"], "locked twice"),
    (["validate", R, "--lockfile", "{hf_lock_negative}"], "not version -1"),
    (["validate", R, "--lockfile", "{hf_lock_long_version}"], "not valid JSON"),
    (["validate", "test-org/other", "--lockfile", "{lock_kernels_not_list}"], "must be a list"),
    # lock
    (["lock", "bad"], "ORG/NAME"),
    (["lock", R, "-o", "{missing}/x.lock"], "does not exist"),
    (["lock", R, "-o", "{empty_dir}"], "is a folder"),
    (["lock", R, "--version", ">=9", "-o", "{tmp}/x.lock"], "no release matches"),
    (["lock", R, "--version", "1", "--revision", "main", "-o", "{tmp}/x.lock"], "not both"),
    (["lock", R, "-o", "{tmp}/x.lock", "--trust", "a/b/c"], "trust_remote_code entry"),
    # publish
    (["publish"], "required"),
    (["publish", "{missing}"], "not a kernel folder"),
    (["publish", "{toy}", "--repo", "bad", "--skip-validation"], "ORG/NAME"),
    (["publish", "{toy}", "--repo", "../x/y", "--skip-validation"], "--repo"),
    (["publish", "{toy}", "--endpoint", "ftp://x", "--skip-validation"], "--endpoint"),
    (["publish", "{yaml_variant_climbing}", "--skip-validation"], "is not a variant name"),
    (["publish", "{link_out}", "--skip-validation"], "outside"),
    (["publish", "{yaml_malformed}", "--skip-validation"], "kernel.yaml"),
    # serve
    (["serve"], "required"),
    (["serve", "--store", "{tmp}/s", "--port", "notanint"], "invalid int value"),
    (["serve", "--store", "{tmp}/s", "--port", "70000"], "--port"),
    (["serve", "--store", "{a_file}"], "--store"),
    (["serve", "--store", "{tmp}/s", "--host", "0.0.0.0"], "token"),
    (["serve", "--store", "{tmp}/s", "--read-token-required"], "token"),
    (["serve-model"], "required"),
    (["serve-model", "{tmp}/m", "--port", "0"], "a port is 1..65535"),
    (["serve-model", "{tmp}/m", "--cb-num-blocks", "-4"], "positive whole number"),
    (["serve-model", "{tmp}/m", "--kernel", "experts=a/b"], "unknown layer kind"),
    (["serve-model", "{tmp}/m", "--kernel", "attention=../x"], "--kernel"),
    # report (refused before anything runs)
    (["report", "--skip", "benchmarks"], "--skip takes validation, compile, families, benches"),
    (["report", "--families", "qwen3_moe,nosuch"], "--families: unknown nosuch"),
    (["report", "--benches", "ragged"], "--benches: unknown ragged"),
    (["report", "--out", "{a_file}"], "is a file"),
    (["report", "--tpu", "v99x"], "--tpu"),
    (["report", "--seed", "x"], "invalid int value"),
    # init (refused before anything is written; tests/scaffold/test_init.py checks that nothing is)
    (["init"], "required"),
    (["init", "9lives", "--dir", "{tmp}"], "kernel name"),
    (["init", "my-kernel", "--dir", "{tmp}"], "kernel name"),
    (["init", "_private", "--dir", "{tmp}"], "private"),
    (["init", "torch", "--dir", "{tmp}"], "imports use"),
    (["init", "toy_scale", "--dir", "{toy}"], "already exists"),
    (["init", "ok_name", "--dir", "{a_file}"], "is a file"),
    (["init", "ok_name", "--dir", "{tmp}", "--template", "conv"], "unknown --op"),
    (["init", "ok_name", "--dir", "{tmp}", "--op", "ternary"], "known: unary, binary, matmul, attention"),
    # setup-tpu (refused before anything is built)
    (["setup-tpu", "--dir", "{a_file}"], "is a file"),
    # cache (nothing removed)
    (["cache", "prune"], "needs repo ids"),
    (["cache", "prune", "a/b", "--all"], "not both"),
    (["cache", "prune", "../x"], "repo id '../x'"),
    (["init", "ok_name", "--dir", "{tmp}", "--repo", "nope"], "ORG/NAME"),
    # list --hub
    (["list", "--hub", "../x"], "--hub"),
    (["list", "--hub", "acme", "--endpoint", "http://127.0.0.1:9"], "listing acme"),
    # bench / demo
    (["bench", R], "no benchmark script"),
    (["bench", "test-org/unknown"], "unknown kernel repo"),
    (["demo", "--fast"], "unrecognized arguments"),
]


def test_the_table_is_large_and_covers_every_command() -> None:
    assert len(BAD) >= 45
    used = {a for args, _ in BAD for a in args if a in cli.build_parser().commands}
    assert used == set(cli.build_parser().commands)


@pytest.mark.parametrize(("args", "needle"), BAD, ids=[" ".join(a) or "no-args" for a, _ in BAD])
def test_bad_input_is_one_line_and_nonzero(args: list[str], needle: str, paths: dict[str, str],
                                           capsys: pytest.CaptureFixture) -> None:
    argv = [a.format(**paths) for a in args]
    rc = cli.main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc != 0
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and "internal error" not in lines[0], lines[0]
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", [["frobnicate"], ["info", "../etc/passwd"],
                                  ["validate", "--path", "{yaml_version_list}"],
                                  ["download", R, "--lockfile", "{lock_not_json}"],
                                  ["validate", R, "--lockfile", "{lock_fifo}"]])
def test_the_installed_command_prints_one_line_too(args: list[str], paths: dict[str, str]) -> None:
    env = {**os.environ, "KERNEL_HUB_BACKEND": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "kernel_hub.cli", *(a.format(**paths) for a in args)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
