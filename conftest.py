"""Load PyPI's `kernels` before any test module under kernels/pallas/ is imported.

With --import-mode=importlib pytest names those modules `kernels.pallas.<k>.tests.test_x` and registers the
missing parents as empty modules: an empty `kernels` would then shadow HF's `kernels` for every later test.
"""

import contextlib

with contextlib.suppress(ImportError):
    import kernels  # noqa: F401
