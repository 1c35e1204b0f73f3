"""A kernel's JAX entries as torch custom ops on TorchTPU, registered once per process through torch_tpu's jax_op.

`torch.tpu.pallas.jax_op(name, fn, ...)` (torch-tpu 0.2) turns an annotated JAX function into the torch custom op
`name`: the schema comes from the annotations (jax.Array -> Tensor; bool/int/float/str/enum/dtype -> static options,
keyword-only here), the fake kernel traces the function (meta and fake tensors get shapes and dtypes), and the TPU
kernel is the function exported for TPU. Each op gets its gradient from a second op built the same way from
torch_jax.vjp_function (jax.vjp of the forward: the kernel's custom_vjp supplies the Pallas backward kernels),
wired in with `register_autograd`.

The functions are traced for the chip torch_tpu drives (`traced_for_tpu`): in a torch_tpu process jax's own devices
are not the TPU, and Mosaic's lowering reads the chip generation from the abstract mesh. An expert-parallel entry is
one more `OpSpec` with jax_op's mesh and partition specs (`TpuOps.add`): its backward op gets the matching specs.

Names carry the version and the build's content, `kernel_hub_<kernel>_v<version>_c<digest>::<entry>`: the version in
an injective encoding (letters a-z and digits kept, every other character `_` and two hex digits, so "1.2.0", "1.2-0",
"1_2_0" and "1.2+0" are four names) and the first 16 hex digits of `package_digest`, a sha256 the package computes
over its own files when it is imported (kernel_hub is never imported here, so the loader's digests are not at hand;
the loader has already checked these very files against them). Two versions get two sets of ops, and so do two builds
of one version with different content (a fork, an edited local copy); a second import of the same build (another
module copy) finds the op already registered and reuses it: the first import's JAX function serves both, which is
the same code.

Importing this module imports neither jax nor torch_tpu (the torch-cpu builds ship it and never call into it);
`TpuOps.register` imports torch_tpu, which only a build on a TPU host (the torch-tpu variant) or a call with TPU
tensors does.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .torch_jax import vjp_function

#: torch's device type for TorchTPU tensors.
TPU = "tpu"
#: What to do where torch_tpu (or its `torch.tpu.pallas.jax_op`) is missing.
INSTALL_HINT = "install torch-tpu (pip install 'torch-tpu>=0.2,<0.3') on the TPU host"


class TorchTpuUnavailableError(RuntimeError):
    """torch_tpu (TorchTPU) is not installed, or has no `torch.tpu.pallas.jax_op`."""


def _encode_version(version: str) -> str:
    """An injective encoding of a version into [0-9a-z_]: a-z and 0-9 kept, any other character `_` + 2 hex digits."""
    return "".join(c if c in "0123456789abcdefghijklmnopqrstuvwxyz" else f"_{ord(c):02x}" for c in version)


@functools.cache
def package_digest(package_dir: str | Path) -> str:
    """sha256 over a package's files (each file's path relative to the package and its bytes, in path order;
    __pycache__ and bytecode left out): what tells two builds of one version apart."""
    root = Path(package_dir).resolve()
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix not in (".pyc", ".pyo")):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
        digest.update(data)
    return digest.hexdigest()


def op_namespace(kernel: str, version: str, digest: str) -> str:
    """The torch op namespace of one build: kernel_hub_ragged_dot_v1_2e1_2e0_c<16 hex> for ("ragged_dot", "1.1.0",
    its package_digest)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kernel):
        raise ValueError(f"kernel name {kernel!r} is not a lower-case Python name")
    if not re.fullmatch(r"[0-9A-Za-z.+!_-]+", version):
        raise ValueError(f"version {version!r} is not a release version like 1.1.0")
    if not re.fullmatch(r"[0-9a-f]{16,64}", digest):
        raise ValueError(f"content digest {digest!r} is not a hex sha256")
    return f"kernel_hub_{kernel}_v{_encode_version(version)}_c{digest[:16]}"


def on_tpu(*tensors: torch.Tensor | None) -> bool:
    """Whether any of the tensors lives on a TPU (TorchTPU's "tpu" device)."""
    return any(t is not None and t.device.type == TPU for t in tensors)


def torch_tpu_installed() -> bool:
    """torch_tpu can be imported here (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch_tpu") is not None
    except (ImportError, ValueError):
        return False


def host_notice(op: str, device_type: str) -> str | None:
    """What the torch-tpu build says when called on tensors that are not on a TPU (None on a TPU, and for meta
    tensors, which only trace): they run the implementations for their device, on CPU the torch-cpu build's."""
    if device_type in (TPU, "meta"):
        return None
    return (f"{op} of the torch-tpu build got tensors on {device_type}, not on a TPU: they run the {device_type} "
            f"implementations (by default the torch-native path the torch-cpu build runs), not the TorchTPU op; "
            f"move the tensors to the TPU (tensor.to('tpu')) for the Pallas kernel")


