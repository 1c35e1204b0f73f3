"""Every kernel in registry.yaml keeps the kernel contract (contract.py, docs/kernel-contract.md), in each entry
it ships (JAX, torch), checked by behaviour: the order a sequence is tried in, the error an unknown name gets, Pallas
interpreting off a TPU by itself, last_implementation following the call, race checks refusing to report an
unchecked run, one validation signature. A kernel whose kernel.yaml says it serves a layer kind (`replaces`) keeps
that kind's Protocols in its torch entry (the kernel side of kernelize: entries and their parameters, HF kernels'
`layers` classes). A kernel added to registry.yaml is held to it with no edit here, and so is a kernel freshly
written by `kernel-hub init` from each template."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib
import inspect
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.layers.kinds import BUILTIN_KINDS, layer_kernel_problems
from kernel_hub.load.registry import load_registry
from kernel_hub.package.metadata import load_metadata
from kernel_hub.scaffold import TEMPLATES, init
from kernel_hub.verify.contract import (
    CASE_DTYPES,
    ENTRY_NAMES,
    PALLAS_NAMES,
    Case,
    KernelEntry,
    PallasEntry,
    protocol_entries,
)
from kernel_hub.verify.numerics import relative_error, tolerance
from kernel_hub.verify.validation import run_case

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Fresh:
    """A kernel `kernel-hub init` just wrote (one per template), held to the same contract as the registry's."""

    repo_id: str
    source: Path


def _fresh_kernels() -> list[Fresh]:
    root = Path(tempfile.mkdtemp(prefix="kh-contract-init-"))
    atexit.register(shutil.rmtree, root, True)
    return [Fresh(f"init/{t}-template", init(f"fresh_{t}", root, t, repo_id=f"init/{t}-template")) for t in TEMPLATES]


KERNELS = [e for e in load_registry(ROOT / "registry.yaml").entries if e.source is not None] + _fresh_kernels()
ENTRIES = [(e, fw) for e in KERNELS for fw in sorted({v.framework for v in load_metadata(e.source).variants})]
ENTRY_IDS = [f"{e.repo_id.split('/')[1]}-{fw}" for e, fw in ENTRIES]
RACE_STATE = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"


@functools.cache
def entry(source: Path, framework: str):
    return kh.get_local_kernel(source, framework=framework, backend="cpu")


@functools.cache
def cpu_cases(source: Path, framework: str) -> tuple:
    module = entry(source, framework)
    return tuple(importlib.import_module(f"{module.__name__}.validation").cases("cpu", framework=framework))


def _nbytes(inputs: dict) -> int:
    return sum(int(getattr(x, "nbytes", 0) or 0) for x in inputs.values())


def _has_empty(inputs: dict) -> bool:
    """An operand with no elements: a kernel may answer it without running (so it shows no dispatch detail)."""
    return any((x.numel() if hasattr(x, "numel") else x.size) == 0 for x in inputs.values() if hasattr(x, "shape"))


@functools.cache
def smallest(source: Path, framework: str):
    """The case with the fewest input bytes, run on the entry's default order (fast, any implementation)."""
    case = min(cpu_cases(source, framework), key=lambda c: (_has_empty(c.inputs(0)), _nbytes(c.inputs(0))))
    return dataclasses.replace(case, implementation=None, interpret=None) if hasattr(case, "interpret") else case


def runnable_on_cpu(module) -> list[str]:
    out = []
    for name in module.IMPLEMENTATIONS:
        try:
            module.resolve_implementation("cpu", name)
        except NotImplementedError:
            continue
        out.append(name)
    return out


def passes(case, module, implementation) -> tuple[str | None, str | None]:
    """Run `case` with `implementation`, check its numbers, return last_implementation()."""
    result = run_case(dataclasses.replace(case, implementation=implementation), module, seed=3)
    assert result.passed, (result.name, implementation, result.max_error, result.error)
    return module.last_implementation()


