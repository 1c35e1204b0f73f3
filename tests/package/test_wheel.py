"""The wheel works outside the checkout.

Built the way `python -m build` does (sdist, then a wheel from the sdist), installed offline from the local
wheelhouse (`make setup` fills .wheelhouse/) into a fresh venv, `kernel-hub list`, `validate` and `demo` run
from a folder that is not the checkout, with no registry override and a closed Hub endpoint, and load the
kernels embedded in the installed package. Also: which registry.yaml a default load reads (registry_location).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kernel_hub.load.registry import REGISTRY_ENV, registry_location
from tests.client_env import child_env

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".wheelhouse"
KERNELS = ROOT / "kernels" / "pallas"
EMBEDDED = "kernel_hub/_embedded/"
CLOSED_ENDPOINT = "http://127.0.0.1:9"  # nothing listens: a Hub call fails at once instead of leaving the machine
#: what `make setup` and the tools leave in a checkout (.gitignore's top-level entries): never part of the sdist, and
#: the two environments alone are gigabytes to copy
TOP_LEVEL_SKIP = {".venv", ".venv-tpu", ".wheelhouse", ".git", "build", "dist", ".pytest_cache", ".ruff_cache",
                  ".kernel_hub_cache", "report"}

pytestmark = pytest.mark.slow


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == ROOT
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and n in TOP_LEVEL_SKIP)}


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would point pip or kernel-hub back at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "KERNEL_HUB_")) and k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    return child_env(env, **extra)


def _check(proc: subprocess.CompletedProcess[str], what: str) -> str:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist from a copy of the checkout (the checkout itself stays untouched), then the wheel from that sdist."""
    tmp = tmp_path_factory.mktemp("wheel-build")
    src, dist = tmp / "src", tmp / "dist"
    shutil.copytree(ROOT, src, ignore=_copy_ignore)
    sdist = _check(subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"],
        cwd=src, capture_output=True, text=True, timeout=300), "build_sdist").strip().splitlines()[-1]
    _check(subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(dist), str(dist / sdist)],
        cwd=tmp, capture_output=True, text=True, timeout=300, env=_clean_env(PIP_CONFIG_FILE=os.devnull)),
        "pip wheel")
    (built,) = dist.glob("kernel_hub-*.whl")
    return built


