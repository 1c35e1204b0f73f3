"""A kernel-builder torch-tpu repo (ours, written by tests/kernel_builder_repo.py in the layout of Hugging Face's
kernels-community/ragged-dot-tpu: noarch `torch-tpu`, a `v1` branch, no tags, JAX functions registered through
torch_tpu's jax_op) loaded with kh.get_kernel in the TPU environment (.venv-tpu, a subprocess) from `kernel-hub
serve`; and, here without torch_tpu, chosen for a simulated TPU and refused at import with the real reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from huggingface_hub import HfApi

from kernel_hub.api import load_plan, plan_load
from kernel_hub.errors import KernelImportError
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import hub_env, running_server
from tests.kernel_builder_repo import RAGGED_TPU, publish, write_variant

TOKEN = "test-token"
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "tpu_env" / "kernel_builder_tpu.py"
REPO = "acme/kb-ragged-dot-tpu"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("kbtpu")
    with running_server(root / "store", token=TOKEN) as srv:
        write_variant(root / "repo", "torch-tpu", "kb-ragged-dot-tpu", {"__init__.py": RAGGED_TPU}, backend="tpu")
        publish(HfApi(endpoint=srv.url, token=TOKEN), REPO, root / "repo")
        yield srv


def test_here_a_simulated_tpu_chooses_torch_tpu_and_the_import_says_why_not(hub, tmp_path: Path) -> None:
    source = HubSource(endpoint=hub.url, cache_dir=tmp_path)
    cpu = plan_load(REPO, version=1, framework="torch", backend="cpu", source=source)
    assert cpu.choice.variant is None and "noarch backend tpu, this system is cpu" in cpu.no_fit().args[0]
    plan = plan_load(REPO, version=1, framework="torch", backend="tpu", source=source)
    assert plan.choice.variant.name == "torch-tpu"
    with pytest.raises(KernelImportError, match="ModuleNotFoundError: No module named 'torch_tpu'"):
        load_plan(plan, trust_remote_code=True)


def test_get_kernel_imports_it_in_the_tpu_environment(hub, tmp_path: Path, tpu_environment) -> None:
    env = tpu_environment
    child = hub_env(hub, tmp_path / "hf-cache", TF_CPP_MIN_LOG_LEVEL="3", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
                    JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT / "src"), KERNEL_HUB_CACHE=str(tmp_path / "kh"))
    done = subprocess.run([str(env.python), str(SCRIPT), REPO], capture_output=True, text=True, timeout=300,
                          env=child, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["variant"] == "torch-tpu" and facts["verified"] == "sha256 (metadata.json digest)"
    assert {"experts_forward", "ragged_dot"} <= set(facts["exports"])
    assert facts["ops"] == ["kh_kbtest_ragged_tpu::experts", "kh_kbtest_ragged_tpu::ragged_dot"]
    assert facts["meta_experts"] == [[32, 128], "torch.bfloat16"] and facts["meta_ragged_dot"] == [40, 16]
    assert facts["sentinel_rows"] > 0 and facts["experts_error"] <= 1e-5  # f32 vs float64 NumPy
    assert facts["cpu_tensors"] != "ran", facts["cpu_tensors"]
