"""A seed model's whole decode step on an 8-device TPU slice, without a TPU: compiled by libtpu for the mock slice
and modeled op by op (decode_worker.py does both in the TPU environment). `decode_rows(...)` is the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kernel_hub.tpu.env import CHECKOUT, TpuEnv, TpuEnvironmentError, tpu_env
from kernel_hub.tpu.package import folder_package

from .worker import run_in_worker

if TYPE_CHECKING:
    from pathlib import Path

    from kernel_hub.json_types import JsonDict

#: The kernels the step runs on: request key -> the checkout's kernel folder.
KERNELS = ("rms_norm", "flash_attention", "ragged_dot")


def kernel_folders(root: Path | None = CHECKOUT) -> dict[str, Path]:
    if root is None:
        raise TpuEnvironmentError("the decode step needs the kernel folders: run from a kernel-hub checkout")
    return {k: root / "kernels" / "pallas" / k for k in KERNELS}


def decode_rows(models: tuple[str, ...], batches: tuple[int, ...], caches: tuple[int, ...],
                generations: tuple[str, ...], paths: tuple[str, ...], *, model_only: bool = False,
                compile_only: bool = False, groups: int | None = None, compile_keys: list | None = None,
                env: TpuEnv | None = None, folders: dict[str, Path] | None = None,
                run: Callable[..., tuple[list[JsonDict], int, str]] = run_in_worker,
                timeout: float = 3600) -> list[JsonDict]:
    """One row per (generation, model, batch, cache, path); see decode_worker.run_decode. Raises
    TpuEnvironmentError when the worker fails."""
    env = env or tpu_env()
    folders = folders or kernel_folders()
    # each kernel folder's TPU build, hashed here; the worker imports them only against these digests
    request = {"mode": "decode", **{k: folder_package(folders[k]).request() for k in KERNELS},
               "models": list(models), "batches": list(batches), "caches": list(caches),
               "generations": list(generations), "paths": list(paths), "model_only": model_only,
               "compile_only": compile_only, "groups": groups, "compile": compile_keys}
    events, status, stderr = run(env, request, timeout=timeout)
    rows = [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "row"]
    if status != 0:
        tail = " | ".join([ln for ln in stderr.splitlines() if ln.strip()][-3:])
        raise TpuEnvironmentError(f"the TPU decode worker failed (exit {status}): {tail}")
    return rows


__all__ = ["decode_rows"]