@dataclass(frozen=True)
class Installed:
    bin: Path
    site: Path
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "kernel-hub"), *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh venv with the wheel and kernel-hub[demo], from the wheelhouse only (no index, no pip config)."""
    if not any(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no wheels: run `make setup` (it downloads the offline install set once)")
    tmp = tmp_path_factory.mktemp("wheel-venv")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _check(subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
         "--no-index", "--find-links", str(WHEELHOUSE), "-c", str(ROOT / "constraints.txt"), f"{wheel}[demo]"],
        capture_output=True, text=True, timeout=600, env=_clean_env(PIP_CONFIG_FILE=os.devnull)),
        "offline pip install")
    (site,) = (venv / "lib").glob("python3*/site-packages")
    workdir = tmp / "elsewhere"
    workdir.mkdir()
    env = _clean_env(HF_ENDPOINT=CLOSED_ENDPOINT, HF_HOME=str(tmp / "hf"), KERNEL_HUB_CACHE=str(tmp / "cache"),
                     PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    # The venv's processes write their bytecode, as a default Python does: it was installed --no-compile, so with
    # PYTHONDONTWRITEBYTECODE (set on some machines) each of this module's dozen processes compiled jax, torch and
    # transformers from source again. The bytecode goes into the venv's own site-packages; kernel packages are
    # loaded without bytecode either way (kernel_hub.load.loader).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return Installed(bin=venv / "bin", site=site, workdir=workdir, env=env)


def _expected_embedded() -> dict[str, Path]:
    """Wheel name -> checkout file: every file under kernels/pallas/ except a kernel's tests/, the kernel tests'
    conftest.py, caches, dotfiles."""
    out = {}
    for path in KERNELS.rglob("*"):
        rel = path.relative_to(KERNELS)
        if (path.is_dir() or "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts)
                or path.suffix in {".pyc", ".pyo"} or (len(rel.parts) > 1 and rel.parts[1] == "tests")
                or rel.as_posix() == "conftest.py"):
            continue
        out[f"{EMBEDDED}kernels/pallas/{rel.as_posix()}"] = path
    return out


def test_wheel_embeds_the_registry_and_every_kernel_folder(wheel: Path) -> None:
    expected = _expected_embedded()
    with zipfile.ZipFile(wheel) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        embedded = {n for n in infos if n.startswith(EMBEDDED + "kernels/")}
        for entry in yaml.safe_load((ROOT / "registry.yaml").read_text())["kernels"]:
            assert f"{EMBEDDED}{entry['source']}/kernel.yaml" in embedded, entry["repo_id"]
        assert embedded == set(expected), (sorted(embedded - set(expected)), sorted(set(expected) - embedded))
        for name, source in expected.items():  # symlinks in the checkout arrive as the files they point at
            assert zf.read(name) == source.read_bytes(), name
            assert not stat.S_ISLNK(infos[name].external_attr >> 16), f"{name} is a symlink in the wheel"
        assert zf.read(EMBEDDED + "registry.yaml") == (ROOT / "registry.yaml").read_bytes()
        assert not any("/bench/" in n or n.endswith((".pyc", ".pyo")) for n in infos)


def test_the_wheel_holds_the_client_and_not_the_cost_model(wheel: Path) -> None:
    """The cost model (src/tpu_cost_model, with its stand_ins/) is checkout tooling: the wheel's only package is
    kernel_hub, and no file of the model is in it under any folder."""
    model = ROOT / "src" / "tpu_cost_model"
    model_files = {p.read_bytes(): p.relative_to(model).as_posix() for p in model.rglob("*.py")
                   if "__pycache__" not in p.parts and p.stat().st_size}
    assert {"schedule.py", "stand_ins/vllm/logger.py"} <= set(model_files.values())
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        copies = [f"{n} = {model_files[zf.read(n)]}" for n in names if zf.read(n) in model_files]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"kernel_hub"}
    assert not [n for n in names if "cost_model" in n or "stand_ins" in n]
    assert copies == [], "cost-model files in the wheel"


def test_list_from_the_wheel_reads_the_embedded_registry(installed: Installed) -> None:
    out = _check(installed.run("list", timeout=120), "kernel-hub list")
    embedded = installed.site / "kernel_hub" / "_embedded" / "registry.yaml"
    assert f"registry: {embedded} (embedded)" in out.splitlines()
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for entry in yaml.safe_load((ROOT / "registry.yaml").read_text())["kernels"]:
        kernel_yaml = yaml.safe_load((ROOT / entry["source"] / "kernel.yaml").read_text())
        assert entry["repo_id"] in rows, out
        assert f" {kernel_yaml['version']} " in rows[entry["repo_id"]], out  # its source folder was found


def test_validate_from_the_wheel_passes(installed: Installed) -> None:
    """The command finds the embedded kernel by repo id and runs its cases; the decode tag keeps it to a few (the demo,
    test_demo_from_the_wheel_runs_on_the_embedded_kernels, validates one case per mode and dtype of the same kernel
    from the wheel; the kernel's own tests run every case)."""
    out = _check(installed.run("validate", "kernel-hub/ragged-dot-tpu", "--tag", "decode", timeout=300),
                 "kernel-hub validate")
    assert "PASSED" in out and "FAIL" not in out, out


def test_demo_from_the_wheel_runs_on_the_embedded_kernels(installed: Installed) -> None:
    proc = installed.run("demo", "--quick")
    out = _check(proc, "kernel-hub demo --quick")
    assert "Traceback" not in proc.stderr
    assert str(installed.site / "kernel_hub" / "_embedded" / "kernels" / "pallas" / "ragged_dot") in out
    assert "PASSED" in out and "AGREE" in out, out
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("case ") and " mode " in ln)
    cells = [tuple(ln.split()[1:3]) for ln in lines[head + 1:] if ln.split() and ln.split()[-1] == "pass"]
    assert len(cells) >= 4 and len(cells) == len(set(cells)), cells  # --quick: one case per (dtype, mode)
    assert "bit-identical to before kernelize: True" in out, out  # the kernelize section ran (torch, transformers)
    assert not list(installed.workdir.iterdir()), "the demo wrote into the working directory"