@pytest.mark.parametrize(("kernel", "framework"), ENTRIES, ids=ENTRY_IDS)
def test_exports_the_contract(kernel, framework):
    module = entry(kernel.source, framework)
    assert all(hasattr(module, n) for n in ENTRY_NAMES) and isinstance(module, KernelEntry)
    impls = module.IMPLEMENTATIONS
    assert isinstance(impls, tuple) and impls and len(set(impls)) == len(impls)
    for platform, order in module.ORDER.items():
        assert module.implementations_for(platform) == order and isinstance(order, tuple)
        assert set(order) <= set(impls)
    fallback = module.implementations_for("some-new-platform")
    assert isinstance(fallback, tuple) and fallback and set(fallback) <= set(impls)
    params = inspect.signature(module.resolve_implementation).parameters
    assert list(params)[:2] == ["backend", "implementation"] or list(params)[:2] == ["device", "implementation"]
    assert params["interpret"].kind is inspect.Parameter.KEYWORD_ONLY and params["interpret"].default is None
    if "pallas" in impls:
        assert all(hasattr(module, n) for n in PALLAS_NAMES) and isinstance(module, PallasEntry)


@pytest.mark.parametrize(("kernel", "framework"), ENTRIES, ids=ENTRY_IDS)
def test_unknown_names_raise_naming_the_known_ones(kernel, framework):
    module = entry(kernel.source, framework)
    case = smallest(kernel.source, framework)
    first = runnable_on_cpu(module)[0]
    for request in ("no-such-kernel", [first, "no-such-kernel"]):  # checked before anything runs
        with pytest.raises(ValueError, match="no-such-kernel") as err:
            module.resolve_implementation("cpu", request)
        assert all(name in str(err.value) for name in module.IMPLEMENTATIONS)
        with pytest.raises(ValueError, match="no-such-kernel"):
            dataclasses.replace(case, implementation=request).call(module, case.inputs(0))
    with pytest.raises(ValueError, match="empty"):
        module.resolve_implementation("cpu", [])


@pytest.mark.parametrize(("kernel", "framework"), ENTRIES, ids=ENTRY_IDS)
def test_a_sequence_is_tried_in_order_and_the_first_that_runs_wins(kernel, framework):
    module = entry(kernel.source, framework)
    case = smallest(kernel.source, framework)
    runnable = runnable_on_cpu(module)
    assert len(runnable) >= 2, f"{kernel.repo_id}: fewer than two implementations run on cpu: {runnable}"
    quick = [n for n in runnable if n != "pallas"] + [n for n in runnable if n == "pallas"]
    a, b = quick[:2]
    assert passes(case, module, (a, b))[0] == a
    name, reason = passes(case, module, (b, a))
    assert name == b and "requested order" in reason
    blocked = [n for n in module.IMPLEMENTATIONS if n not in runnable]
    if blocked:  # a name that cannot run here is skipped, with the reason kept
        name, reason = passes(case, module, (blocked[0], a))
        assert name == a and f"{blocked[0]}: skipped" in reason


@pytest.mark.parametrize(("kernel", "framework"), ENTRIES, ids=ENTRY_IDS)
def test_last_implementation_follows_the_call(kernel, framework):
    module = entry(kernel.source, framework)
    case = smallest(kernel.source, framework)
    default = module.implementations_for("cpu")[0]
    others = [n for n in runnable_on_cpu(module) if n != default]
    other = next((n for n in others if n != "pallas"), others[0])  # two implementations: the other is Pallas
    assert passes(case, module, other)[0] == other
    name, reason = passes(case, module, None)
    assert name == default and "default order for cpu" in reason
    resolved = module.resolve_implementation("cpu")  # the same decision, without calling anything
    assert resolved[0] == name and reason.startswith(resolved[1])


