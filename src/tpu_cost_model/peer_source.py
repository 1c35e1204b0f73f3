"""Peers' kernel source read at bench time from a folder the user names, never kept in this repository.

Some measured kernels are newer than any wheel that installs beside our jax (tpu-inference's megablox gmm_v2,
Tokamax's v2 grouped matmul): the calibration bench reads their source from a checkout or a fetched git mirror
(`bench/tpu_calibration.py --peer-source DIR`), records which repository and commit it read, and the TPU worker
runs that text as a module for the walker to trace. Host side: `read_peer_sources`; worker side: `load_peer`.

A kernel that asks jax for an API this jax lacks gets the smallest stand-in that means the same thing, applied only
while that kernel is traced (`peer_shims`) and named in every row it touches.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_hub.json_types import JsonDict

#: The peer kernels the calibration reads from source: key -> (repository, path in it).
PEER_FILES = {
    "tpu_inference_gmm_v2": ("vllm-project/tpu-inference", "tpu_inference/kernels/megablox/gmm_v2.py"),
    "tokamax_gmm_v2": ("openxla/tokamax", "tokamax/_src/ops/experimental/gmm_v2/gmm_v2.py"),
}


class PeerSourceMissing(LookupError):
    """A peer kernel the calibration needs whose source no --peer-source folder holds."""


def _git(folder: Path, *args: str) -> str | None:
    """`git <args>` on a checkout or a bare mirror; None when it is neither or the command fails."""
    for flag in (["-C", str(folder)], ["--git-dir", str(folder)]):
        done = subprocess.run(["git", *flag, *args], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return done.stdout
    return None


def read_peer_sources(folders: list[Path]) -> JsonDict:
    """Every PEER_FILES kernel found in `folders` (a git checkout or bare mirror: its HEAD; a plain folder: the
    file on disk): key -> {repo, path, commit, text}. The first folder holding a file wins."""
    found: JsonDict = {}
    for folder in folders:
        commit = _git(folder, "rev-parse", "HEAD")
        for key, (repo, path) in PEER_FILES.items():
            if key in found:
                continue
            text = _git(folder, "show", f"HEAD:{path}") if commit else None
            if text is None and (folder / path).is_file():
                text = (folder / path).read_text()
            if text is not None:
                found[key] = {"repo": repo, "path": path, "text": text,
                              "commit": commit.strip() if commit else "unknown (a plain folder, not a git checkout)"}
    return found


def provenance(source: JsonDict) -> str:
    """One line naming what was read: repository, commit, path."""
    return f"{source['repo']}@{source['commit'][:12]}:{source['path']}"


def load_peer(sources: JsonDict, key: str) -> types.ModuleType:
    """The peer kernel `key` as a module run from the source text the bench read (worker side)."""
    if key not in sources:
        repo, path = PEER_FILES[key]
        raise PeerSourceMissing(f"no --peer-source folder holds {repo}'s {path}")
    name = f"_peer_{key}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = f"<{provenance(sources[key])}>"
    sys.modules[name] = module  # its dataclasses look their module up while being made
    try:
        code = compile(sources[key]["text"], module.__file__, "exec")
        exec(code, module.__dict__)  # the peer's kernel, as read at bench time
    except BaseException:
        del sys.modules[name]
        raise
    return module


def missing_apis() -> list[str]:
    """The jax APIs the peer kernels call that this jax lacks (each gets a stand-in in peer_shims)."""
    from jax.experimental.pallas import tpu as pltpu

    return [] if hasattr(pltpu, "TensorCoreMesh") else ["jax.experimental.pallas.tpu.TensorCoreMesh"]


@contextlib.contextmanager
def peer_shims() -> Iterator[list[str]]:
    """While a peer kernel is traced: `pltpu.TensorCoreMesh(axis_name=...)` (newer jax: the mesh of the device's
    TensorCores, what `pl.kernel` runs a kernel over) stands in as this jax's `create_tensorcore_mesh` over one
    core, the one TensorCore the model times (a v5e or v6e chip has one). Yields the stand-ins applied."""
    from jax.experimental.pallas import tpu as pltpu

    applied = missing_apis()
    if applied:
        pltpu.TensorCoreMesh = lambda axis_name: pltpu.create_tensorcore_mesh(axis_name, num_cores=1)
    try:
        yield [f"{api} -> create_tensorcore_mesh(axis_name, num_cores=1)" for api in applied]
    finally:
        if applied:
            del pltpu.TensorCoreMesh
