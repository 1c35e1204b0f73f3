"""The decode step as a release check: one layer group of each seed model's step (Qwen3: one layer; Gemma 4: five
sliding + one global), at the seed's batch and cache, compiled by libtpu for every 8-device slice, on the kernel
folders given (a candidate release of one kernel beside the others as they are). A kernel change that breaks the
whole step (a Mosaic refusal inside the shard_maps, a sharding the partitioner rejects, a signature the step calls
differently) is named here before it ships. One group instead of the full depth: the scan compiles one group body
whatever the depth, so the group is what can break, and it compiles in seconds instead of minutes.

kernel_hub's per-package compile gate (kernel_hub.tpu.compile_gate) compiles one package's own cases on one device;
this check spans three packages on a mesh, so it lives with the step in the checkout: `python bench/seed_decode.py
--gate` exits non-zero when it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .decode import decode_rows

if TYPE_CHECKING:
    from pathlib import Path

    from kernel_hub.json_types import JsonDict

GATE_MODELS = ("qwen3_30b_a3b", "gemma4_26b_a4b")
GATE_GENERATIONS = ("v6e", "v5e", "v7x")
GATE_BATCH, GATE_CACHE = 64, 768


def failures(rows: list[JsonDict], expected: int) -> list[str]:
    """One line per row that did not compile, or a line saying rows are missing; [] when the step compiles
    everywhere. Pure."""
    out = [f"{r['model']} on {r['mesh']}: {r.get('error') or 'not compiled'}" for r in rows if not r.get("compiled")]
    if len(rows) < expected:
        out.append(f"only {len(rows)} of {expected} gate compiles reported")
    return out


def step_gate(folders: dict[str, Path] | None = None, generations: tuple[str, ...] = GATE_GENERATIONS,
              run: Callable[..., Any] | None = None, env: Any = None) -> tuple[list[JsonDict], list[str]]:
    """(rows, failures) of the one-group step of both seed models on the hub path, compiled for each slice."""
    kw = {"run": run} if run is not None else {}
    rows = decode_rows(GATE_MODELS, (GATE_BATCH,), (GATE_CACHE,), generations, ("hub",), compile_only=True,
                       groups=1, folders=folders, env=env, **kw)
    return rows, failures(rows, len(GATE_MODELS) * len(generations))


__all__ = ["failures", "step_gate"]