def warn_host_call(op: str, device_type: str) -> str | None:
    """host_notice, also as a warning (Python shows each distinct one once per call site by default)."""
    note = host_notice(op, device_type)
    if note:
        warnings.warn(note, UserWarning, stacklevel=4)
    return note


#: The chip an op is traced for where neither jax nor torch_tpu names a TPU: a host without one only traces (fake
#: tensors, ahead-of-time compiles), and the traced shapes do not depend on the generation.
FALLBACK_DEVICE_KIND = "TPU v6 lite"


@functools.cache
def device_kind() -> str:
    """The TPU torch_tpu drives ("TPU v5 lite", ...), or FALLBACK_DEVICE_KIND where it names none."""
    name = getattr(getattr(torch, "tpu", None), "get_device_name", None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch_tpu marks it experimental on every call
            kind = str(name()) if callable(name) else ""
    except Exception:  # no TPU runtime here
        kind = ""
    return kind if re.search(r"TPU ?v?\d", kind) else FALLBACK_DEVICE_KIND


def _jax_targets_tpu() -> bool:
    """Whether jax already lowers for a TPU here (an abstract TPU mesh, or a TPU as its default device), read
    without initialising a jax backend (on a TPU host torch_tpu owns the chip)."""
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    if getattr(device, "platform", None) == "tpu":
        return True
    default = jax.config.jax_default_device
    return getattr(default, "platform", None) == "tpu" or (isinstance(default, str) and default.startswith("tpu"))


def traced_for_tpu(fn: Callable[..., Any], mesh: Any = None) -> Callable[..., Any]:
    """fn traced for the TPU torch_tpu drives: where jax itself targets no TPU (in a torch_tpu process jax's own
    devices are not the TPU), under the abstract mesh of `mesh` (an expert-parallel op's), else of one device of
    the chip torch_tpu names: Mosaic's lowering reads the chip generation from the abstract mesh or the default
    device. Signature kept (jax_op reads the schema off it)."""

    @functools.wraps(fn)
    def on_tpu_target(*args: Any, **kwargs: Any) -> Any:
        if _jax_targets_tpu():
            return fn(*args, **kwargs)
        import jax
        from jax.sharding import AbstractDevice, AbstractMesh, AxisType

        target = mesh.abstract_mesh if mesh is not None else AbstractMesh(
            (1,), ("kernel_hub_tpu",), axis_types=(AxisType.Auto,),
            abstract_device=AbstractDevice(device_kind(), 1, "tpu"))
        with jax.sharding.use_abstract_mesh(target):
            return fn(*args, **kwargs)

    return on_tpu_target


def jax_op() -> Callable[..., Any]:
    """torch_tpu's `jax_op` (imports torch_tpu); TorchTpuUnavailableError naming what to install otherwise."""
    try:
        importlib.import_module("torch_tpu")
    except ImportError as exc:
        raise TorchTpuUnavailableError(f"torch_tpu is not importable ({exc}); {INSTALL_HINT}") from None
    pallas = getattr(getattr(torch, "tpu", None), "pallas", None)
    fn = getattr(pallas, "jax_op", None)
    if fn is None:
        raise TorchTpuUnavailableError(f"this torch_tpu has no torch.tpu.pallas.jax_op; {INSTALL_HINT}")
    return fn


@dataclass(frozen=True)
class OpSpec:
    """One JAX entry to register as a torch op.

    entry: the op's name inside the kernel's namespace ("ragged_dot").
    forward: an annotated JAX function, tensors positional and static options keyword-only (torch_jax.py).
    differentiable: positions of the tensors that get gradients; () registers no autograd (forward only).
    mesh, input_partition_specs, output_partition_specs: jax_op's, for a kernel sharded over a device mesh
      (expert parallelism); the backward op gets the inputs' and outputs' specs as its inputs and the
      differentiable inputs' specs as its outputs.
    """

    entry: str
    forward: Callable[..., Any]
    differentiable: tuple[int, ...] = ()
    mesh: Any = None
    input_partition_specs: tuple[Any, ...] | None = None
    output_partition_specs: Any = None

    def backward_specs(self, outputs: int) -> tuple[tuple[Any, ...] | None, Any]:
        """(input, output) partition specs of the backward op: (inputs + one per output cotangent, the
        differentiable inputs'). output_partition_specs is one spec for every output, or a list of one per output."""
        if self.input_partition_specs is None:
            return None, None
        outs = self.output_partition_specs
        outs = list(outs) if isinstance(outs, list) else [outs] * outputs
        ins = tuple(self.input_partition_specs)
        return (*ins, *outs), tuple(ins[i] for i in self.differentiable)


def _existing(name: str) -> Any:
    """The op `name` registered earlier in this process (by any copy of this module), or None."""
    custom_ops = importlib.import_module("torch._library.custom_ops")
    return custom_ops._maybe_get_opdef(name)


def _autograd(spec: OpSpec, backward_op: Any) -> tuple[Callable, Callable]:
    """(backward, setup_context) for CustomOpDef.register_autograd: the backward op on the saved tensors. torch hands
    the keyword-only (static) inputs over apart and wants gradients for the positional (tensor) inputs only."""

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any,
                      keyword_only_inputs: dict[str, Any] | None = None) -> None:
        ctx.save_for_backward(*inputs)
        ctx.options = dict(keyword_only_inputs or {})

    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        out = backward_op(*saved, *(g.contiguous() for g in grads), **ctx.options)
        result: list[torch.Tensor | None] = [None] * len(saved)
        for pos, g in zip(spec.differentiable, out, strict=True):
            if ctx.needs_input_grad[pos]:
                result[pos] = g
        return tuple(result)

    return backward, setup_context