def test_bench_from_the_wheel_says_in_one_line_that_benchmarks_ship_with_a_checkout(installed: Installed) -> None:
    proc = installed.run("bench", "kernel-hub/ragged-dot-tpu", timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "checkout" in lines[0], proc.stderr


# registry_location: which registry.yaml a default load reads, and why.

def _layout(root: Path, package: str, *files: str) -> Path:
    """A package folder, with `files` two levels up (where a checkout keeps registry.yaml and pyproject.toml)."""
    pkg = root / package
    pkg.mkdir(parents=True)
    for name in files:  # a pyproject naming kernel-hub, and kernels/pallas/ beside it: a checkout's markers
        text = '[project]\nname = "kernel-hub"\n' if name == "pyproject.toml" else "kernels: []\n"
        (pkg.parents[1] / name).write_text(text)
    (pkg.parents[1] / "kernels" / "pallas").mkdir(parents=True)
    return pkg


def test_registry_env_wins_over_everything(tmp_path: Path) -> None:
    pkg = _layout(tmp_path, "src/kernel_hub", "registry.yaml", "pyproject.toml")
    loc = registry_location({REGISTRY_ENV: "/x/registry.yaml"}, pkg)
    assert loc == (Path("/x/registry.yaml"), "$KERNEL_HUB_REGISTRY")
    assert loc.describe() == "registry: /x/registry.yaml ($KERNEL_HUB_REGISTRY, missing)"


def test_a_checkout_reads_its_own_registry(tmp_path: Path) -> None:
    pkg = _layout(tmp_path, "src/kernel_hub", "registry.yaml", "pyproject.toml")
    loc = registry_location({}, pkg)
    assert loc == (tmp_path.resolve() / "registry.yaml", "checkout")
    assert loc.describe() == f"registry: {tmp_path.resolve() / 'registry.yaml'} (checkout)"


@pytest.mark.parametrize("files", [(), ("registry.yaml",), ("pyproject.toml",)])
def test_an_installed_package_reads_its_embedded_registry(tmp_path: Path, files: tuple[str, ...]) -> None:
    pkg = _layout(tmp_path, "lib/python3.11/site-packages/kernel_hub", *files)
    assert registry_location({}, pkg) == (pkg.resolve() / "_embedded" / "registry.yaml", "embedded")


def test_a_src_layout_without_registry_or_pyproject_is_not_a_checkout(tmp_path: Path) -> None:
    pkg = _layout(tmp_path, "src/kernel_hub", "registry.yaml")
    assert registry_location({}, pkg).origin == "embedded"


def test_this_editable_install_reads_the_checkout() -> None:
    assert registry_location({}) == (ROOT / "registry.yaml", "checkout")


# The open hub, from the wheel: init -> validate -> compile -> publish -> load (ours, HF kernels) -> kernelize with
# a mapping to a repo outside registry.yaml, from a folder that is not the checkout. The server and HF `kernels`
# run from this (the checkout's) environment: the offline wheelhouse holds kernel-hub[demo], not the server's
# starlette/uvicorn/dulwich nor HF kernels, and neither needs kernel-hub's wheel to play its part.

TPU_PYTHON = ROOT / ".venv-tpu" / "bin" / "python"
TOKEN = "test-token"


@dataclass
class Steps:
    """Each step's command, wall time and output excerpt, printed at the end (pytest -s shows them)."""

    rows: list[tuple[str, float, str]]

    def run(self, installed: Installed, label: str, *args: str, env: dict[str, str] | None = None,
            ok: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        import time

        start = time.monotonic()
        proc = subprocess.run([str(installed.bin / "kernel-hub"), *args], cwd=installed.workdir,
                              env=env or installed.env, capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - start
        tail = (proc.stdout.strip().splitlines() or [""])[-1] if proc.returncode == 0 else proc.stderr.strip()
        self.rows.append((f"{label}: kernel-hub {' '.join(args)}", seconds, tail[:200]))
        if ok:
            _check(proc, label)
        return proc

    def python(self, python: Path, label: str, script: str, env: dict[str, str], cwd: Path) -> str:
        import time

        start = time.monotonic()
        proc = subprocess.run([str(python), "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)
        out = _check(proc, label)
        self.rows.append((label, time.monotonic() - start, (out.strip().splitlines() or [""])[-1][:200]))
        return out


_LOAD_OURS = """
import json, numpy as np, kernel_hub as kh
k = kh.get_kernel("acme/my-axpy", version=1, trust_remote_code=True)
x = np.random.default_rng(0).standard_normal((37, 200)).astype(np.float32); y = np.ones_like(x)
out = np.asarray(k.axpy(x, y, alpha=0.5))
print(json.dumps({"variant": k.__kernel_hub__.variant, "version": k.__kernel_hub__.version,
                  "err": float(np.abs(out - (0.5 * x.astype(np.float64) + 1)).max())}))
"""
_LOAD_HF = """
import json, torch, kernels
k = kernels.get_kernel("acme/my-axpy", version=1)
x = torch.randn(37, 200, generator=torch.Generator().manual_seed(0)); y = torch.ones_like(x)
out = k.axpy(x, y, alpha=0.5)
print(json.dumps({"err": float((out.double() - (0.5 * x.double() + 1)).abs().max()), "dtype": str(out.dtype)}))
"""
_KERNELIZE = """
import json, torch, kernel_hub as kh
from kernel_hub.report.models import tiny_model
model = tiny_model("qwen3_moe")
ids = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    before = model(ids).logits
refused = kh.kernelize_report(
    kh.kernelize(model, mapping={"moe_experts": "acme/ragged-dot-tpu", "attention": None, "rms_norm": None}))
kh.restore(model)
report = kh.kernelize_report(
    kh.kernelize(model, mapping={"moe_experts": {"repo_id": "acme/ragged-dot-tpu", "version": 1},
                                      "attention": None, "rms_norm": None}, trust_remote_code=["acme"]))
with torch.no_grad():
    after = model(ids).logits
print(json.dumps({"refused": [k.reason for k in refused.kept], "replaced": [r.repo_id for r in report.replaced],
                  "rel": float((after - before).abs().max() / before.abs().max())}))
"""


def _repo_blob_ids(store: Path, repo_id: str) -> dict[str, str]:
    """Git blob id (a digest of the content) of every file under build/ at main of a repo in a serve store."""
    from kernel_hub.server.gitstore import GitStore

    repo = GitStore(store).get("kernel", repo_id)  # publish creates kernel repos
    return {e.path: e.oid for e in repo.all_files(repo.resolve("main"), sizes=False) if e.path.startswith("build/")}


def test_open_hub_flow_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    import json

    from kernel_hub.publish.release import build_layout
    from tests.hub_server import hub_env, running_server

    steps = Steps([])
    work = installed.workdir / "authoring"
    work.mkdir()
    # the TPU environment's processes (started by the wheel's kernel-hub) run as they do everywhere else
    keep = {k: os.environ[k] for k in ("PYTHONDONTWRITEBYTECODE",) if k in os.environ}
    tpu_env = {**installed.env, **keep, "KERNEL_HUB_TPU_PYTHON": str(TPU_PYTHON)} if TPU_PYTHON.is_file() else None
    try:
        steps.run(installed, "init", "init", "my_axpy", "--dir", str(work), "--repo", "acme/my-axpy")
        kernel = work / "my_axpy"
        no_tpu = steps.run(installed, "validate without the TPU env", "validate", "--path", str(kernel), "--tpu",
                           "v5e,v6e", ok=False)
        lines = [ln for ln in no_tpu.stderr.splitlines() if ln.strip()]
        assert no_tpu.returncode == 1 and len(lines) == 1 and "setup-tpu" in lines[0], no_tpu.stderr
        assert "cases" not in no_tpu.stdout, "cases ran before the missing TPU environment was reported"
        if tpu_env is not None:  # the numbers and every TPU case compiled, in one command
            out = steps.run(installed, "validate + compile", "validate", "--path", str(kernel), "--tpu", "v5e,v6e",
                            env=tpu_env).stdout
            assert "TPU compile" in out and "FAIL" not in out and "PASSED" in out, out
            assert sum(ln.startswith(("v5e ", "v6e ")) for ln in out.splitlines()) >= 16, out
        else:
            out = steps.run(installed, "validate", "validate", "--path", str(kernel)).stdout
            assert "PASSED" in out and "FAIL" not in out, out
        copy = work / "rd"  # our ragged dot, copied alone: nothing beside it
        shutil.copytree(KERNELS / "ragged_dot", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
        out = steps.run(installed, "validate copied ragged_dot", "validate", "--path", str(copy), "--tag",
                        "edge").stdout
        assert "PASSED" in out and "FAIL" not in out, out

        store = tmp_path / "store"
        with running_server(store, token=TOKEN, extra_args=("--trusted-org", "acme")) as server:
            publish_env = {**(tpu_env or installed.env), "HF_ENDPOINT": server.url}
            # validated just above; the compile gate still runs (its cache holds the cases compiled above)
            gate = [] if tpu_env is not None else ["--skip-tpu-compile"]
            steps.run(installed, "publish", "publish", str(kernel), "--repo", "acme/my-axpy", "--endpoint",
                      server.url, "--token", TOKEN, "--skip-validation", *gate, env=publish_env)
            steps.run(installed, "publish copied ragged_dot", "publish", str(copy), "--repo", "acme/ragged-dot-tpu",
                      "--endpoint", server.url, "--token", TOKEN, "--skip-validation", "--skip-tpu-compile",
                      env=publish_env)
            listed = steps.run(installed, "list --hub", "list", "--hub", "acme", "--endpoint", server.url,
                               "--json", env=publish_env).stdout
            assert {r["repo_id"] for r in json.loads(listed)["repos"]} == {"acme/my-axpy", "acme/ragged-dot-tpu"}

            user_env = {**installed.env, "HF_ENDPOINT": server.url}
            ours = json.loads(steps.python(installed.bin / "python", "kh.get_kernel(acme/my-axpy, version=1)",
                                           _LOAD_OURS, user_env, installed.workdir).strip().splitlines()[-1])
            assert ours["variant"] == "jax-cpu" and ours["version"] == "1.0.0" and ours["err"] < 1e-5, ours
            hf = json.loads(steps.python(Path(sys.executable), "HF kernels.get_kernel(acme/my-axpy, version=1)",
                                         _LOAD_HF, hub_env(server, tmp_path / "hf-cache"), tmp_path)
                            .strip().splitlines()[-1])
            assert hf["err"] < 1e-5 and hf["dtype"] == "torch.float32", hf
            done = json.loads(steps.python(installed.bin / "python", "kernelize mapping acme/ragged-dot-tpu",
                                           _KERNELIZE, user_env, installed.workdir).strip().splitlines()[-1])
            assert done["refused"] and all("trust" in r for r in done["refused"]), done
            assert done["replaced"] and set(done["replaced"]) == {"acme/ragged-dot-tpu"}, done
            assert done["rel"] < 1e-4, done

        # the copy publishes the same files as the checkout's folder: every file of every build, by its git blob
        # id; the TPU variants' metadata.json (and their bundles) differ only by the compile record, which says
        # "not compiled" for the --skip-tpu-compile publish and is empty for a layout built without a gate
        expected = build_layout(KERNELS / "ragged_dot", tmp_path / "from-checkout").blob_ids("build/")
        published = _repo_blob_ids(store, "acme/ragged-dot-tpu")
        assert set(published) == set(expected)
        differ = {p for p in expected if published[p] != expected[p]}
        assert differ <= {"build/jax-tpu/metadata.json", "build/torch-tpu/metadata.json", "build/jax-tpu.tar",
                          "build/torch-tpu.tar"}, sorted(differ)
        package_files = [p for p in expected if p.count("/") >= 3]  # build/<variant>/<python_name>/...
        assert len(package_files) > 60 and all(published[p] == expected[p] for p in package_files)
    finally:
        for label, seconds, tail in steps.rows:
            print(f"[{seconds:6.1f} s] {label}\n           {tail}")
