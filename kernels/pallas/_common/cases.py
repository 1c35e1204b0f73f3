"""Validation-case scaffolding: the fields every case has and how a case passes them to an entry.

A kernel's `validation.cases(backend, framework="jax")` returns these. A case makes fresh random inputs, calls the
*loaded* module and computes an independent reference; it produces actual and expected only, and kernel-hub's
harness owns the verdict (metric, tolerance by dtype unless `tolerance` is set, NaN/Inf never passing). Cases are
frozen dataclasses, so `dataclasses.replace(case, implementation=...)` is the same case under another choice.
NumPy only at import: the torch-cpu builds (no jax) load this module too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

DTYPES = ("float32", "bfloat16")
SHORT = {"float32": "f32", "bfloat16": "bf16"}
#: interpret modes a case may ask for: None (the entry's own policy), "fast" (interpret=True), "tpu" (the TPU
#: simulator with race detection, which raises on a race).
INTERPRET_MODES = (None, "fast", "tpu")


def tensor(x: np.ndarray, dtype: str, framework: str) -> Any:
    """A NumPy array as a `framework` ("jax" or "torch") array of `dtype` ("float32", "bfloat16", "int32")."""
    if framework == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype))
    import jax.numpy as jnp

    return jnp.asarray(x, dtype=dtype)


@dataclasses.dataclass(frozen=True)
class Case:
    """One validation case. Subclasses add the problem's fields and define inputs/call/reference."""

    name: str
    dtype: str  # "float32" | "bfloat16"
    implementation: str | tuple[str, ...] | None  # None: the entry's default order
    tags: tuple[str, ...]
    tolerance: float | None = None  # None: the harness's table for `dtype`
    framework: str = "jax"  # which entry the case calls: "jax" or "torch" tensors
    interpret: str | None = None  # see INTERPRET_MODES
    config: tuple[tuple[str, int], ...] = ()  # keyword arguments of the kernel's config class; () = its default

    def __post_init__(self) -> None:
        if self.interpret not in INTERPRET_MODES:
            raise ValueError(f"case {self.name}: interpret must be one of {INTERPRET_MODES}, got {self.interpret!r}")

    def inputs(self, seed: int) -> dict[str, Any]:
        """Fresh random inputs, deterministic in `seed`."""
        raise NotImplementedError

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        """The loaded module's entry on `inputs`: the actual output."""
        raise NotImplementedError

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        """The independent float64 reference: the expected output."""
        raise NotImplementedError

    def entry_options(self, module: Any, seed: int) -> dict[str, Any]:
        """The contract's keyword arguments for this case: implementation= and, when asked for, interpret=."""
        kw: dict[str, Any] = {"implementation": self.implementation}
        if self.interpret == "fast":
            kw["interpret"] = True
        elif self.interpret == "tpu":
            kw["interpret"] = module.race_checking_params(seed)
        return kw