PALLAS = [(e, fw) for e, fw in ENTRIES if fw == "jax" and "pallas" in entry(e.source, fw).IMPLEMENTATIONS]
PALLAS_IDS = [e.repo_id.split("/")[1] for e, _ in PALLAS]


@pytest.mark.parametrize(("kernel", "framework"), PALLAS, ids=PALLAS_IDS)
def test_pallas_on_cpu_interprets_by_itself_and_interpret_false_lowers_to_mosaic(kernel, framework):
    module = entry(kernel.source, framework)
    case = smallest(kernel.source, framework)
    name, reason = passes(case, module, "pallas")  # no interpret= given
    assert name == "pallas" and "interpreted (fast interpreter, platform cpu)" in reason
    # interpret=False: Mosaic even on a CPU host (what an ahead-of-time TPU compile needs); dispatch does not refuse,
    # so the error here comes from Pallas' CPU lowering, not from a "no implementation fits".
    assert "compiled by Mosaic" in module.resolve_implementation("cpu", "pallas", interpret=False)[1]
    inputs = case.inputs(0)
    with pytest.raises(Exception) as err:
        _call_with(case, module, inputs, implementation="pallas", interpret=False)
    assert not isinstance(err.value, NotImplementedError), err.value
    assert "interpret" in str(err.value).lower()


def _call_with(case, module, inputs, **kw):
    """case.call, with extra keyword arguments for the entry (interpret= is not a case field value)."""
    fn_name = "decode_attention" if getattr(getattr(case, "scenario", None), "decode", False) else None
    fn_name = fn_name or getattr(case, "op", None)  # the init templates' cases name their op
    target = fn_name or next(n for n in ("ragged_dot", "rms_norm", "flash_attention") if hasattr(module, n))
    real = getattr(module, target)
    patched = types.SimpleNamespace(**{n: getattr(module, n) for n in dir(module) if not n.startswith("__")})
    setattr(patched, target, lambda *a, **k: real(*a, **{**k, **kw}))
    return dataclasses.replace(case, implementation=kw["implementation"]).call(patched, inputs)


@pytest.mark.parametrize(("kernel", "framework"), PALLAS, ids=PALLAS_IDS)
def test_race_checks_never_report_an_unchecked_run(kernel, framework, monkeypatch):
    from jax.experimental.pallas import tpu as pltpu

    module = entry(kernel.source, framework)
    pltpu.reset_tpu_interpret_mode_state()
    with pytest.raises(RuntimeError, match="cannot report a clean run"):  # nothing simulated since the reset
        module.races_found()
    monkeypatch.setitem(sys.modules, RACE_STATE, types.ModuleType("moved"))  # jax internals moved
    with pytest.raises(RuntimeError, match="race"):
        module.races_found()
    case = smallest(kernel.source, framework)
    inputs = case.inputs(0)
    with pytest.raises(RuntimeError, match="race"):  # the entry's own check raises: no silent "clean" result
        _call_with(case, module, inputs, implementation="pallas", interpret=module.race_checking_params(seed=0))
    monkeypatch.setitem(sys.modules, RACE_STATE, None)  # jax without the module at all
    with pytest.raises(RuntimeError, match="race"):
        module.races_found()
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("kernel", KERNELS, ids=[e.repo_id.split("/")[1] for e in KERNELS])
def test_one_validation_signature_and_case_fields(kernel):
    frameworks = {v.framework for v in load_metadata(kernel.source).variants}
    module = entry(kernel.source, "jax" if "jax" in frameworks else "torch")
    validation = importlib.import_module(f"{module.__name__}.validation")
    params = list(inspect.signature(validation.cases).parameters.values())
    assert [(p.name, p.default) for p in params] == [("backend", inspect.Parameter.empty), ("framework", "jax")]
    for framework in ("jax", "torch"):
        if framework not in frameworks:
            assert validation.cases("cpu", framework=framework) == []
            continue
        impls = entry(kernel.source, framework).IMPLEMENTATIONS
        for backend in ("cpu", "tpu", "cuda"):
            cases = validation.cases(backend, framework=framework)
            assert cases and len({c.name for c in cases}) == len(cases), (backend, framework)
            for c in cases:
                assert isinstance(c, Case) and dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen
                assert isinstance(c.name, str) and c.dtype in CASE_DTYPES
                requested = (c.implementation,) if isinstance(c.implementation, str) else (c.implementation or ())
                assert set(requested) <= set(impls), (c.name, c.implementation)
                assert isinstance(c.tags, tuple) and c.tags and all(isinstance(t, str) for t in c.tags)
                assert c.tolerance is None or (isinstance(c.tolerance, float) and c.tolerance > 0)
    case = smallest(kernel.source, "jax" if "jax" in frameworks else "torch")
    first, again = case.inputs(5), case.inputs(5)
    assert all(relative_error(first[k], again[k]) == 0.0 for k in first if hasattr(first[k], "shape"))


