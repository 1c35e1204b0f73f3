"""The kernel contract: what every kernel package exports, written as Protocols (prose: docs/kernel-contract.md).

kernel-hub's harness, kernelize and the TPU compile gate call kernels only through these names, and
tests/verify/test_kernel_contract.py holds every kernel in registry.yaml to them by behaviour. Typing only: importing
this module imports no framework.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeAlias, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import jax
    import numpy as np
    import torch
    from jax.experimental.pallas import tpu as pltpu

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: `implementation=`: None (the platform's default order), a name, or names tried in order.
Implementation = str | Sequence[str] | None
#: An array an entry takes or returns: NumPy, JAX or torch.
Array: TypeAlias = "np.ndarray | jax.Array | torch.Tensor"
#: One argument of a case's call: an array, a group of arrays (a weight pair), or a scalar option.
InputValue: TypeAlias = "Array | tuple[Array, ...] | int | float | bool | str | None"
#: A case's inputs by argument name.
Inputs: TypeAlias = "dict[str, InputValue]"
#: A platform name ("cpu", "tpu"); torch entries also take a torch.device.
Backend: TypeAlias = "str | torch.device"
#: A JAX entry's `interpret=`: None (by platform), a bool, or the TPU simulator's parameters.
Interpret: TypeAlias = "bool | pltpu.InterpretParams | None"
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

    def inputs(self, seed: int) -> Inputs:
        """Fresh random inputs, deterministic in `seed`."""
        ...

    def call(self, module: ModuleType, inputs: Inputs) -> Array:
        """The loaded module's entry on `inputs` (the actual result, any array type)."""
        ...

    def reference(self, inputs: Inputs) -> Array:
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

    def implementations_for(self, backend: Backend) -> tuple[str, ...]:
        """The default order for a platform name (torch entries: also a torch.device), best first."""
        ...

    def resolve_implementation(self, backend: Backend, implementation: Implementation = None, *,
                               interpret: Interpret = None) -> tuple[str, str]:
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

    def race_checking_params(self, seed: int | None = 0, num_cores: int = 2) -> pltpu.InterpretParams:
        """pltpu.InterpretParams for the TPU simulator with race detection and NaN-filled fresh memory; an entry
        called eagerly with them raises RaceDetectedError on a race."""
        ...

    def run_race_checked(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """fn(*args, **kwargs) on a fresh simulator, waited for; RaceDetectedError on a race (for jit/grad)."""
        ...


# -- what kernel-hub fills in for a kernel that leaves it out (docs/kernel-contract.md, "Defaults") ---------------

#: The one implementation of a kernel that declares none.
DEFAULT_IMPLEMENTATION = "default"
#: Module attributes that let kernel-hub generate validation cases when a package has no validation.py:
#: REFERENCE = (op name, reference function on float64 NumPy arrays), CASE_SHAPES = [{argument: shape}, ...].
REFERENCE_ATTR, SHAPES_ATTR = "REFERENCE", "CASE_SHAPES"


def fill_defaults(module: ModuleType) -> tuple[str, ...]:
    """A kernel without a dispatch table has one implementation: give it the contract's names for that
    (IMPLEMENTATIONS, ORDER, implementations_for, resolve_implementation, last_implementation). Returns the names
    set (none when the kernel defines IMPLEMENTATIONS itself: then it owns the whole contract)."""
    if hasattr(module, "IMPLEMENTATIONS"):
        return ()
    name = DEFAULT_IMPLEMENTATION
    reason = f"{name}: chosen (the kernel's only implementation)"

    def implementations_for(backend: Backend) -> tuple[str, ...]:
        return (name,)

    def resolve_implementation(backend: Backend, implementation: Implementation = None, *,
                               interpret: Interpret = None) -> tuple[str, str]:
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


def _as_float64(x: Array) -> np.ndarray:
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
    reference_fn: Callable[..., Array]
    framework: str = "jax"

    def inputs(self, seed: int) -> Inputs:
        import numpy as np

        rng = np.random.default_rng(seed)
        out: Inputs = {}
        for arg, shape in self.shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            if self.framework == "torch":
                import torch

                out[arg] = torch.from_numpy(x).to(getattr(torch, self.dtype))
            else:
                import jax.numpy as jnp

                out[arg] = jnp.asarray(x, dtype=self.dtype)
        return out

    def call(self, module: ModuleType, inputs: Inputs) -> Array:
        kw = {} if self.implementation is None else {"implementation": self.implementation}
        return getattr(module, self.op)(*(inputs[arg] for arg, _ in self.shapes), **kw)

    def reference(self, inputs: Inputs) -> Array:
        return self.reference_fn(*(_as_float64(inputs[arg]) for arg, _ in self.shapes))


def cases_from_reference(op: str, reference: Callable[..., Array], shapes: Sequence[Mapping[str, Sequence[int]]],
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


# -- the kernel side of kernelize: what a kernel serving a layer kind exports in its torch entry -------------------
#
# kernelize loads a kernel's torch-facing build and calls only the entries of the kind's Protocols (each layer kind
# declares its own, in its folder's contract.py: layers/kinds/<kind>/), with these parameters (positionally where the
# Protocol's parameter is positional, by keyword otherwise). A kernel whose kernel.yaml `replaces` names a layer kind
# holds to that kind's Protocols in its torch entry; `protocol_problems` says, entry by entry, where it does not
# (layers.kinds.layer_kernel_problems runs it for a kind by name; tests/verify/test_kernel_contract.py on every such
# kernel). At run time kernelize asks only for the kind's first entry (a `mapping=` module may be a bare ragged_dot:
# kernelize then builds the expert block itself).


#: HF kernels' `layers` convention (the torch build's `layers` module): the only class members a layer class may add
#: to torch.nn.Module's, besides `forward` (HF kernels binds the class's forward to the module it replaces, so a
#: layer class has no constructor and no state of its own).
LAYER_CLASS_MEMBERS = ("has_backward", "can_torch_compile")


def protocol_entries(protocol: type) -> tuple[str, ...]:
    """The entry names a Protocol declares, in declaration order."""
    return tuple(n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_"))


def readable_signature(fn: Callable[..., object]) -> inspect.Signature | None:
    """`fn`'s inspect.Signature, None where it has no readable one."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def signature_problems(entry: str, fn: Callable[..., object], declared: Callable[..., object]) -> list[str]:
    """Where `fn`'s parameters do not take the calls `declared` (a Protocol method) describes: its positional
    parameters by name and in order, each keyword parameter by name, a default wherever the declaration has one (a
    caller may leave it out), and no required parameter the declaration does not know (a caller never passes it)."""
    P = inspect.Parameter
    sig, want = readable_signature(fn), inspect.signature(declared)
    if sig is None:
        return [f"{entry}: has no readable signature"]
    wanted = [p for p in want.parameters.values() if p.name != "self"]
    params = sig.parameters
    var_kw = any(p.kind is P.VAR_KEYWORD for p in params.values())
    var_pos = any(p.kind is P.VAR_POSITIONAL for p in params.values())
    problems = []
    positional = [p for p in params.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    want_pos = [p for p in wanted if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    for i, w in enumerate(want_pos):
        if i < len(positional):
            if positional[i].name != w.name:
                problems.append(f"{entry}: positional parameter {i + 1} is {positional[i].name!r}, the contract "
                                f"says {w.name!r}")
        elif not var_pos:
            problems.append(f"{entry}: takes no positional parameter {w.name!r}")
    for w in wanted:
        if w.kind is not P.KEYWORD_ONLY:
            continue
        p = params.get(w.name)
        if p is None or p.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD):
            if not var_kw:
                problems.append(f"{entry}: takes no keyword parameter {w.name!r}")
        elif w.default is not P.empty and p.default is P.empty:
            problems.append(f"{entry}: keyword parameter {w.name!r} needs a default (callers may leave it out)")
    known = {w.name for w in wanted}
    for i, p in enumerate(params.values()):
        if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD) or p.default is not P.empty or p.name in known:
            continue
        if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) and i < len(want_pos):
            continue  # named differently: already said above
        problems.append(f"{entry}: requires parameter {p.name!r}, which the contract never passes")
    return problems


def layer_class_problems(name: str, cls: object) -> list[str]:
    """Where a class of a torch build's `layers` module breaks HF kernels' layer convention."""
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return [f"layers.{name}: not a torch.nn.Module subclass"]
    problems = []
    if cls.__init__ is not torch.nn.Module.__init__:
        problems.append(f"layers.{name}: defines a constructor (a layer class must be stateless)")
    if "forward" not in vars(cls):
        problems.append(f"layers.{name}: defines no forward of its own")
    extra = sorted(set(dir(cls)) - set(dir(torch.nn.Module)) - set(LAYER_CLASS_MEMBERS))
    if extra:
        problems.append(f"layers.{name}: members beyond {', '.join(LAYER_CLASS_MEMBERS)}: {', '.join(extra)}")
    return problems


#: transformers 5.25's companion of a layer class X: `XLayout` in the same module, a stateful module transformers
#: builds in place of the model's class (integrations/hub_kernels.py), whose forward HF kernels then swaps for X's.
LAYOUT_SUFFIX = "Layout"


def _module_classes(module: ModuleType) -> dict[str, type[torch.nn.Module]]:
    import torch

    layers = getattr(module, "layers", None)
    if layers is None:
        return {}
    return {n: c for n, c in vars(layers).items() if isinstance(c, type) and issubclass(c, torch.nn.Module)
            and c.__module__ == layers.__name__}


def layout_companions(module: ModuleType) -> dict[str, type[torch.nn.Module]]:
    """The `<X>Layout` classes of an entry's `layers` module whose X is a class there too."""
    classes = _module_classes(module)
    return {n: c for n, c in classes.items()
            if n.endswith(LAYOUT_SUFFIX) and n[:-len(LAYOUT_SUFFIX)] in classes}


def layer_classes(module: ModuleType) -> dict[str, type[torch.nn.Module]]:
    """The layer classes of an entry's `layers` module (HF kernels' convention): its classes that are torch modules,
    less the layout companions."""
    companions = layout_companions(module)
    return {n: c for n, c in _module_classes(module).items() if n not in companions}


def layout_companion_problems(name: str, cls: type[torch.nn.Module], layer: type[torch.nn.Module]) -> list[str]:
    """Where a layout companion breaks what transformers 5.25 and HF kernels do with it: without a forward of its
    own transformers gives it one that returns None (a model built with it computes nothing until kernelized), and
    HF kernels refuses the layer class unless their forwards take the same number and kinds of parameters."""
    if "forward" not in vars(cls):
        return [f"layers.{name}: defines no forward (transformers 5.25 would give it one returning None)"]
    mine, theirs = readable_signature(cls.forward), readable_signature(layer.forward)
    if mine is None or theirs is None or [p.kind for p in mine.parameters.values()] != [
            p.kind for p in theirs.parameters.values()]:
        return [f"layers.{name}: forward{mine} does not take the parameters of {layer.__name__}.forward{theirs}"]
    if not any(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
               and p.name != "self" for p in inspect.signature(cls.__init__).parameters.values()):
        return [f"layers.{name}: its constructor takes no config (transformers builds it as the model's class)"]
    return []


def protocol_problems(module: ModuleType, kind: str, required: Sequence[type], optional: Sequence[type] = ()
                      ) -> list[str]:
    """Every way the torch entry `module` falls short of serving layer `kind`, whose kernel keeps the `required`
    Protocols (every entry) and the `optional` ones (each all or none): each required entry missing or with
    parameters the calls do not fit, an optional group half there, a `layers` class breaking HF kernels' convention
    (empty: it keeps the contract). Each message starts with the entry it is about."""
    problems: list[str] = []
    groups = [(p, True) for p in required] + [(p, False) for p in optional]
    for protocol, is_required in groups:
        entries = protocol_entries(protocol)
        present = [e for e in entries if callable(getattr(module, e, None))]
        if not is_required and not present:
            continue
        for e in entries:
            if e not in present:
                why = "required" if is_required else f"the others of {protocol.__name__} are there"
                problems.append(f"{e}: missing ({why}; {protocol.__name__}, layer kind {kind})")
            else:
                problems += signature_problems(e, getattr(module, e), getattr(protocol, e))
    classes = layer_classes(module)
    for name, cls in classes.items():
        problems += layer_class_problems(name, cls)
    for name, cls in layout_companions(module).items():
        problems += layout_companion_problems(name, cls, classes[name[:-len(LAYOUT_SUFFIX)]])
    return problems
