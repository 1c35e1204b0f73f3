"""The ragged dot's `experts_forward` (transformers' experts-function convention) against the real torch_tpu, in the
TPU environment (.venv-tpu). Not collected by the main suite: tests/tpu/test_experts_forward_tpu.py runs this file with
.venv-tpu's pytest and reads the facts it writes ($KERNEL_HUB_EXPERTS_FACTS).

What a TPU host would run, short of the chip: the whole expert block registered as one torch op per form (with and
without biases) through torch_tpu's jax_op, its schema and autograd; a tiny model's forward through
`ALL_EXPERTS_FUNCTIONS.register(...)` making exactly one call of that op per layer (test-only CPU kernels run the
registered JAX function on the CPU implementation, as torch_tpu_checks.py's `ops_on_cpu` does for the ragged dot);
its gradients through the registered backward op; and the real TPU compiler on what torch_tpu would hand the runtime
(v6e), routing sort and both Pallas ragged dots in one Mosaic-compiled program.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import time
from pathlib import Path

import jax
import pytest
import torch
import torch_tpu  # noqa: F401  (the real package: this file runs only where it is installed)
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

import kernel_hub as kh
from kernel_hub.report.models import tiny_model
from kernel_hub.tpu.target import on_device, tpu_target

FACTS: dict = {"ops": {}, "calls": {}, "errors": {}, "compile": []}
GENERATIONS = ("v6e",)  # the ragged dot alone compiles for v5e too (torch_tpu_checks.py)
OPTIONS = "bool is_transposed, str gate_kind, bool concatenated, str activation, float alpha, float limit"
SCHEMAS = {
    "experts_forward": "(Tensor hidden, Tensor top_k_index, Tensor top_k_weights, Tensor gate_up, Tensor down, *, "
                       f"{OPTIONS}) -> Tensor",
    "experts_forward_bias": "(Tensor hidden, Tensor top_k_index, Tensor top_k_weights, Tensor gate_up, Tensor down, "
                            f"Tensor up_bias, Tensor down_bias, *, {OPTIONS}) -> Tensor",
}


@pytest.fixture(scope="session", autouse=True)
def _write_facts():
    yield
    path = os.environ.get("KERNEL_HUB_EXPERTS_FACTS")
    if path:
        Path(path).write_text(json.dumps(FACTS, indent=1, default=str))


@pytest.fixture(scope="session")
def rd():
    return kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="tpu")


def test_the_block_is_registered_as_one_op_per_form_with_its_schema_and_autograd(rd):
    ops = rd.tpu_ops()
    custom_ops = importlib.import_module("torch._library.custom_ops")
    for entry, schema in SCHEMAS.items():
        op = ops[entry]
        assert str(op._opoverload._schema) == op._qualname + schema
        assert custom_ops._maybe_get_opdef(op._qualname)._backward_fn is not None
        FACTS["ops"][op._qualname] = schema
    with torch.no_grad():  # fake kernels: the JAX function traced for TPU gives [T, H] in hidden's dtype
        meta = functools.partial(torch.empty, device="meta")
        out = ops["experts_forward"](meta(7, 64, dtype=torch.bfloat16), meta(7, 2, dtype=torch.int32),
                                     meta(7, 2, dtype=torch.bfloat16), meta(8, 64, 64, dtype=torch.bfloat16),
                                     meta(8, 64, 32, dtype=torch.bfloat16), is_transposed=False, gate_kind="glu",
                                     concatenated=True, activation="silu", alpha=0.0, limit=0.0)
    assert out.shape == (7, 64) and out.dtype == torch.bfloat16 and out.device.type == "meta"


@pytest.fixture
def block_on_cpu(rd, monkeypatch):
    """Test-only CPU kernels for the two experts ops and their backward ops (the registered JAX functions on the CPU
    implementation, through DLPack), and the build told its CPU tensors are TPU ones: experts_forward's "jax" path
    then calls the registered op. Yields the op calls seen."""
    block = importlib.import_module(f"{rd.__name__}.moe.transformers_experts")
    torch_jax = importlib.import_module(f"{rd.__name__}._vendor.torch_jax")
    ops_module = importlib.import_module(f"{rd.__name__}._vendor.torch_tpu_ops")
    calls: list[str] = []
    kernels = {}
    for bias, entry in ((False, "experts_forward"), (True, "experts_forward_bias")):
        forward = block.experts_function(bias, ("xla",), False)  # XLA's ragged dot: the quickest compile here
        diff = block.DIFFERENTIABLE_BIAS if bias else block.DIFFERENTIABLE
        kernels[entry] = forward
        kernels[f"{entry}_backward"] = torch_jax.vjp_function(forward, diff)

    def run(entry, *tensors, **options):
        calls.append(entry)
        return torch_jax.run_jax(functools.partial(kernels[entry], **options), *tensors)

    ns = rd.tpu_ops()["experts_forward"]._qualname.split("::")[0]
    with torch.library._scoped_library(ns, "IMPL") as lib:
        for entry in kernels:
            lib.impl(entry, functools.partial(run, entry), "CPU")
        monkeypatch.setattr(ops_module, "on_tpu", lambda *tensors: True)
        yield calls


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_a_model_makes_one_op_call_per_layer(rd, block_on_cpu, family):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register("kernel_hub_tpu_check", functools.partial(rd.experts_forward, implementation="jax"))
    model = tiny_model(family)
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    model.set_experts_implementation("kernel_hub_tpu_check")
    with torch.no_grad():
        out = model(input_ids=ids).logits
    entry = "experts_forward_bias" if family == "gpt_oss" else "experts_forward"
    layers = model.config.num_hidden_layers
    assert block_on_cpu == [entry] * layers  # the whole block, one op per layer: no ragged_dot op of its own
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    assert err <= 1e-4, err
    FACTS["errors"][family] = err
    if family != "gpt_oss":  # the backward op once, on the form with every differentiable input
        FACTS["calls"][family] = list(block_on_cpu)
        return
    model.train()
    model(input_ids=ids).logits.square().mean().backward()
    assert block_on_cpu.count(f"{entry}_backward") == layers
    experts = [m for m in model.modules() if hasattr(m, "has_gate")]
    assert all(m.down_proj.grad is not None and m.down_proj.grad.abs().sum() > 0 for m in experts)
    FACTS["calls"][family] = list(block_on_cpu)


def _callable(op):
    opdef = importlib.import_module("torch._library.custom_ops")._maybe_get_opdef(op._qualname)
    return opdef._init_fn


def test_the_block_compiles_for_a_tpu(rd):
    bf16, meta = torch.bfloat16, functools.partial(torch.empty, device="meta")
    t, k, e, h, i = 150, 2, 8, 256, 192  # 300 routed rows, GPT-OSS's layout with biases
    tensors = (meta(t, h, dtype=bf16), meta(t, k, dtype=torch.int32), meta(t, k, dtype=bf16),
               meta(e, h, 2 * i, dtype=bf16), meta(e, i, h, dtype=bf16), meta(e, 2 * i, dtype=bf16),
               meta(e, h, dtype=bf16))
    options = dict(is_transposed=True, gate_kind="clamped_swiglu", concatenated=False, activation="silu",
                   alpha=1.702, limit=7.0)
    jc = _callable(rd.tpu_ops()["experts_forward_bias"])
    args, kwargs = jc._normalize_invocation_args(tensors, options)
    placeholders, statics = jc._get_jax_placeholders(args, kwargs)
    for generation in GENERATIONS:
        start = time.perf_counter()
        with tpu_target(generation) as device:
            chip = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,),
                                abstract_device=AbstractDevice(device.device_kind, 1, "tpu"))
            with jax.sharding.use_abstract_mesh(chip):
                exported = jc.exported(*placeholders, **statics)
            assert exported.platforms == ("tpu",)
            mlir = exported.mlir_module()
            assert mlir.count("tpu_custom_call") >= 2, "both ragged dots should be Mosaic kernels in the one program"
            compiled = jax.jit(exported.call).lower(*on_device(placeholders, device)).compile()
        FACTS["compile"].append({"generation": generation, "device_kind": device.device_kind,
                                 "seconds": round(time.perf_counter() - start, 2),
                                 "mosaic_calls": mlir.count("tpu_custom_call"),
                                 "argument_bytes": int(compiled.memory_analysis().argument_size_in_bytes)})
