"""Set-up that must precede every import in the test session.

- Tests never reach the real Hub: anything not pointed at a test server goes to a closed loopback port, and
  caches go to throwaway folders. Set before huggingface_hub is imported (it reads these once).
- Load PyPI's `kernels` before any test module under kernels/pallas/ is imported: with --import-mode=importlib
  pytest names those modules `kernels.pallas.<k>.tests.test_x` and registers missing parents as empty
  modules, and an empty `kernels` would shadow HF's `kernels` for every later test.
"""

import contextlib
import os
import tempfile

os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kh-tests-hf-")
os.environ["KERNEL_HUB_CACHE"] = tempfile.mkdtemp(prefix="kh-tests-cache-")

with contextlib.suppress(ImportError):
    import kernels  # noqa: F401
