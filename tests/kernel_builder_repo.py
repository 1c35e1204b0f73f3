"""Kernel repos in the layout the Hub's build tool (kernel-builder) publishes, written by kernel-hub's own tests
(test gear: not in the library; no code of Hugging Face's is copied here).

A variant is `build/<variant>/` with `metadata.json` (name, id, version, license, backend, build-layout,
kernels-minver, python-depends, kernel-depends and a `digest`: sha256, base64, of every file but metadata.json)
and the package as `build/<variant>/<name>/`, at `build/<variant>/` itself ("root") or zipped as
`build/<variant>/<id>.zip` ("zip"). `publish` commits a folder to a `kernel-hub serve` store and points a `v1`
branch at it, with no release tags, as kernel-builder repos are.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import platform
import zipfile
from pathlib import Path
from typing import Any

import torch

NOT_HASHED = ("metadata.json", "metadata.json.sigstore")


def kernel_digest(variant_dir: Path) -> dict[str, str]:
    """kernel-builder's digest of a variant folder, computed here: base64 sha256 of every file but its
    metadata (and Python's caches), by POSIX path relative to the folder."""
    out = {}
    for path in sorted(p for p in variant_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(variant_dir).as_posix()
        if rel in NOT_HASHED or "__pycache__" in rel.split("/"):
            continue
        out[rel] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    return out


def write_variant(repo_dir: Path, variant: str, name: str, files: dict[str, str], *, layout: str = "package",
                  backend: str = "cpu", digest: bool = True, python_depends: tuple[str, ...] = (),
                  kernel_depends: tuple[dict[str, Any], ...] = (), kernels_minver: str = "0.19.1",
                  version: int = 1, extra: dict[str, str] | None = None) -> Path:
    """One variant folder under `repo_dir/build/`; `files` are the package's (path -> text), `extra` other files
    of the variant (beside metadata.json). Returns the variant folder."""
    folder = repo_dir / "build" / variant
    python_name = name.replace("-", "_")
    content = hashlib.sha256(json.dumps([layout, sorted(files.items())]).encode()).hexdigest()[:10]
    kid = f"_{python_name}_{variant.replace('-', '_').replace('.', '_')}_{content}"  # unique per build, as HF wants
    folder.mkdir(parents=True)
    if layout == "zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as archive:
            for rel, text in sorted(files.items()):
                info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
                archive.writestr(info, text)
        (folder / f"{kid}.zip").write_bytes(buf.getvalue())
    else:
        base = folder / python_name if layout == "package" else folder
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    for rel, text in (extra or {}).items():
        (folder / rel).write_text(text)
    meta: dict[str, Any] = {"name": name, "id": kid, "version": version, "license": "Apache-2.0",
                            "backend": {"type": backend}, "build-layout": "zip" if layout == "zip" else "files",
                            "kernels-minver": kernels_minver, "python-depends": list(python_depends),
                            "kernel-depends": list(kernel_depends)}
    if digest:
        meta["digest"] = {"algorithm": "sha256", "files": kernel_digest(folder)}
    (folder / "metadata.json").write_text(json.dumps(meta, indent=2))
    return folder


def publish(api: Any, repo_id: str, folder: Path, branches: tuple[str, ...] = ("v1",)) -> str:
    """Commit `folder` to `repo_id` on main and point each branch at that commit (no tags). -> the commit."""
    api.create_repo(repo_id, repo_type="kernel", exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, repo_type="kernel", folder_path=folder, commit_message="build").oid
    for branch in branches:
        api.create_branch(repo_id, branch=branch, repo_type="kernel", revision=commit, exist_ok=True)
    return commit


# -- our test kernels ---------------------------------------------------------------------------------------------

def relu_files(marker: str) -> dict[str, str]:
    """A torch relu with a submodule (relative import) and a marker saying which variant ran."""
    return {"__init__.py": "from ._ops import VARIANT, relu\n\n__all__ = ['VARIANT', 'relu']\n",
            "_ops.py": f"import torch\n\nVARIANT = {marker!r}\n\n\ndef relu(x):\n    return torch.clamp(x, min=0)\n"}


RAGGED_TPU = '''"""kernel-hub's kernel-builder test kernel for TorchTPU: a ragged dot and a whole MoE experts forward
(transformers' experts-function convention), each ONE JAX function registered as a torch op through torch_tpu's
jax_op."""

import jax
import jax.numpy as jnp
import torch
import torch_tpu  # noqa: F401  (sets torch.tpu)

__all__ = ["experts_forward", "experts_jax", "ragged_dot", "ragged_dot_jax"]
_NAMESPACE = "kh_kbtest_ragged_tpu"


def ragged_dot_jax(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """lhs [M,K] rows grouped in order, rhs [G,K,N], group_sizes [G] -> [M,N] (rows past the groups: zero)."""
    out = jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), preferred_element_type=jnp.float32)
    return out.astype(lhs.dtype)


def experts_jax(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array, gate_up: jax.Array,
                down: jax.Array) -> jax.Array:
    """hidden [T,H], top_k_index/weights [T,K] (index == E: an expert of another rank, never computed),
    gate_up [E,2I,H] gate first, down [E,H,I] -> [T,H]: routing sort, both ragged dots, SiLU gate, combine."""
    tokens, k = top_k_index.shape
    experts = gate_up.shape[0]
    flat = top_k_index.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True)
    rows = order // k
    sizes = jnp.bincount(flat, length=experts + 1)[:experts].astype(jnp.int32)
    gate, up = jnp.split(ragged_dot_jax(hidden[rows], jnp.swapaxes(gate_up, 1, 2), sizes).astype(jnp.float32), 2,
                         axis=-1)
    act = (jax.nn.silu(gate) * up).astype(hidden.dtype)
    y = ragged_dot_jax(act, jnp.swapaxes(down, 1, 2), sizes).astype(jnp.float32)
    weights = top_k_weights.reshape(-1)[order].astype(jnp.float32)
    weights = jnp.where(flat[order] < experts, weights, 0.0)
    out = jnp.zeros((tokens, hidden.shape[1]), jnp.float32).at[rows].add(y * weights[:, None])
    return out.astype(hidden.dtype)


_ragged_op = torch.tpu.pallas.jax_op(f"{_NAMESPACE}::ragged_dot", ragged_dot_jax)
_experts_op = torch.tpu.pallas.jax_op(f"{_NAMESPACE}::experts", experts_jax)


def ragged_dot(lhs, rhs, group_sizes):
    return _ragged_op(lhs, rhs, group_sizes)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    return _experts_op(hidden_states, top_k_index.to(torch.int32), top_k_weights.to(hidden_states.dtype),
                       self.gate_up_proj, self.down_proj)
'''


def here_arch(torch_minor_offset: int = 0, machine: str | None = None, legacy: bool = False) -> str:
    """An arch variant name for this machine's torch (minor shifted by `torch_minor_offset`) and CPU."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    minor += torch_minor_offset
    cpu = machine or platform.machine()
    if legacy:
        return f"torch{major}{minor}-cxx11-cpu-{cpu}-linux"
    return f"torch-{major}.{minor}-cxx11-cpu-cpython-3.11-abi3-{cpu}-linux"


def arch_repo(root: Path) -> Path:
    """Arch and noarch builds of one relu: here the new-style arch name wins; a simulated TPU takes torch-tpu."""
    for variant in (here_arch(), here_arch(legacy=True), here_arch(-1), here_arch(machine="aarch64" if
                    platform.machine() != "aarch64" else "x86_64"), "torch-cpu"):
        write_variant(root, variant, "kb-relu", relu_files(variant))
    write_variant(root, "torch-tpu", "kb-relu", relu_files("torch-tpu"), backend="tpu")
    return root
