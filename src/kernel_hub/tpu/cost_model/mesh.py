"""An MoE layer on an 8-chip TPU slice, without a TPU: compiled by libtpu for a mock v5e-8 / v6e-8 and modeled
(mesh_worker.py does both in the TPU environment). `mesh_rows(...)` is the entry; `whole_model(row)` extends a
row's compiled per-chip memory to every MoE layer of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..env import CHECKOUT, TpuEnv, TpuEnvironmentError, tpu_env
from ..package import folder_package
from ..worker_client import run_worker

#: MoE layers per model (every layer of both is an MoE layer; the models' config.json `num_hidden_layers`).
MOE_LAYERS = {"qwen3_30b_a3b": 48, "gemma4_26b_a4b": 30}
#: The checkout's ragged-dot kernel folder; None when kernel_hub runs installed (pass kernel_dir then).
RAGGED_DOT_DIR: Path | None = CHECKOUT / "kernels" / "pallas" / "ragged_dot" if CHECKOUT is not None else None


def mesh_rows(generations: tuple[str, ...], models: tuple[str, ...], *, phases: dict[str, int] | None = None,
              layouts: tuple[str, ...] | None = None, capacity_factors: tuple[float | None, ...] | None = None,
              model_only: bool = False, grad_layouts: tuple[str, ...] = (), env: TpuEnv | None = None,
              kernel_dir: Path | None = RAGGED_DOT_DIR,
              run: Callable[..., tuple[list[dict[str, Any]], int, str]] = run_worker,
              timeout: float = 1800) -> list[dict[str, Any]]:
    """One row per (generation, model, phase, layout, capacity factor): modeled seconds and, unless `model_only`,
    the compiled per-chip memory (for `grad_layouts`, also the backward's, as bwd_*). Raises TpuEnvironmentError
    when the worker fails."""
    if kernel_dir is None:
        raise TpuEnvironmentError("the mesh rows need the ragged-dot kernel's folder: pass kernel_dir, or run from a "
                                  "kernel-hub checkout")
    env = env or tpu_env()
    # the kernel folder's TPU build, hashed here; the worker imports it only against these digests
    request = {"mode": "mesh", "ragged_dot": folder_package(kernel_dir).request(), "generations": list(generations),
               "models": list(models), "phases": phases, "layouts": list(layouts) if layouts else None,
               "capacity_factors": list(capacity_factors) if capacity_factors else None,
               "model_only": model_only, "grad_layouts": list(grad_layouts), "layers": MOE_LAYERS,
               "dtype": "bfloat16"}
    events, status, stderr = run(env, request, timeout=timeout)
    rows = [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "row"]
    if status != 0 or not any(e.get("event") == "done" for e in events):
        tail = " | ".join([ln for ln in stderr.splitlines() if ln.strip()][-3:])
        raise TpuEnvironmentError(f"the TPU mesh worker failed (exit {status}): {tail}")
    return [{**r, **whole_model(r)} for r in rows]


def whole_model(row: dict[str, Any]) -> dict[str, Any]:
    """Per-chip bytes of all the model's MoE layers: every layer's expert weights stay resident, one layer's
    activations, temporaries and output exist at a time (layers run one after another)."""
    if not row.get("compiled") or row.get("layers") is None or "argument_bytes" not in row:
        return {}
    layer = row["argument_bytes"] + row["temp_bytes"] + row["output_bytes"]
    total = row["layers"] * row["weight_bytes"] + layer - row["weight_bytes"]
    return {"layer_bytes_per_chip": layer, "model_bytes_per_chip": total, "fits_hbm": total <= row["hbm_bytes"]}


__all__ = ["MOE_LAYERS", "TpuEnvironmentError", "mesh_rows", "whole_model"]
