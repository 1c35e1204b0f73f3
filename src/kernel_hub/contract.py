"""The kernel contract: what every kernel package exports, written as Protocols (prose: docs/kernel-contract.md).

kernel-hub's harness, kernelize and the TPU compile gate call kernels only through these names, and
tests/test_kernel_contract.py holds every kernel in registry.yaml to them by behaviour. Typing only: importing this
module imports no framework.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

#: `implementation=`: None (the platform's default order), a name, or names tried in order.
Implementation = str | Sequence[str] | None
#: What a validation case's `dtype` may be.
CASE_DTYPES = ("float32", "bfloat16", "float16")
#: Names every entry module (JAX or torch) exports, besides its op functions.
ENTRY_NAMES = ("IMPLEMENTATIONS", "ORDER", "implementations_for", "resolve_implementation", "last_implementation")
#: Names an entry with Pallas implementations of its own ("pallas" in IMPLEMENTATIONS) exports too.
PALLAS_NAMES = ("races_found", "race_checking_params", "run_race_checked", "RaceDetectedError")
#: The module of every package that holds its validation cases.
VALIDATION_MODULE = "validation"


@runtime_checkable
class Case(Protocol):
    """One validation case: a frozen dataclass, so `dataclasses.replace(case, implementation=...)` is the same
    problem under another implementation choice. It produces actual and expected only; the harness owns the
    verdict (numerics.py: metric, tolerance by dtype unless `tolerance` is set, NaN/Inf never passing)."""

    name: str  # unique within one cases() list
    dtype: str  # one of CASE_DTYPES: the dtype of the result, which picks the tolerance
    implementation: Implementation  # passed to the entry as implementation=
    tags: tuple[str, ...]  # "decode", "prefill", "edge", "oracle", "interpret", "tpu_interpret", ...
    tolerance: float | None  # None: the harness's table for dtype

    def inputs(self, seed: int) -> dict[str, Any]:
        """Fresh random inputs, deterministic in `seed`."""
        ...

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        """The loaded module's entry on `inputs` (the actual result, any array type)."""
        ...

    def reference(self, inputs: dict[str, Any]) -> Any:
        """The independent reference (NumPy float64 or f32 JAX at HIGHEST precision): the expected result."""
        ...


@runtime_checkable
class ValidationModule(Protocol):
    """`<package>.validation`: one signature for every kernel; the harness calls it without inspecting it."""

    def cases(self, backend: str, framework: str = "jax") -> list[Case]:
        """Cases for `backend` ("cpu", "tpu", "cuda", ...) and the entry taking `framework` tensors ("jax" or
        "torch"); an empty list where the package has no such entry."""
        ...


@runtime_checkable
class KernelEntry(Protocol):
    """What a JAX entry (`__init__.py`) and a torch entry (`torch_api.py`) both export, besides their op functions
    (e.g. `ragged_dot`, `flash_attention`, `decode_attention`; same names and meaning on torch tensors).

    Every op function takes `implementation=` (a name or a sequence of names tried in order, the first that can run
    wins; unknown names raise ValueError naming the known ones) and the same dtype policy in both entries. A JAX
    entry's op functions also take `interpret=` (None: compile with Mosaic on a TPU, interpret elsewhere; True:
    Pallas' fast interpreter; a pltpu.InterpretParams: the TPU simulator; False: always lower to Mosaic, even on a
    host without a TPU), and take the platform from where their operands live, not only jax.default_backend().
    """

    IMPLEMENTATIONS: tuple[str, ...]  # every name implementation= accepts
    ORDER: Mapping[str, tuple[str, ...]]  # platform -> names tried when none is given, best first

    def implementations_for(self, backend: Any) -> tuple[str, ...]:
        """The default order for a platform name (torch entries: also a torch.device), best first."""
        ...

    def resolve_implementation(self, backend: Any, implementation: Implementation = None, *,
                               interpret: Any = None) -> tuple[str, str]:
        """(the name that would run, the trace of why), calling nothing; ValueError for an unknown name,
        NotImplementedError (with the trace) when none can run."""
        ...

    def last_implementation(self) -> tuple[str | None, str | None]:
        """(name, trace) of the most recent call of this entry in this process (at trace time under jit)."""
        ...


@runtime_checkable
class PallasEntry(KernelEntry, Protocol):
    """A JAX entry with Pallas implementations of its own: race checks that fail loudly."""

    def races_found(self) -> bool:
        """Whether a TPU-simulated kernel raced since the last reset; raises (RuntimeError) when the simulator's
        record cannot be read: a check that never ran is never reported clean."""
        ...

    def race_checking_params(self, seed: int | None = 0, num_cores: int = 2) -> Any:
        """pltpu.InterpretParams for the TPU simulator with race detection and NaN-filled fresh memory; an entry
        called eagerly with them raises RaceDetectedError on a race."""
        ...

    def run_race_checked(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) on a fresh simulator, waited for; RaceDetectedError on a race (for jit/grad)."""
        ...