BOTH = [e for e in KERNELS if {v.framework for v in load_metadata(e.source).variants} >= {"jax", "torch"}]


@pytest.mark.parametrize("kernel", BOTH, ids=[e.repo_id.split("/")[1] for e in BOTH])
def test_torch_entry_follows_the_jax_dtype_policy(kernel):
    """Mixed dtypes (the first operand bf16, the others f32): the torch entry computes what the JAX entry does,
    in the same output dtype, instead of refusing."""
    import jax.numpy as jnp
    import torch

    jax_mod, torch_mod = entry(kernel.source, "jax"), entry(kernel.source, "torch")
    case = dataclasses.replace(smallest(kernel.source, "torch"), implementation=None)
    inputs = case.inputs(1)
    floats = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    for k in floats:
        inputs[k] = inputs[k].to(torch.bfloat16 if k == floats[0] else torch.float32)
    as_jax = {k: (jnp.asarray(v.float().numpy(), jnp.bfloat16 if k == floats[0] else None) if k in floats
                  else jnp.asarray(v.numpy())) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out_torch = case.call(torch_mod, inputs)
    out_jax = case.call(jax_mod, as_jax)
    assert str(out_torch.dtype).removeprefix("torch.") == str(out_jax.dtype) == "bfloat16"
    assert relative_error(out_torch, np.asarray(out_jax, np.float32)) <= tolerance("bfloat16")
    assert relative_error(out_torch, case.reference(inputs)) <= tolerance("bfloat16")


def test_dispatch_hands_over_on_a_refusal_at_call_time():
    """The shared dispatch: an implementation that raises NotImplementedError when called passes to the next."""
    module = entry(KERNELS[0].source, "jax")
    dispatch = importlib.import_module(f"{module.__name__}._vendor.dispatch")
    d = dispatch.Dispatch("op", ("a", "b", "c"), {"cpu": ("a", "b")}, ("c",),
                          why_not=lambda n, p, i: "never here" if n == "c" else None)

    def call(name):
        if name == "a":
            raise NotImplementedError("shape not supported\nmore detail")
        return name.upper()

    assert d.run("cpu", None, None, call) == "B"
    assert d.last_implementation() == ("b", "a: skipped, refused at call: shape not supported; b: chosen "
                                            "(default order for cpu)")
    with pytest.raises(NotImplementedError, match="c: skipped, never here"):
        d.run("cpu", "c", None, call)
    with pytest.raises(NotImplementedError, match="no op implementation ran"):
        d.run("cpu", "a", None, call)


def test_platform_comes_from_where_the_operands_live(monkeypatch):
    """Not jax.default_backend() alone (a mock-TPU compile runs on a CPU host): concrete operands' devices first,
    then (under jit) the current mesh, then jax's default device, then the default backend."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh

    platform_of = importlib.import_module(f"{entry(KERNELS[0].source, 'jax').__name__}._vendor.platform").platform_of
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # what a TPU host would say
    x = jnp.ones(4)
    assert platform_of(x) == "cpu"  # the operand lives on the CPU: that wins
    seen = {}
    jax.jit(lambda a: seen.setdefault("traced", platform_of(a)) and a)(x)
    assert seen["traced"] == "tpu"  # traced operands carry no device: the default speaks
    with jax.set_mesh(Mesh(np.array(jax.devices("cpu")[:1]), ("x",))):
        seen.clear()
        jax.jit(lambda a: seen.setdefault("traced", platform_of(a)) and a)(x)
    assert seen["traced"] == "cpu"  # under jit, the current mesh's devices
    with jax.default_device(jax.devices("cpu")[0]):
        seen.clear()
        jax.jit(lambda a: seen.setdefault("traced", platform_of(a)) and a)(x)
    assert seen["traced"] == "cpu"  # jax's default device before the default backend


#: (kernel, layer kind) for every kind a kernel's kernel.yaml says it serves, where it ships the torch entry kernelize
#: loads (a JAX-only kernel cannot be kernelized: kernelize keeps the layers, saying its torch build did not load).
SERVING = [(e, kind) for e in KERNELS for kind in load_metadata(e.source).replaces
           if "torch" in {v.framework for v in load_metadata(e.source).variants}]


#: Layer kind -> the Protocols its kernel keeps, and the function kernelize asks for, as each kind declares them.
LAYER_KIND_PROTOCOLS = {k.name: k.protocols for k in BUILTIN_KINDS}
KIND_EXPORTS = {k.name: k.export for k in BUILTIN_KINDS}


def test_every_declared_layer_kind_has_protocols_and_kernelize_asks_for_one_of_their_entries():
    declared = {kind for e in KERNELS for kind in load_metadata(e.source).replaces}
    assert declared <= set(LAYER_KIND_PROTOCOLS), declared - set(LAYER_KIND_PROTOCOLS)
    assert SERVING and {kind for _, kind in SERVING} == set(KIND_EXPORTS)  # every kind has a kernel checked here
    for kind, export in KIND_EXPORTS.items():
        assert export in protocol_entries(LAYER_KIND_PROTOCOLS[kind][0]), (kind, export)


@pytest.mark.parametrize(("kernel", "kind"), SERVING, ids=[f"{e.repo_id.split('/')[1]}-{k}" for e, k in SERVING])
def test_kernels_serving_a_layer_kind_keep_its_protocols(kernel, kind):
    module = entry(kernel.source, "torch")
    assert layer_kernel_problems(module, kind) == []


def _without(module, *names, **replaced):
    """The entry's public names as a plain namespace, less `names`, with `replaced` swapped in."""
    kept = {n: getattr(module, n) for n in dir(module) if not n.startswith("__") and n not in names}
    return types.SimpleNamespace(**{**kept, **replaced})


def _serving(kind):
    return entry(next(e for e, k in SERVING if k == kind).source, "torch")


def test_a_kernel_missing_a_declared_entry_fails_naming_the_entry():
    rms, experts = _serving("rms_norm"), _serving("moe_experts")
    assert layer_kernel_problems(_without(rms, "rms_norm"), "rms_norm") == [
        "rms_norm: missing (required; RMSNormKernel, layer kind rms_norm)"]
    problems = layer_kernel_problems(_without(experts, "moe_experts"), "moe_experts")
    assert len(problems) == 1 and problems[0].startswith("moe_experts: missing (required")
    # the packed entries are optional, all three or none
    assert layer_kernel_problems(_without(experts, *("pack_experts", "moe_experts_packed", "packing_support")),
                                 "moe_experts") == []
    problems = layer_kernel_problems(_without(experts, "moe_experts_packed"), "moe_experts")
    assert len(problems) == 1 and problems[0].startswith("moe_experts_packed: missing")


def test_a_kernel_whose_entry_does_not_take_the_calls_fails_naming_the_entry_and_the_parameter():
    fa, rms = _serving("attention"), _serving("rms_norm")

    def no_lengths(q, k, v, *, causal=False, sm_scale=None, sliding_window=None, logits_soft_cap=None, sinks=None):
        return fa.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)

    assert layer_kernel_problems(_without(fa, flash_attention=no_lengths), "attention") == [
        "flash_attention: takes no keyword parameter 'q_lengths'",
        "flash_attention: takes no keyword parameter 'kv_lengths'"]

    def renamed(x, w, *, eps, zero_centered=False, scale_after_cast=False, bias):
        return rms.rms_norm(x, w, eps=eps)

    assert layer_kernel_problems(_without(rms, rms_norm=renamed), "rms_norm") == [
        "rms_norm: positional parameter 2 is 'w', the contract says 'weight'",
        "rms_norm: requires parameter 'bias', which the contract never passes"]

    def no_default(x, weight, *, eps, zero_centered, scale_after_cast=False, **kwargs):
        return rms.rms_norm(x, weight, eps=eps)

    assert layer_kernel_problems(_without(rms, rms_norm=no_default), "rms_norm") == [
        "rms_norm: keyword parameter 'zero_centered' needs a default (callers may leave it out)"]


