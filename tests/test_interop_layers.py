"""HF kernels' layer convention in our torch builds: PyPI `kernels` 0.17.2's `kernelize`, under a LayerRepository
mapping "RMSNorm" to kernel-hub/rms-norm-tpu published to `kernel-hub serve` (loopback), replaces the forward of a
class marked `use_kernel_forward_from_hub("RMSNorm")` with our `layers.RMSNorm`, which computes what the layer did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")
pytest.importorskip("torch")
pytest.importorskip("kernels")

from kernel_hub.publish import publish
from tests.hub_server import hub_env, hub_requests, running_server

TOKEN = "test-token"
REPO = "kernel-hub/rms-norm-tpu"
KERNEL = Path(__file__).resolve().parents[1] / "kernels" / "pallas" / "rms_norm"

SCRIPT = """
import json, torch
from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

@use_kernel_forward_from_hub("RMSNorm")
class MarkedRMSNorm(torch.nn.Module):  # Llama's RMSNorm, written out here
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(1)) * 0.5 + 1)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)

out = {}
for dtype in (torch.float32, torch.bfloat16):
    model = torch.nn.Sequential(MarkedRMSNorm(96), torch.nn.Linear(96, 8)).to(dtype)
    x = torch.randn(2, 7, 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.no_grad():
        before = model(x)
    mapping = {"RMSNorm": {"cpu": LayerRepository(repo_id=REPO, layer_name="RMSNorm", version=1)}}
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    fwd = model[0].forward
    with torch.no_grad():
        after = model(x)
    out[str(dtype)] = {"module": fwd.__func__.__module__, "file": fwd.__func__.__code__.co_filename,
                       "instance": "forward" in model[0].__dict__, "equal": bool(torch.equal(after, before)),
                       "err": (after.float() - before.float()).abs().max().item()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("interop-layers")
    with running_server(root / "store", token=TOKEN) as srv:
        result = publish(KERNEL, repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True,
                         skip_tpu_compile=True, log=lambda _: None)
        yield srv, result, root


def test_hf_kernels_kernelize_swaps_a_marked_rms_norm_onto_our_layer(published) -> None:
    server, result, root = published
    assert "torch-cpu" in result.variants
    server.reset()
    proc = subprocess.run([sys.executable, "-c", f"REPO = {REPO!r}\n{SCRIPT}"], env=hub_env(server, root / "cache"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for dtype, row in res.items():
        assert row["instance"], dtype  # the instance's forward, not the class's
        assert row["module"].endswith(".layers") and "/build/torch-cpu/" in Path(row["file"]).as_posix(), row
        assert row["equal"], (dtype, row["err"])  # Llama's op order, bit for bit, in f32 and bf16
    paths = [p for _, p, _ in hub_requests(server)]
    assert not [p for p in paths if "/build/jax-" in p]
