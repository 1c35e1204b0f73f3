"""`kernel-hub init --op unary|binary|matmul|attention`: each folder passes kernel-hub's own ruff config, validates
and publishes (the TPU gate skipped) to a loopback `kernel-hub serve` through the CLI, and loads back from it with
numbers matching NumPy float64; the card's publish recipe points at serve's port."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_hub import cli
from kernel_hub.scaffold import MAX_NAME, TEMPLATES, InitError, init, plan_init
from tests.hub_server import hub_env, running_server

pytest.importorskip("starlette")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "init-token"
#: The longest name init accepts: the rendered lines that carry the name are the longest.
NAMES = {op: f"k_{op}".ljust(MAX_NAME, "x") for op in TEMPLATES}

# Each published kernel loaded back from the server (kernel-hub's client, jax-cpu) and called on fresh random
# inputs; the expected values are NumPy float64, written here, not the kernel's own reference.
_LOAD_BACK = """
import json, numpy as np, kernel_hub as kh
rng = np.random.default_rng(20261204)
def err(got, want):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape and np.isfinite(got).all(), (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
out = {}
for op, repo in REPOS.items():
    k = kh.get_kernel(repo, version=1, trust_remote_code=[repo])
    if op == "unary":
        x = (4 * rng.standard_normal((37, 200))).astype(np.float32); x[0, :3] = (-90.0, 0.0, 90.0)
        x64 = x.astype(np.float64)
        out[op] = err(k.silu(x), x64 / (1 + np.exp(-x64)))
    elif op == "binary":
        x, y = rng.standard_normal((2, 37, 200)).astype(np.float32)
        out[op] = err(k.axpy(x, y, alpha=0.5), 0.5 * x.astype(np.float64) + y)
    elif op == "matmul":
        a, b = rng.standard_normal((45, 70)).astype(np.float32), rng.standard_normal((70, 33)).astype(np.float32)
        out[op] = err(k.matmul(a, b), a.astype(np.float64) @ b)
    else:
        q, kk, v = rng.standard_normal((3, 2, 9, 16)).astype(np.float32)
        s = np.einsum("bqd,bkd->bqk", q.astype(np.float64), kk) / 4.0
        s = np.where(np.arange(9)[None, :] <= np.arange(9)[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        out[op] = err(k.attention(q, kk, v, causal=True), np.einsum("bqk,bkd->bqd", p, v))
    out[op + "_version"] = k.__kernel_hub__.version
print(json.dumps(out))
"""


def _ruff() -> str:
    found = Path(sys.executable).with_name("ruff")
    return str(found) if found.is_file() else (shutil.which("ruff") or "")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("init-ops")
    return {op: init(NAMES[op], root, op, repo_id=f"acme/{op}-op") for op in TEMPLATES}


def test_every_op_passes_the_projects_ruff_config(folders: dict[str, Path]) -> None:
    ruff = _ruff()
    if not ruff:
        pytest.skip("ruff is not installed")
    proc = subprocess.run([ruff, "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache",
                           *map(str, folders.values())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_every_op_publishes_to_serve_and_loads_back(folders: dict[str, Path], tmp_path: Path, capsys) -> None:
    repos = {op: f"acme/{op}-op" for op in TEMPLATES}
    with running_server(tmp_path / "store", token=TOKEN) as server:
        for op, folder in folders.items():
            # validated here on the edge cases (the full set is the kernel's own tests' business), so publish
            # skips its own validation run as well as the TPU gate
            assert cli.main(["validate", "--path", str(folder), "--tag", "edge"]) == 0, capsys.readouterr().err
            printed = capsys.readouterr().out
            assert "PASSED" in printed and "FAIL" not in printed, printed
            code = cli.main(["publish", str(folder), "--repo", repos[op], "--endpoint", server.url, "--token", TOKEN,
                             "--skip-validation", "--skip-tpu-compile"])
            assert code == 0, capsys.readouterr().err[-2000:]
            assert f"{repos[op]} v1.0.0" in capsys.readouterr().out
        proc = subprocess.run([sys.executable, "-c", f"REPOS = {repos!r}\n" + _LOAD_BACK],
                              env=hub_env(server, tmp_path / "cache"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    for op in TEMPLATES:
        assert errors[op] < 1e-5, (op, errors)
        assert errors[f"{op}_version"] == "1.0.0"


def test_the_card_and_the_next_steps_publish_to_serves_port(folders: dict[str, Path], tmp_path: Path,
                                                            capsys) -> None:
    card = (folders["unary"] / "README.md").read_text()
    assert "--endpoint http://127.0.0.1:8080" in card and ":8000" not in card
    assert "--skip-tpu-compile" in card
    assert cli.main(["init", "fresh", "--dir", str(tmp_path), "--op", "unary"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:8080" in out and "(unary op)" in out
    assert (tmp_path / "fresh" / "fresh" / "api.py").read_text().count("def silu(") == 1


def test_old_template_name_and_bad_ops_and_long_names() -> None:
    assert plan_init("ok", "/nonexistent-dir-for-plan", "elementwise").template == "binary"
    with pytest.raises(InitError, match="unknown --op 'conv'; known: unary, binary, matmul, attention"):
        plan_init("ok", "/nonexistent-dir-for-plan", "conv")
    with pytest.raises(InitError, match=f"keep it to {MAX_NAME}"):
        plan_init("k" * (MAX_NAME + 1), "/nonexistent-dir-for-plan", "unary")
