"""The TPU workers (compile gate, cost model) import kernel code in a subprocess: only through the client's verified
loader, against the digests the parent verified. A file changed on disk after the parent's verification, or one the
digests do not list, is refused with one line before anything of the package runs; no bytecode is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub.errors import IntegrityError
from kernel_hub.tpu.compile_gate import gate, worker_pool
from kernel_hub.tpu.compile_gate.worker_pool import compile_in_worker
from kernel_hub.tpu.package import folder_package
from kernel_hub.tpu.worker_client import refusal
from tests.tpu_toys import env_or_skip, write_package
from tpu_cost_model.worker import run_in_worker

KERNEL_YAML = """\
name: trusty
repo_id: acme/trusty
version: 1.0.0
description: A copy kernel for the worker trust tests.
license: Apache-2.0
python_name: trusty
variants:
  - name: jax-tpu
    framework: jax
    backend: tpu
    tpu_generations: [v5e]
"""

OPS = '''
import jax
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def add_one(x):
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''

CASES = '''
def _build():
    import jax

    from .ops import add_one

    return add_one, (jax.ShapeDtypeStruct((8, 128), "float32"),)


def compile_cases():
    return [CompileCase("add_one", "float32", ("smoke",), _build)]
'''


@pytest.fixture(scope="module")
def env():
    return env_or_skip()


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "kh-cache"))
    folder = tmp_path / "trusty_kernel"
    write_package(folder / "trusty", {"__init__.py": "from .ops import add_one\n\n__all__ = ['add_one']\n",
                                      "ops.py": OPS, "tpu_cases.py": CASES})
    (folder / "kernel.yaml").write_text(KERNEL_YAML)
    return folder


def _plant(path: Path, marker: Path) -> None:
    """Code that leaves `marker` behind if it ever runs."""
    path.write_text(f"open({str(marker)!r}, 'w').close()\n" + path.read_text())


def test_verified_package_compiles_without_bytecode(env, kernel: Path) -> None:
    package = folder_package(kernel)
    records = compile_in_worker(env, package, ("v5e",))
    assert [(r["name"], r["passed"]) for r in records] == [("add_one", True)]
    assert not list(kernel.rglob("__pycache__")) and not list(kernel.rglob("*.pyc"))  # source compiled in memory


def test_file_changed_after_the_parent_verified_is_refused_and_never_runs(env, kernel: Path, tmp_path: Path) -> None:
    package = folder_package(kernel)  # the parent hashes every file: these digests go to the worker
    marker = tmp_path / "ran"
    _plant(kernel / "trusty" / "tpu_cases.py", marker)  # imported last by the worker: verification comes first
    with pytest.raises(IntegrityError) as exc:
        compile_in_worker(env, package, ("v5e",))
    message = str(exc.value)
    assert "\n" not in message and "tpu_cases.py" in message and "tampered or corrupt" in message, message
    assert not marker.exists()


def test_file_not_among_the_digests_is_refused(env, kernel: Path, tmp_path: Path) -> None:
    package = folder_package(kernel)
    marker = tmp_path / "ran"
    (kernel / "trusty" / "extra.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(IntegrityError, match="unexpected file extra.py not in the recorded digests"):
        compile_in_worker(env, package, ("v5e",))
    assert not marker.exists()


def test_compile_matrix_refuses_a_change_between_verification_and_the_worker(env, kernel: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"

    def change_then_compile(env_, package, *args, **kwargs):  # the race: after the gate verified, before import
        _plant(package.package_dir / "ops.py", marker)
        return worker_pool.compile_in_worker(env_, package, *args, **kwargs)

    monkeypatch.setattr(gate, "compile_in_worker", change_then_compile)
    with pytest.raises(IntegrityError, match="ops.py has sha256"):
        gate.compile_matrix(folder_package(kernel), ["v5e"], env=env)
    assert not marker.exists()
    assert not list((tmp_path / "kh-cache").rglob("tpu_compile/*.json"))  # nothing cached from a refused run


def test_cost_model_worker_uses_the_same_check(env, kernel: Path, tmp_path: Path) -> None:
    package = folder_package(kernel)
    marker = tmp_path / "ran"
    _plant(kernel / "trusty" / "__init__.py", marker)
    request = {"mode": "model", "ragged_dot": package.request(), "flash_attention": package.request(),
               "generations": ["v5e"], "moe_models": [], "attention_model": "none"}
    events, status, _ = run_in_worker(env, request)
    refused = refusal(events)
    assert status == 3 and isinstance(refused, IntegrityError) and "__init__.py" in str(refused)
    assert not any(e.get("event") == "row" for e in events) and not marker.exists()


def test_worker_reports_libtpu_from_either_distribution(monkeypatch):
    """The compile record names the compiler: a nightly install (libtpu-nightly) is found as well as libtpu."""
    import importlib.metadata as md

    from kernel_hub.tpu import worker

    installed = {"jax": "0.10.2", "libtpu-nightly": "0.1.dev20261101"}

    def version(name: str) -> str:
        if name not in installed:
            raise md.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(md, "version", version)
    assert worker.versions() == {"jax": "0.10.2", "libtpu": "0.1.dev20261101"}
    installed["libtpu"] = "0.0.52"  # both: the release wheel wins
    assert worker.versions()["libtpu"] == "0.0.52"
    installed.clear()
    assert worker.versions() == {"jax": None, "libtpu": None}
