"""The torch-cpu builds of our kernels run where jax is not installed, and pass their validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

NO_JAX = """
import sys

class BlockJax:
    def find_spec(self, name, path=None, target=None):
        if name == "jax" or name.startswith(("jax.", "jaxlib")):
            raise ImportError(f"{name} is not installed here")

sys.meta_path.insert(0, BlockJax())
import kernel_hub as kh
m = kh.get_kernel(REPO, version=1, framework="torch", backend="cpu")
report = kh.validate(m, backend="cpu")
print(m.__kernel_hub__.variant, report.passed, len(report.cases))
print(sorted({k.split(".")[0] for k in sys.modules if k.startswith("jax")}))
"""


@pytest.mark.parametrize("repo", ["kernel-hub/ragged-dot-tpu", "kernel-hub/flash-attention-tpu"])
def test_torch_cpu_build_loads_and_validates_without_jax(repo):
    code = f"REPO = {repo!r}\n{NO_JAX}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    variant, passed, n = first.split()
    assert (variant, passed) == ("torch-cpu", "True") and int(n) >= 10
    assert second == "[]"
