"""Where the TPU environment is: the Python that has libtpu, and the jax/libtpu versions it holds.

libtpu stays out of the main environment (it prints TPU-init errors in any process that loads it), so the
compile gate and the cost model run in a subprocess of that Python. Found, in order: $KERNEL_HUB_TPU_PYTHON,
then the checkout's .venv-tpu (what `make setup-tpu` creates), only when kernel_hub runs from a checkout
(kernel_hub.package.checkout: an installed package never takes a .venv-tpu found near it), then the environment
`kernel-hub setup-tpu` builds for an installed kernel-hub (setup_env.default_dir: $KERNEL_HUB_CACHE/tpu-env).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..decide.system import cache_root
from ..errors import KernelHubError
from ..package.checkout import checkout_root
from .capped_run import run_capped

ENV_VAR = "KERNEL_HUB_TPU_PYTHON"
#: The checkout kernel_hub runs from (an editable install), or None when it runs installed.
CHECKOUT: Path | None = checkout_root()
SETUP_HINT = ("run `kernel-hub setup-tpu` (builds it once, ~700 MB, in $KERNEL_HUB_CACHE/tpu-env), or set "
              "KERNEL_HUB_TPU_PYTHON to a Python that has jax and libtpu")
#: Where `kernel-hub setup-tpu` builds the TPU environment unless told otherwise.
SETUP_DIR_NAME = "tpu-env"


def setup_dir() -> Path:
    """The folder `kernel-hub setup-tpu` builds by default (beside kernel-hub's other caches)."""
    return cache_root(SETUP_DIR_NAME)


class TpuEnvironmentError(KernelHubError):
    """No usable TPU environment (a Python with jax and libtpu)."""


@dataclass(frozen=True)
class TpuEnv:
    python: Path
    jax_version: str
    libtpu_version: str


def find_tpu_python(environ: Mapping[str, str] | None = None, checkout: Path | None = CHECKOUT,
                    built: Path | None = None) -> Path:
    """The TPU environment's Python, or TpuEnvironmentError saying how to create one. `built`: the folder
    `kernel-hub setup-tpu` builds (None: setup_dir())."""
    environ = os.environ if environ is None else environ
    given = environ.get(ENV_VAR)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise TpuEnvironmentError(f"{ENV_VAR}={given} is not an executable Python; {SETUP_HINT}")
        return path
    local = checkout / ".venv-tpu" / "bin" / "python" if checkout is not None else None
    if local is not None and local.is_file() and os.access(local, os.X_OK):
        return local
    made = (built if built is not None else setup_dir()) / "bin" / "python"
    if made.is_file() and os.access(made, os.X_OK):
        return made
    raise TpuEnvironmentError(f"no TPU environment (a Python with jax and libtpu): {SETUP_HINT}")


_PROBE = (
    "import importlib.metadata as m, json\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except m.PackageNotFoundError: return None\n"
    "print(json.dumps({'jax': v('jax'), 'libtpu': v('libtpu') or v('libtpu-nightly')}))\n"
)


#: What the version probe may print and take: its answer is one short JSON line, a few seconds' work.
PROBE_MAX_BYTES = 64 << 10
PROBE_TIMEOUT = 60.0


def probe_answer(stdout: bytes) -> tuple[str | None, str | None]:
    """(jax, libtpu) versions from the probe's output: its last line, a JSON object of strings (or nulls). Pure.

    Raises:
        ValueError: anything else (no line, not JSON, not an object, a version that is not a short string).
    """
    lines = stdout.decode(errors="replace").strip().splitlines()
    if not lines:
        raise ValueError("no output")
    found = json.loads(lines[-1])
    if not isinstance(found, dict):
        raise ValueError(f"a JSON {type(found).__name__}, not an object")
    versions = found.get("jax"), found.get("libtpu")
    if not all(v is None or (isinstance(v, str) and 0 < len(v) <= 64) for v in versions):
        raise ValueError("versions that are not short strings")
    return versions


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> tuple[str | None, str | None]:
    try:
        done = run_capped([python, "-c", _PROBE], timeout=PROBE_TIMEOUT, max_bytes=PROBE_MAX_BYTES)
        if done.problem is not None:
            raise ValueError(done.problem)
        return probe_answer(done.stdout)
    except (OSError, ValueError, RecursionError) as exc:
        raise TpuEnvironmentError(f"{python} did not answer the version probe ({str(exc)[:200]}); {SETUP_HINT}"
                                  ) from None


def tpu_env(environ: Mapping[str, str] | None = None, checkout: Path | None = CHECKOUT,
            built: Path | None = None) -> TpuEnv:
    """The TPU environment and its versions (read from package metadata: no jax import, ~50 ms)."""
    python = find_tpu_python(environ, checkout, built)
    jax_version, libtpu_version = _probe(str(python))
    if not jax_version or not libtpu_version:
        missing = " and ".join(n for n, v in (("jax", jax_version), ("libtpu", libtpu_version)) if not v)
        raise TpuEnvironmentError(f"{python} has no {missing}; {SETUP_HINT}")
    return TpuEnv(python, jax_version, libtpu_version)