class TpuOps:
    """The torch ops of one kernel version on TorchTPU: named now, registered on first use (or by `register`)."""

    def __init__(self, kernel: str, version: str, digest: str, specs: Callable[[], Sequence[OpSpec]]) -> None:
        """`digest`: the package's package_digest; `specs()` builds the OpSpecs (it imports jax, so it runs only
        when registering)."""
        self.namespace = op_namespace(kernel, version, digest)
        self._specs_factory = specs
        self._specs: dict[str, OpSpec] | None = None
        self._ops: dict[str, Any] = {}  # strong references: torch keeps only weak ones to a CustomOpDef

    def name(self, entry: str) -> str:
        return f"{self.namespace}::{entry}"

    def specs(self) -> dict[str, OpSpec]:
        if self._specs is None:
            self._specs = {s.entry: s for s in self._specs_factory()}
        return self._specs

    def add(self, spec: OpSpec) -> Any:
        """Register one more entry (e.g. an expert-parallel one whose mesh is known only now); returns its op."""
        known = self.specs().get(spec.entry)
        if known is not None and known != spec:
            raise ValueError(f"{self.name(spec.entry)} is already described differently; give the new one its "
                             "own entry name (e.g. one per mesh)")
        self.specs()[spec.entry] = spec
        return self.get(spec.entry)

    def get(self, entry: str) -> Any:
        """The CustomOpDef of `entry`, registered on first use."""
        op = self._ops.get(entry)
        if op is None:
            spec = self.specs().get(entry)
            if spec is None:
                raise KeyError(f"no op {entry!r} in {self.namespace}; known: {', '.join(self.specs())}")
            op = self._ops[entry] = self._register(spec)
        return op

    def register(self) -> dict[str, Any]:
        """Every entry's op ({entry: CustomOpDef}), registering those this process has not seen."""
        return {entry: self.get(entry) for entry in self.specs()}

    def _register(self, spec: OpSpec) -> Any:
        name = self.name(spec.entry)
        found = _existing(name)
        if found is not None:
            return found
        register = jax_op()
        op = register(name, traced_for_tpu(spec.forward, spec.mesh), mesh=spec.mesh,
                      input_partition_specs=spec.input_partition_specs,
                      output_partition_specs=spec.output_partition_specs)
        if spec.differentiable:
            backward = traced_for_tpu(vjp_function(spec.forward, spec.differentiable), spec.mesh)
            ins, outs = spec.backward_specs(outputs=len(op._opoverload._schema.returns))
            backward_op = register(f"{name}_backward", backward, mesh=spec.mesh, input_partition_specs=ins,
                                   output_partition_specs=outs)
            self._ops[f"{spec.entry}_backward"] = backward_op
            backward_fn, setup_context = _autograd(spec, backward_op)
            op.register_autograd(backward_fn, setup_context=setup_context)
        return op


def torch_tpu_build(ops: TpuOps, dispatches: Sequence[Any]) -> Callable[[], dict[str, Any]]:
    """Make a torch entry the torch-tpu build: each of its dispatches (torch_dispatch.TorchDispatch) says when its
    tensors are not on a TPU (a warning and a note in last_implementation(), host_notice), and the ops are
    registered now when torch_tpu is installed (on the first TPU call otherwise). Returns the entry's `tpu_ops`."""
    for dispatch in dispatches:
        dispatch.on_device = warn_host_call
    if torch_tpu_installed():
        ops.register()
    return ops.register
