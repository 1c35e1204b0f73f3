"""The test that matters most: PyPI's `kernels` 0.19.1 loads the ragged dot we published to `kernel-hub serve`
and computes the same numbers as our own loader (by major version and by range) and a plain reference."""

from __future__ import annotations

from pathlib import Path

from tests.hub_interop import KERNELS

REPO = "acme/ragged-dot-tpu"
INTEROP_KERNELS = {REPO: KERNELS / "ragged_dot"}  # published by the interop_hub fixture (tests/conftest.py)

INPUTS = """
import torch
g = torch.Generator().manual_seed(0)
lhs = torch.randn(40, 32, generator=g)
rhs = torch.randn(4, 32, 16, generator=g)
group_sizes = torch.tensor([10, 0, 17, 9], dtype=torch.int32)  # an empty group; 4 rows past the end
ref = torch.zeros(40, 16)
start = 0
for i, size in enumerate(group_sizes.tolist()):
    ref[start:start + size] = lhs[start:start + size] @ rhs[i]
    start += size
"""

HF_KERNELS = INPUTS + """
import json, kernels
m = kernels.get_kernel(REPO, version=1)
out = m.ragged_dot(lhs, rhs, group_sizes)
print(json.dumps({"file": m.__file__, "err": (out - ref).abs().max().item(), "out": out.flatten().tolist()}))
"""

OURS = INPUTS + """
import json
import kernel_hub as kh
res = {}
for spec in (1, ">=1.0,<2"):
    m = kh.get_kernel(REPO, version=spec, framework="torch", backend="cpu", trust_remote_code=True)
    out = m.ragged_dot(lhs, rhs, group_sizes)
    info = m.__kernel_hub__
    res[str(spec)] = {"variant": info.variant, "commit": info.commit, "version": info.version,
                      "err": (out - ref).abs().max().item(), "out": out.flatten().tolist()}
print(json.dumps(res))
"""


def test_hf_kernels_and_kernel_hub_compute_the_same_numbers(interop_hub) -> None:
    result = interop_hub.results[REPO]
    assert "torch-cpu" in result.variants and result.branch == "v1"

    interop_hub.reset()
    theirs = interop_hub.run(HF_KERNELS, cache="hf-cache", REPO=REPO)
    hf_requests = interop_hub.requests()
    assert "/build/torch-cpu/" in Path(theirs["file"]).as_posix()  # HF kernels picked our torch-cpu build
    assert theirs["err"] <= 1e-4
    assert any(p == f"/api/organizations/{REPO.split('/')[0]}/overview" for _, p, _ in hf_requests)
    # HF kernels never touches the JAX builds or our bundles.
    assert not [p for _, p, _ in hf_requests if p.endswith(".tar") or "/build/jax-" in p]

    interop_hub.reset()
    ours = interop_hub.run(OURS, cache="our-cache", REPO=REPO)
    our_requests = interop_hub.requests()
    by_major, by_range = ours["1"], ours[">=1.0,<2"]
    assert by_major["variant"] == by_range["variant"] == "torch-cpu"
    assert by_major["commit"] == by_range["commit"] == result.commit
    assert by_major["version"] == result.version  # the release just published (kernel.yaml's version)
    assert by_major["err"] <= 1e-4
    assert by_major["out"] == by_range["out"]
    diff = max(abs(a - b) for a, b in zip(theirs["out"], by_major["out"], strict=True))
    assert diff <= 1e-6
    # Fresh load: refs, one bundle (HEAD + GET), the build/ listing (a tree beside the bundle would win, as in HF
    # kernels) = 4; the range load reuses all but the refs.
    assert [m for m, _, _ in our_requests] == ["GET", "HEAD", "GET", "GET", "GET"], our_requests
    assert our_requests[0][1] == our_requests[4][1] == f"/api/kernels/{REPO}/refs"
    assert "/tree/" in our_requests[3][1] and our_requests[3][1].endswith("/build")
    assert len(our_requests) < len(hf_requests)
