"""The kernel contract: what every kernel package exports, written as Protocols (prose: docs/kernel-contract.md).

kernel-hub's harness, kernelize and the TPU compile gate call kernels only through these names, and
tests/test_kernel_contract.py holds every kernel in registry.yaml to them by behaviour. Typing only: importing this
module imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


# -- what kernel-hub fills in for a kernel that leaves it out (docs/kernel-contract.md, "Defaults") ---------------

#: The one implementation of a kernel that declares none.
DEFAULT_IMPLEMENTATION = "default"
#: Module attributes that let kernel-hub generate validation cases when a package has no validation.py:
#: REFERENCE = (op name, reference function on float64 NumPy arrays), CASE_SHAPES = [{argument: shape}, ...].
REFERENCE_ATTR, SHAPES_ATTR = "REFERENCE", "CASE_SHAPES"


def fill_defaults(module: Any) -> tuple[str, ...]:
    """A kernel without a dispatch table has one implementation: give it the contract's names for that
    (IMPLEMENTATIONS, ORDER, implementations_for, resolve_implementation, last_implementation). Returns the names
    set (none when the kernel defines IMPLEMENTATIONS itself: then it owns the whole contract)."""
    if hasattr(module, "IMPLEMENTATIONS"):
        return ()
    name = DEFAULT_IMPLEMENTATION
    reason = f"{name}: chosen (the kernel's only implementation)"

    def implementations_for(backend: Any) -> tuple[str, ...]:
        return (name,)

    def resolve_implementation(backend: Any, implementation: Implementation = None, *,
                               interpret: Any = None) -> tuple[str, str]:
        asked = (implementation,) if isinstance(implementation, str) else tuple(implementation or ())
        if implementation is not None and not asked:
            raise ValueError(f"the implementation sequence is empty; known: {name}")
        unknown = [n for n in asked if n != name]
        if unknown:
            raise ValueError(f"unknown implementation {unknown[0]!r}; known: {name}")
        return name, reason

    defaults = {"IMPLEMENTATIONS": (name,), "ORDER": {}, "implementations_for": implementations_for,
                "resolve_implementation": resolve_implementation, "last_implementation": lambda: (name, reason)}
    for attr, value in defaults.items():
        setattr(module, attr, value)
    return tuple(defaults)


def _as_float64(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):  # torch, bfloat16 included
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float32 if str(getattr(x, "dtype", "")) == "bfloat16" else None).astype(np.float64)


@dataclass(frozen=True)
class ReferenceCase:
    """A case generated from a kernel's reference and one set of shapes: random normal inputs, the kernel's `op`
    called on them positionally (with implementation= only when one is asked for), the reference in float64."""

    name: str
    dtype: str
    implementation: Implementation
    tags: tuple[str, ...]
    tolerance: float | None
    op: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    reference_fn: Callable[..., Any]
    framework: str = "jax"

    def inputs(self, seed: int) -> dict[str, Any]:
        import numpy as np

        rng = np.random.default_rng(seed)
        out: dict[str, Any] = {}
        for arg, shape in self.shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            if self.framework == "torch":
                import torch

                out[arg] = torch.from_numpy(x).to(getattr(torch, self.dtype))
            else:
                import jax.numpy as jnp

                out[arg] = jnp.asarray(x, dtype=self.dtype)
        return out

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = {} if self.implementation is None else {"implementation": self.implementation}
        return getattr(module, self.op)(*(inputs[arg] for arg, _ in self.shapes), **kw)

    def reference(self, inputs: dict[str, Any]) -> Any:
        return self.reference_fn(*(_as_float64(inputs[arg]) for arg, _ in self.shapes))


def cases_from_reference(op: str, reference: Callable[..., Any], shapes: Sequence[Mapping[str, Sequence[int]]],
                         dtypes: Sequence[str] = ("float32", "bfloat16"), framework: str = "jax"
                         ) -> list[ReferenceCase]:
    """One case per (shapes, dtype): what the harness runs for a package that exports REFERENCE and CASE_SHAPES
    instead of a validation.py."""
    out = []
    for i, group in enumerate(shapes):
        frozen = tuple((str(arg), tuple(int(d) for d in shape)) for arg, shape in group.items())
        size = "x".join("_".join(map(str, s)) for _, s in frozen)
        for dtype in dtypes:
            if dtype not in CASE_DTYPES:
                raise ValueError(f"case dtype {dtype!r} is not one of {', '.join(CASE_DTYPES)}")
            out.append(ReferenceCase(f"{op}_{i}_{size}_{dtype}", dtype, None, ("generated",), None, op, frozen,
                                     reference, framework))
    return out
