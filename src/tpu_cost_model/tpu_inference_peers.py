"""vLLM's TPU kernels as a user installs them (tpu-inference 0.32.0, `pip install --no-deps` into .venv-tpu),
imported for the cost model's walker. Runs in the TPU environment's subprocesses only.

Two things stand between the installed wheel and its kernels on this machine, both handled here and nowhere else:
  * `tpu_inference/logger.py` imports `vllm.logger`: the stand-in under stand_ins/vllm goes first on sys.path
    (this process only);
  * the package's own `__init__` sets XLA_FLAGS / LIBTPU_INIT_ARGS and asks GCE metadata about the host (it imports
    `requests`, not installed): the kernels' modules are imported under a bare `tpu_inference` package object (its
    real path, its `__init__` not run), so nothing else of the wheel executes.
Modules that still do not import (e.g. everything under `tpu_inference.utils`, which imports torchax and
`vllm.envs` / `vllm.utils`) are reported with the first line of their error by `import_kernel`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

STAND_INS = Path(__file__).parent / "stand_ins"

#: The kernels the peers and the calibration walk: name -> module under tpu_inference.
KERNELS = {
    "rpa_v3": "kernels.ragged_paged_attention.v3.kernel",
    "rpa_v3_hd64": "kernels.ragged_paged_attention.v3.kernel_hd64",
    "megablox_gmm": "kernels.megablox.gmm",
    "fused_moe_v1": "kernels.fused_moe.v1.kernel",
    "gmm_v2_gather_scatter": "kernels.experimental.fused_moe.gmm_v2_gather_scatter",
    "gmm_v2_ag_rs": "kernels.experimental.fused_moe.gmm_fused.gmm_v2_ag_rs",
    "gmm_v2_fused_rs": "kernels.experimental.fused_moe.gmm_fused_rs_nodedup",
}


class PeerUnavailable(ImportError):
    """A tpu-inference kernel that does not import here, with the reason in one line."""


def _bare_package() -> None:
    if "tpu_inference" in sys.modules:
        return
    spec = importlib.util.find_spec("tpu_inference")
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailable("tpu-inference is not installed in this environment "
                              "(.venv-tpu/bin/pip install --no-deps tpu-inference==0.32.0)")
    pkg = types.ModuleType("tpu_inference")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["tpu_inference"] = pkg


def import_kernel(name: str) -> Any:
    """The installed tpu-inference kernel module `name` (a key of KERNELS); PeerUnavailable naming why not."""
    if name not in KERNELS:
        raise ValueError(f"unknown tpu-inference kernel {name!r}; known: {', '.join(KERNELS)}")
    if str(STAND_INS) not in sys.path:
        sys.path.insert(0, str(STAND_INS))
    _bare_package()
    try:
        return importlib.import_module("tpu_inference." + KERNELS[name])
    except Exception as exc:  # an import-time dependency this environment lacks: the reason is the result
        text = str(exc).strip().splitlines()
        raise PeerUnavailable(f"tpu_inference.{KERNELS[name]} does not import: {type(exc).__name__}: "
                              f"{text[0] if text else ''}") from exc


#: TPU version numbers as tpu-inference's kernels ask for them (util.get_tpu_version).
_TPU_VERSION = {"v4": 4, "v5e": 5, "v5p": 5, "v6e": 6, "v7x": 7}


@contextlib.contextmanager
def as_chip(module: ModuleType, generation: str) -> Iterator[None]:
    """The kernel module's own chip query (`get_tpu_version`, which reads jax.devices()[0]: the CPU host under a
    mock TPU, so -1) answers for `generation` while a call is traced: chip facts injected, not asked."""
    saved = getattr(module, "get_tpu_version", None)
    if saved is not None:
        module.get_tpu_version = lambda: _TPU_VERSION[generation]
    try:
        yield
    finally:
        if saved is not None:
            module.get_tpu_version = saved


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tpu-inference")
    except PackageNotFoundError:
        return None
