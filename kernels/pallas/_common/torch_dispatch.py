"""The `implementation=` contract for torch-facing entries: "torch" (native) or "jax" (the package's JAX entry:
through torch_jax's DLPack hand-over on CPU/CUDA, as a TorchTPU op on TPU tensors), tried in order per device type;
"jax" cannot run where jax is not installed."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from .dispatch import Dispatch

T = TypeVar("T")

IMPLEMENTATIONS: tuple[str, ...] = ("torch", "jax")
#: CPU: torch-native first (no hand-over); accelerators: the JAX kernels (Pallas on TPU) first.
ORDER: dict[str, tuple[str, ...]] = {"cpu": ("torch", "jax"), "cuda": ("jax", "torch"), "tpu": ("jax", "torch")}
FALLBACK: tuple[str, ...] = ("torch",)


def device_type(device: torch.device | str) -> str:
    """"cpu", "cuda", "tpu", ... for a torch.device, a device string ("cuda:1") or a backend name."""
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":")[0].lower()


def _why_not(name: str, platform: str, interpret: Any) -> str | None:
    del platform, interpret  # neither implementation is a Pallas call of ours: interpret= does not apply
    if name == "jax" and not _jax_installed():
        return "jax is not installed"
    return None


@functools.cache
def _jax_installed() -> bool:
    try:
        return importlib.util.find_spec("jax") is not None
    except (ImportError, ValueError):  # an import hook that refuses jax, or a half-initialised module
        return False


class TorchDispatch:
    """Dispatch keyed by device instead of platform name; the functions a torch entry exports."""

    def __init__(self, op: str, native: Callable[[], str], tpu_op: str | None = None) -> None:
        """`native()` describes the torch-native implementation for reports; `tpu_op` names the torch op the "jax"
        implementation calls on TPU tensors (torch_tpu_ops.py)."""
        self.op = op
        self._native = native
        self.tpu_op = tpu_op
        #: Set by a build that wants to say something about the device it was called on (the torch-tpu build on
        #: tensors that are not on a TPU): (entry, device type) -> a note for the trace (and a warning), or None.
        self.on_device: Callable[[str, str], str | None] | None = None
        self._dispatch = Dispatch(op, IMPLEMENTATIONS, ORDER, FALLBACK, why_not=_why_not)

    def exports(self) -> tuple[Callable[..., Any], ...]:
        """(implementations_for, resolve_implementation, last_implementation, describe): what the entry exports."""
        return self.implementations_for, self.resolve_implementation, self.last_implementation, self.describe

    def describe(self, device: torch.device | str) -> str:
        """Human-readable name of what runs on `device` by default (for reports)."""
        if self.resolve_implementation(device)[0] == "torch":
            return self._native()
        if device_type(device) == "tpu":
            return f"jax {self.op} (Pallas) as torch op {self.tpu_op or '?'} via torch_tpu jax_op"
        return f"jax {self.op} via DLPack"

    def implementations_for(self, device: torch.device | str) -> tuple[str, ...]:
        """Implementations tried, in order, for tensors on `device` when none is named."""
        return self._dispatch.implementations_for(device_type(device))

    def resolve_implementation(
        self, device: torch.device | str, implementation: str | Sequence[str] | None = None, *, interpret: Any = None
    ) -> tuple[str, str]:
        """(first implementation that can run on `device`, trace of why), without calling anything."""
        return self._dispatch.resolve_implementation(device_type(device), implementation, interpret=interpret)

    def last_implementation(self) -> tuple[str | None, str | None]:
        """(name, reason) of the most recent call in this thread / asyncio task (see Dispatch)."""
        return self._dispatch.last_implementation()

    def run(self, device: torch.device, implementation: str | Sequence[str] | None, call: Callable[[str], T], *,
            entry: str | None = None) -> T:
        """call(name) for the first implementation that runs on `device`; `entry` names the function for notes
        when one dispatch serves several (default: the op)."""
        kind = device_type(device)
        note = self.on_device(entry or self.op, kind) if self.on_device is not None else None
        return self._dispatch.run(kind, implementation, None, call, note=note)