def test_a_layers_class_outside_hf_kernels_convention_fails_naming_the_class():
    import torch

    rms = _serving("rms_norm")

    class RMSNorm(torch.nn.Module):
        has_backward = True

        def __init__(self):
            super().__init__()

        def forward(self, hidden_states):
            return hidden_states

        def helper(self):
            return None

    layers = types.ModuleType(rms.layers.__name__)
    RMSNorm.__module__ = layers.__name__
    layers.RMSNorm = RMSNorm
    assert layer_kernel_problems(_without(rms, layers=layers), "rms_norm") == [
        "layers.RMSNorm: defines a constructor (a layer class must be stateless)",
        "layers.RMSNorm: members beyond has_backward, can_torch_compile: helper"]


def test_a_layout_companion_is_held_to_what_transformers_does_with_it():
    """transformers 5.25's `<X>Layout` beside layer class X may hold state, but it needs a forward of its own (else
    transformers installs one returning None), forward parameters HF kernels accepts X's in place of, and a
    constructor taking the model config; a stateful class with no X beside it is still a broken layer class."""
    import torch

    experts = _serving("moe_experts")
    real = experts.layers.MoEExpertsLayout
    assert layer_kernel_problems(experts, "moe_experts") == []  # the real companion beside MoEExperts

    class NoForward(torch.nn.Module):
        def __init__(self, config):
            super().__init__()

    class OtherForward(NoForward):
        def forward(self, hidden_states, *, top_k_index=None):
            return hidden_states

    for companion, expected in ((NoForward, "defines no forward"), (OtherForward, "does not take the parameters"),
                                (real, None)):
        layers = types.ModuleType(experts.layers.__name__)
        for cls, name in ((experts.layers.MoEExperts, "MoEExperts"), (companion, "MoEExpertsLayout")):
            layers.__dict__[name] = cls
        if companion is not real:
            companion.__module__ = layers.__name__
        problems = [p for p in layer_kernel_problems(_without(experts, layers=layers), "moe_experts")
                    if p.startswith("layers.MoEExpertsLayout")]
        assert (problems == [] if expected is None else len(problems) == 1 and expected in problems[0]), problems
    orphan = types.ModuleType(experts.layers.__name__)
    NoForward.__module__ = orphan.__name__
    orphan.OrphanLayout = NoForward  # no `Orphan` layer class: judged as a layer class, and refused
    assert layer_kernel_problems(_without(experts, layers=orphan), "moe_experts") == [
        "layers.OrphanLayout: defines a constructor (a layer class must be stateless)",
        "layers.OrphanLayout: defines no forward of its own"]
