"""The torch-tpu builds against the real torch_tpu, in the TPU environment (.venv-tpu: torch 2.13 + torch-tpu 0.2 +
jax 0.10.2 + libtpu). Not collected by the main suite: tests/tpu/test_torch_tpu.py runs this file with .venv-tpu's
pytest and reads the facts it writes ($KERNEL_HUB_TORCH_TPU_FACTS).

This host has no TPU, so no op executes on one: what runs is torch_tpu's registration (schema from the annotated
JAX functions), its fake kernels (the JAX functions traced for TPU), the autograd wiring, the parts of opcheck that
work on meta tensors, the real TPU compiler on exactly what torch_tpu would hand the runtime (v5e, v6e), and the op
plumbing end to end through test-only CPU kernels that run the same JAX functions on the CPU implementation.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import torch_tpu  # noqa: F401  (the real package: this file runs only where it is installed)
from jax.sharding import AbstractDevice, AbstractMesh, AxisType
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.optests.aot_autograd import aot_autograd_check
from torch.testing._internal.optests.fake_tensor import fake_check

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models, kernel_builds.test_bridge's NumPy MoE
sys.path.insert(0, str(ROOT / "kernels/pallas/ragged_dot/tests"))  # quant_testutil's float64 dequantized weights

import kernel_hub as kh  # noqa: E402
from kernel_hub.package.metadata import load_metadata  # noqa: E402
from kernel_hub.tpu.target import on_device, tpu_target  # noqa: E402
from kernel_hub.tpu.worker_common import load_package  # noqa: E402
from kernel_hub.verify.numerics import TOLERANCE, relative_error  # noqa: E402

FACTS: dict = {"ops": {}, "fake": [], "opcheck": {}, "compile": [], "moe": {}, "kernelize": {}, "cpu": {}}
GENERATIONS = ("v5e", "v6e")
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


@pytest.fixture(scope="session", autouse=True)
def _write_facts():
    yield
    path = os.environ.get("KERNEL_HUB_TORCH_TPU_FACTS")
    if path:
        Path(path).write_text(json.dumps(FACTS, indent=1, default=str))


@pytest.fixture(scope="session")
def rd():
    return kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="tpu")


@pytest.fixture(scope="session")
def fa():
    return kh.get_kernel("kernel-hub/flash-attention-tpu", framework="torch", backend="tpu")


_REPOS = {"ragged_dot": "kernel-hub/ragged-dot-tpu", "flash_attention": "kernel-hub/flash-attention-tpu",
          "rms_norm": "kernel-hub/rms-norm-tpu"}


def namespace(kernel: str, package_dir: Path | None = None, version: str | None = None) -> str:
    """The namespace the brief asks for, computed here (independent of the package's own naming): kernel.yaml's
    version with '.' as _2e, and the sha256 of the loaded package's files (path-length-prefixed, in path order)."""
    version = version or load_metadata(ROOT / "kernels/pallas" / kernel).version
    if package_dir is None:
        package_dir = Path(kh.get_kernel(_REPOS[kernel], framework="torch", backend="tpu").__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel, data = path.relative_to(package_dir).as_posix().encode(), path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(rel), rel, len(data)) + data)
    return f"kernel_hub_{kernel}_v{version.replace('.', '_2e')}_c{digest.hexdigest()[:16]}"


def meta(*shape: int, dtype: torch.dtype = F32, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


# ---- the ops, their schemas and their registration ---------------------------------------------------------------

ATTENTION_OPTIONS = "bool has_sinks, float sm_scale, SymInt? sliding_window, float? logits_soft_cap"
SCHEMAS = {
    ("ragged_dot", "ragged_dot"):
        "(Tensor lhs, Tensor rhs, Tensor group_sizes, *, ScalarType preferred_element_type) -> Tensor",
    ("ragged_dot", "ragged_dot_backward"):
        "(Tensor lhs, Tensor rhs, Tensor group_sizes, Tensor grad_out, *, ScalarType preferred_element_type) "
        "-> (Tensor, Tensor)",
    ("ragged_dot", "ragged_dot_quantized"):
        "(Tensor lhs, Tensor rhs, Tensor rhs_scale, Tensor group_sizes, *, ScalarType preferred_element_type) "
        "-> Tensor",
    # gradients of lhs and rhs_scale (always zero: listed so the return is two tensors, torch_bridge.py says why)
    ("ragged_dot", "ragged_dot_quantized_backward"):
        "(Tensor lhs, Tensor rhs, Tensor rhs_scale, Tensor group_sizes, Tensor grad_out, *, "
        "ScalarType preferred_element_type) -> (Tensor, Tensor)",
    ("flash_attention", "flash_attention"):
        "(Tensor q, Tensor k, Tensor v, Tensor sinks, Tensor q_lengths, Tensor kv_lengths, *, bool causal, "
        f"{ATTENTION_OPTIONS}) -> Tensor",
    ("flash_attention", "flash_attention_backward"):
        "(Tensor q, Tensor k, Tensor v, Tensor sinks, Tensor q_lengths, Tensor kv_lengths, Tensor grad_out, *, "
        f"bool causal, {ATTENTION_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor)",
    ("flash_attention", "decode_attention"):
        f"(Tensor q, Tensor k_cache, Tensor v_cache, Tensor kv_lengths, Tensor sinks, *, {ATTENTION_OPTIONS}) "
        "-> Tensor",
}


def test_every_entry_is_registered_with_its_schema(rd, fa):
    assert rd.__kernel_hub__.variant == fa.__kernel_hub__.variant == "torch-tpu"
    assert set(rd.tpu_ops()) == {"ragged_dot", "ragged_dot_quantized", "experts_forward", "experts_forward_bias"}
    # ragged_paged_attention: registered where the flash-attention JAX package has that entry
    paged = {"ragged_paged_attention"} if importlib.import_module(".torch_bridge", fa.__name__).has_ragged_paged() \
        else set()
    assert set(fa.tpu_ops()) == {"flash_attention", "decode_attention", *paged}
    custom_ops = importlib.import_module("torch._library.custom_ops")
    for (kernel, entry), args in SCHEMAS.items():
        name = f"{namespace(kernel)}::{entry}"
        overload = getattr(getattr(torch.ops, namespace(kernel)), entry).default
        assert str(overload._schema) == name + args
        # register_autograd on the two differentiable entries only (their backward ops and decode have none)
        has_formula = custom_ops._maybe_get_opdef(name)._backward_fn is not None
        assert has_formula == (entry in ("ragged_dot", "ragged_dot_quantized", "flash_attention")), name
        FACTS["ops"][name] = {"schema": args, "autograd": has_formula}
    for module, entries in ((rd, ["ragged_dot"]), (fa, ["flash_attention", "decode_attention"])):
        described = module.describe("tpu")
        assert module.tpu_ops()[entries[0]]._qualname in described and "jax_op" in described


def test_a_second_import_reuses_the_ops_and_another_version_registers_its_own(rd, tmp_path):
    first = rd.tpu_ops()["ragged_dot"]
    package = Path(rd.__file__).parent
    again = load_package(str(shutil.copytree(package, tmp_path / "ragged_dot_again")), "torch_tpu_api.py")
    assert again is not rd and again.ragged_dot is not rd.ragged_dot  # another module copy of the same build
    assert again.tpu_ops()["ragged_dot"] is first

    other = shutil.copytree(package, tmp_path / "ragged_dot_v9_9")
    (other / "release.py").write_text('VERSION = "9.9.0"\n')
    newer = load_package(str(other), "torch_tpu_api.py")
    op = newer.tpu_ops()["ragged_dot"]
    assert op is not first and op._qualname == f"{namespace('ragged_dot', other, '9.9.0')}::ragged_dot"
    assert first._qualname == f"{namespace('ragged_dot')}::ragged_dot"  # the first version's op is still there
    for registered in (first, op):
        out = registered(meta(40, 32), meta(4, 32, 16), meta(4, dtype=I32), preferred_element_type=F32)
        assert out.shape == (40, 16)
    FACTS["ops"]["versions_in_one_process"] = [first._qualname, op._qualname]


# ---- fake tensors: shapes and dtypes from the JAX functions traced for TPU -------------------------------------------

RAGGED = [  # (M, K, N, G, input dtype, preferred_element_type): the contract says out [M, N] in the preferred dtype
    (300, 256, 384, 8, BF16, BF16),  # M not a multiple of the row tile
    (300, 256, 384, 8, BF16, F32),
    (130, 200, 72, 3, F32, F32),  # K and N not multiples of 128
    (64, 128, 128, 1, F32, F32),  # one group
]
PREFILL = [  # (B, Hq, Hkv, Sq, Skv, D, dtype, options): out is q's shape and dtype
    (2, 8, 2, 100, 260, 128, BF16, dict(causal=True, has_sinks=False, sm_scale=0.088, sliding_window=None,
                                         logits_soft_cap=None)),
    (1, 4, 4, 128, 128, 64, F32, dict(causal=False, has_sinks=True, sm_scale=0.125, sliding_window=32,
                                      logits_soft_cap=30.0)),
]
DECODE = [  # (B, Hq, Hkv, S, D, dtype, options): out is q's shape [B, Hq, D] and dtype
    (3, 8, 1, 1000, 128, BF16, dict(has_sinks=False, sm_scale=0.088, sliding_window=None, logits_soft_cap=None)),
    (2, 4, 4, 100, 64, F32, dict(has_sinks=True, sm_scale=0.125, sliding_window=64, logits_soft_cap=20.0)),
]


def ragged_args(m, k, n, g, dtype, grad=False, make=meta):
    return (make(m, k, dtype=dtype, grad=grad), make(g, k, n, dtype=dtype, grad=grad), make(g, dtype=I32))


QUANTIZED = [  # (M, K, N, G, lhs dtype, weight dtype, preferred_element_type)
    (300, 256, 384, 8, BF16, torch.int8, BF16),
    (300, 256, 384, 8, BF16, torch.float8_e4m3fn, F32),
    (130, 200, 72, 3, F32, torch.float8_e4m3fn, F32),  # K and N not multiples of 128: partial scale blocks
    (64, 128, 136, 1, F32, torch.int8, F32),
]


def quantized_args(m, k, n, g, dtype, wdtype, grad=False, make=meta):
    """lhs, quantized rhs, its f32 scales ([G, 1, N] int8, [G, ceil(K/128), ceil(N/128)] float8), group sizes."""
    scale = (g, 1, n) if wdtype == torch.int8 else (g, -(-k // 128), -(-n // 128))
    return (make(m, k, dtype=dtype, grad=grad), make(g, k, n, dtype=wdtype), make(*scale), make(g, dtype=I32))


def prefill_args(b, hq, hkv, sq, skv, d, dtype, grad=False, make=meta):
    return (make(b, hq, sq, d, dtype=dtype, grad=grad), make(b, hkv, skv, d, dtype=dtype, grad=grad),
            make(b, hkv, skv, d, dtype=dtype, grad=grad), make(hq, grad=grad), make(b, dtype=I32), make(b, dtype=I32))


def decode_args(b, hq, hkv, s, d, dtype, make=meta):
    return (make(b, hq, d, dtype=dtype), make(b, hkv, s, d, dtype=dtype), make(b, hkv, s, d, dtype=dtype),
            make(b, dtype=I32), make(hq))


def fake_maker(mode):
    def make(*shape, dtype=F32, grad=False):
        with mode:
            return torch.empty(shape, dtype=dtype, requires_grad=grad)
    return make


def cases(rd, fa):
    """(label, op, args, kwargs, expected shape, expected dtype) for meta tensors and for fake tensors."""
    out = []
    for mode_name in ("meta", "fake"):
        make = meta if mode_name == "meta" else fake_maker(FakeTensorMode())
        for m, k, n, g, dt, pref in RAGGED:
            out.append((f"ragged_dot {mode_name} [{m},{k}]x[{g},{k},{n}] {dt}->{pref}", rd.tpu_ops()["ragged_dot"],
                        ragged_args(m, k, n, g, dt, make=make), dict(preferred_element_type=pref), (m, n), pref))
        for m, k, n, g, dt, wdt, pref in QUANTIZED:
            out.append((f"ragged_dot_quantized {mode_name} [{m},{k}]x[{g},{k},{n}] {dt} {wdt}->{pref}",
                        rd.tpu_ops()["ragged_dot_quantized"], quantized_args(m, k, n, g, dt, wdt, make=make),
                        dict(preferred_element_type=pref), (m, n), pref))
        for b, hq, hkv, sq, skv, d, dt, opts in PREFILL:
            out.append((f"flash_attention {mode_name} q[{b},{hq},{sq},{d}] kv[{b},{hkv},{skv},{d}] {dt}",
                        fa.tpu_ops()["flash_attention"], prefill_args(b, hq, hkv, sq, skv, d, dt, make=make), opts,
                        (b, hq, sq, d), dt))
        for b, hq, hkv, s, d, dt, opts in DECODE:
            out.append((f"decode_attention {mode_name} q[{b},{hq},{d}] cache[{b},{hkv},{s},{d}] {dt}",
                        fa.tpu_ops()["decode_attention"], decode_args(b, hq, hkv, s, d, dt, make=make), opts,
                        (b, hq, d), dt))
    return out


def test_fake_kernels_give_the_contract_shapes_and_dtypes(rd, fa):
    for label, op, args, kwargs, shape, dtype in cases(rd, fa):
        out = op(*args, **kwargs)
        assert tuple(out.shape) == shape and out.dtype == dtype, label
        assert out.device == args[0].device, label
        assert type(out) is type(args[0]), label  # meta in, meta out; FakeTensor in, FakeTensor out
        FACTS["fake"].append(f"{label}: {tuple(out.shape)} {out.dtype}")


def test_gradients_flow_through_the_registered_backward_ops(rd, fa):
    lhs, rhs, sizes = ragged_args(300, 256, 384, 8, BF16, grad=True)
    out = rd.tpu_ops()["ragged_dot"](lhs, rhs, sizes, preferred_element_type=F32)
    d_lhs, d_rhs = torch.autograd.grad(out.sum(), (lhs, rhs))
    assert (d_lhs.shape, d_lhs.dtype, d_rhs.shape, d_rhs.dtype) == (lhs.shape, BF16, rhs.shape, BF16)
    for wdtype in (torch.int8, torch.float8_e4m3fn):  # quantized weights: lhs only
        lhs, rhs, scale, sizes = quantized_args(300, 256, 384, 8, BF16, wdtype, grad=True)
        out = rd.tpu_ops()["ragged_dot_quantized"](lhs, rhs, scale, sizes, preferred_element_type=BF16)
        (d_lhs,) = torch.autograd.grad(out.float().sum(), lhs)
        assert (d_lhs.shape, d_lhs.dtype) == (lhs.shape, BF16) and not rhs.requires_grad

    args = prefill_args(2, 8, 2, 100, 260, 128, BF16, grad=True)
    out = fa.tpu_ops()["flash_attention"](*args, **PREFILL[0][-1])
    grads = torch.autograd.grad(out.float().sum(), args[:4])
    assert [(g.shape, g.dtype) for g in grads] == [(a.shape, a.dtype) for a in args[:4]]  # sinks stay f32

    q, k, v, lens, sinks = decode_args(3, 8, 1, 1000, 128, BF16)
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="no autograd formula"):  # decode is forward only: nothing registered
        torch.autograd.grad(fa.tpu_ops()["decode_attention"](q, k, v, lens, sinks, **DECODE[0][-1]).sum(), q)


# ---- opcheck: the parts that run without a TPU, and proof of those that do not -------------------------------------

def _same_metadata(a, b, msg=None):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if isinstance(x, torch.Tensor):
            assert (x.shape, x.dtype, x.device) == (y.shape, y.dtype, y.device), msg


def _opcheck_cases(rd, fa):
    return {
        "ragged_dot": (rd.tpu_ops()["ragged_dot"], ragged_args(300, 256, 384, 8, BF16, grad=True),
                       dict(preferred_element_type=BF16)),
        "ragged_dot_quantized": (rd.tpu_ops()["ragged_dot_quantized"],
                                 quantized_args(300, 256, 384, 8, BF16, torch.float8_e4m3fn, grad=True),
                                 dict(preferred_element_type=BF16)),
        "flash_attention": (fa.tpu_ops()["flash_attention"], prefill_args(2, 8, 2, 100, 260, 128, BF16, grad=True),
                            PREFILL[0][-1]),
        "decode_attention": (fa.tpu_ops()["decode_attention"], decode_args(3, 8, 1, 1000, 128, BF16), DECODE[0][-1]),
    }


def test_opcheck_parts_that_run_on_meta_tensors(rd, fa):
    tc = unittest.TestCase()
    for entry, (op, args, kwargs) in _opcheck_cases(rd, fa).items():
        overload = op._opoverload
        # torch.library.opcheck returns early from every test on abstract (meta/fake) tensors: all "SUCCESS" without
        # checking anything, so its verdict on meta tensors proves nothing. Its parts are run one by one instead.
        vacuous = torch.library.opcheck(op, args, kwargs, test_utils="ALL")
        assert set(vacuous.values()) == {"SUCCESS"}
        # test_schema's claim without SchemaCheckMode (which reads values: .item() fails on meta): nothing mutated
        # or aliased in the schema, and the output is a new tensor
        schema = overload._schema
        assert not schema.is_mutable and all(a.alias_info is None for a in (*schema.arguments, *schema.returns))
        out = op(*args, **kwargs)
        assert all(out is not a for a in args)
        # test_faketensor: the op on fake tensors agrees with the op on these (meta) tensors
        fake_check(overload, args, kwargs)
        # test_aot_dispatch_static: AOTAutograd traces forward and backward through the fake kernels (functionalization,
        # the backward op's fake kernel); outputs compared by metadata (meta tensors have no values)
        with_grad = any(a.requires_grad for a in args)
        aot_autograd_check(functools.partial(overload, **kwargs), args, {}, dynamic=False,
                           assert_raises_regex_fn=tc.assertRaisesRegex, assert_equals_fn=_same_metadata,
                           check_gradients=with_grad)
        # test_aot_dispatch_dynamic: torch_tpu 0.2's default fake kernel refuses symbolic sizes
        with pytest.raises(RuntimeError, match="Symbolic dimensions are not supported in the default fake kernel"):
            aot_autograd_check(functools.partial(overload, **kwargs), args, {}, dynamic=True,
                               assert_raises_regex_fn=tc.assertRaisesRegex, assert_equals_fn=_same_metadata,
                               check_gradients=with_grad)
        FACTS["opcheck"][entry] = {
            "ran_on_meta": ["schema (static: functional, no aliasing)", "test_faketensor (fake_check)",
                            "test_aot_dispatch_static (metadata)",
                            "test_autograd_registration (Autograd key)" if with_grad else "no autograd (forward only)"],
            "refused": {"test_aot_dispatch_dynamic": "torch_tpu's default fake kernel refuses symbolic sizes"},
        }


def test_opcheck_on_real_tensors_needs_a_tpu(rd):
    """Every opcheck test runs the op on real tensors; here the only real tensors are CPU ones, and the op's output
    must be allocated on the "tpu" device, which torch_tpu registers only where a TPU is present."""
    args = ragged_args(40, 32, 16, 4, F32, make=lambda *s, dtype=F32, grad=False: torch.zeros(s, dtype=dtype))
    results = torch.library.opcheck(rd.tpu_ops()["ragged_dot"], args, dict(preferred_element_type=F32),
                                    raise_exception=False)
    assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}
    for name, result in results.items():
        if name == "test_autograd_registration":  # no input requires grad: it returns before running the op
            assert result == "SUCCESS"
            continue
        assert isinstance(result, Exception) and "device type at start of device string: tpu" in str(result), name
    FACTS["opcheck"]["real_tensors"] = {k: "SUCCESS" if v == "SUCCESS" else str(v).splitlines()[0][:160]
                                        for k, v in results.items()}


# ---- the real TPU compiler on what torch_tpu would run ---------------------------------------------------------------

def _compile_cases(rd, fa):
    ragged = rd.tpu_ops()["ragged_dot"]
    flash, decode = fa.tpu_ops()["flash_attention"], fa.tpu_ops()["decode_attention"]
    ns_r, ns_f = namespace("ragged_dot"), namespace("flash_attention")
    backward = lambda ns, entry: getattr(getattr(torch.ops, ns), f"{entry}_backward").default
    q, k, v, s, ql, kl = prefill_args(1, 16, 4, 512, 512, 128, BF16)
    return [  # (label, op overload or CustomOpDef, tensors, static options)
        ("ragged_dot fwd bf16 [300,256]x[8,256,384]", ragged, ragged_args(300, 256, 384, 8, BF16),
         dict(preferred_element_type=BF16)),
        ("ragged_dot fwd f32 [300,256]x[8,256,384]", ragged, ragged_args(300, 256, 384, 8, F32),
         dict(preferred_element_type=F32)),
        ("ragged_dot bwd bf16 [300,256]x[8,256,384]", backward(ns_r, "ragged_dot"),
         (*ragged_args(300, 256, 384, 8, BF16), meta(300, 384, dtype=BF16)), dict(preferred_element_type=BF16)),
        ("ragged_dot_quantized fwd int8 bf16 [300,256]x[8,256,384]", rd.tpu_ops()["ragged_dot_quantized"],
         quantized_args(300, 256, 384, 8, BF16, torch.int8), dict(preferred_element_type=BF16)),
        ("ragged_dot_quantized fwd fp8 bf16 [300,256]x[8,256,384]", rd.tpu_ops()["ragged_dot_quantized"],
         quantized_args(300, 256, 384, 8, BF16, torch.float8_e4m3fn), dict(preferred_element_type=BF16)),
        ("ragged_dot_quantized bwd fp8 bf16 [300,256]x[8,256,384]", backward(ns_r, "ragged_dot_quantized"),
         (*quantized_args(300, 256, 384, 8, BF16, torch.float8_e4m3fn), meta(300, 384, dtype=BF16)),
         dict(preferred_element_type=BF16)),
        ("flash_attention fwd bf16 causal GQA 16/4 S512 D128", flash, (q, k, v, s, ql, kl), PREFILL[0][-1]),
        ("flash_attention bwd bf16 causal GQA 16/4 S512 D128", backward(ns_f, "flash_attention"),
         (q, k, v, s, ql, kl, meta(1, 16, 512, 128, dtype=BF16)), PREFILL[0][-1]),
        ("decode_attention bf16 B8 GQA 16/4 S2048 D128", decode, decode_args(8, 16, 4, 2048, 128, BF16),
         DECODE[0][-1]),
    ]


def _callable(op):
    """torch_tpu's JaxCallable behind an op: the function it exports for TPU and hands to the runtime."""
    qualname = op._qualname if hasattr(op, "_qualname") else op._schema.name
    opdef = importlib.import_module("torch._library.custom_ops")._maybe_get_opdef(qualname)
    jc = opdef._init_fn
    assert type(jc).__name__ == "JaxCallable", type(jc)
    return jc


def test_registered_functions_compile_for_v5e_and_v6e(rd, fa):
    for label, op, tensors, options in _compile_cases(rd, fa):
        jc = _callable(op)
        args, kwargs = jc._normalize_invocation_args(tensors, options)
        placeholders, statics = jc._get_jax_placeholders(args, kwargs)
        for generation in GENERATIONS:
            start = time.perf_counter()
            with tpu_target(generation) as device:
                # what the op's wrapper does on a TPU host: trace under that chip (here named by the mock device)
                chip = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,),
                                    abstract_device=AbstractDevice(device.device_kind, 1, "tpu"))
                with jax.sharding.use_abstract_mesh(chip):
                    exported = jc.exported(*placeholders, **statics)
                assert exported.platforms == ("tpu",)
                assert "tpu_custom_call" in exported.mlir_module(), f"{label}: no Mosaic kernel in the export"
                compiled = jax.jit(exported.call).lower(*on_device(placeholders, device)).compile()
            mem = compiled.memory_analysis()
            assert mem.argument_size_in_bytes > 0 and mem.output_size_in_bytes > 0
            FACTS["compile"].append({"case": label, "generation": generation, "device_kind": device.device_kind,
                                     "seconds": round(time.perf_counter() - start, 2),
                                     "argument_bytes": int(mem.argument_size_in_bytes),
                                     "temp_bytes": int(mem.temp_size_in_bytes)})
    assert {(c["case"], c["generation"]) for c in FACTS["compile"]} == {
        (label, g) for label, *_ in _compile_cases(rd, fa) for g in GENERATIONS}


# ---- the op plumbing end to end: ragged_dot and moe_experts through the registered op -------------------------------

@pytest.fixture
def ops_on_cpu(rd, monkeypatch):
    """Test-only CPU kernels for the ragged-dot ops (the registered JAX function with the CPU implementation, and its
    vjp function, through DLPack), and the bridge told these CPU tensors are TPU ones: the torch entry then takes its
    TPU path through the registered op, its autograd formula and its backward op. Yields the kernel calls seen."""
    bridge = importlib.import_module(f"{rd.__name__}.torch_bridge")
    torch_jax = importlib.import_module(f"{rd.__name__}._vendor.torch_jax")
    forward = bridge.ragged_dot_function(("cpu",), False)
    backward = torch_jax.vjp_function(forward, bridge.DIFFERENTIABLE)
    quantized = bridge.ragged_dot_quantized_function(("cpu",), False)
    quantized_backward = torch_jax.vjp_function(quantized, bridge.QUANTIZED_DIFFERENTIABLE)
    calls: list[str] = []

    compiled = {kind: jax.jit(fn, static_argnames="preferred_element_type") for kind, fn in (
        ("forward", forward), ("backward", backward), ("quantized_forward", quantized),
        ("quantized_backward", quantized_backward))}

    def run(kind, *tensors, preferred_element_type):
        calls.append(kind)
        fixed = functools.partial(compiled[kind], preferred_element_type=torch_jax.jax_dtype(preferred_element_type))
        return torch_jax.run_jax(fixed, *tensors)

    ns, entry = rd.tpu_ops()["ragged_dot"]._qualname.split("::")
    with torch.library._scoped_library(ns, "IMPL") as lib:
        lib.impl(entry, functools.partial(run, "forward"), "CPU")
        lib.impl(f"{entry}_backward", functools.partial(run, "backward"), "CPU")
        lib.impl(f"{entry}_quantized", functools.partial(run, "quantized_forward"), "CPU")
        lib.impl(f"{entry}_quantized_backward", functools.partial(run, "quantized_backward"), "CPU")
        monkeypatch.setattr(bridge, "on_tpu", lambda *tensors: True)
        yield calls


def test_ragged_dot_runs_through_the_registered_op_and_its_autograd(rd, ops_on_cpu):
    ref = importlib.import_module(f"{rd.__name__}._vendor.ragged_reference")
    g = torch.Generator().manual_seed(0)
    lhs = torch.randn(37, 24, generator=g, requires_grad=True)
    rhs = torch.randn(4, 24, 40, generator=g, requires_grad=True)
    sizes = torch.tensor([9, 0, 20, 5])  # an empty group, 3 rows past the end; int64 in, int32 to the op
    dout = torch.randn(37, 40, generator=g)
    out = rd.ragged_dot(lhs, rhs, sizes, implementation="jax")
    d_lhs, d_rhs = torch.autograd.grad(out, (lhs, rhs), dout)
    assert ops_on_cpu == ["forward", "backward"]
    expected = ref.reference_ragged_dot(lhs.detach().numpy(), rhs.detach().numpy(), sizes.numpy())
    e_lhs, e_rhs = ref.reference_ragged_dot_grads(lhs.detach().numpy(), rhs.detach().numpy(), sizes.numpy(),
                                                  dout.numpy())
    for actual, want in ((out, expected), (d_lhs, e_lhs), (d_rhs, e_rhs)):
        assert relative_error(actual.detach().numpy(), want) <= TOLERANCE["float32"]
    assert not out[34:].any() and not d_rhs[1].any()  # rows past the end, the empty group's gradient


def test_moe_experts_composes_two_ragged_dots_through_the_registered_op(rd, ops_on_cpu):
    np_moe = importlib.import_module("kernel_builds.test_bridge").np_moe  # the suite's float64 per-token MoE
    g = torch.Generator().manual_seed(3)
    e, h, i, t, k = 6, 32, 24, 9, 2
    x = torch.randn(t, h, generator=g)
    gate_up = (torch.randn(e, 2 * i, h, generator=g) * 0.3).requires_grad_(True)
    down = (torch.randn(e, h, i, generator=g) * 0.3).requires_grad_(True)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    idx[0, 1] = e  # an expert-parallel sentinel: dropped
    w = torch.softmax(torch.randn(t, k, generator=g), -1)
    out = rd.moe_experts(x, idx, w, gate_up, down, implementation="jax")
    assert ops_on_cpu == ["forward", "forward"]  # gate_up and down projections, both through the op
    f64 = lambda z: z.detach().double().numpy()
    expected = np_moe(f64(x), idx.numpy(), f64(w), f64(gate_up), f64(down), transposed=False, concatenated=True)
    assert relative_error(out.detach().numpy(), expected) <= TOLERANCE["float32"]
    grads = torch.autograd.grad(out.sum(), (gate_up, down))
    assert ops_on_cpu.count("backward") == 2 and all(gr.abs().sum() > 0 for gr in grads)
    name, _ = rd.last_implementation()
    FACTS["moe"] = {"calls": list(ops_on_cpu), "error": relative_error(out.detach().numpy(), expected),
                    "last_implementation": name}


def test_quantized_weights_run_through_the_registered_quantized_op_and_its_autograd(rd, ops_on_cpu):
    """rhs_scale on (stand-in) TPU tensors: ragged_dot runs `::ragged_dot_quantized` and its backward op, against the
    float64 dequantized weights; moe_experts with scales runs both projections through it."""
    from quant_testutil import dequantize64, reference

    g = torch.Generator().manual_seed(4)
    sizes = [9, 0, 20, 5]
    errors = {}
    for wdtype, name in ((torch.int8, "int8"), (torch.float8_e4m3fn, "fp8")):
        ops_on_cpu.clear()
        q, s = rd.quantize(torch.randn(4, 200, 136, generator=g) / 14, wdtype)
        lhs = torch.randn(37, 200, generator=g, requires_grad=True)
        dout = torch.randn(37, 136, generator=g)
        out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s, implementation="jax")
        (d_lhs,) = torch.autograd.grad(out, lhs, dout)
        assert ops_on_cpu == ["quantized_forward", "quantized_backward"]
        w64 = dequantize64(q.to(F32).numpy(), s.numpy(), name)
        lhs64 = lhs.detach().double().numpy()
        d64 = reference(dout.double().numpy(), np.swapaxes(w64, 1, 2), sizes)
        errors[name] = [relative_error(out.detach().numpy(), reference(lhs64, w64, sizes)),
                        relative_error(d_lhs.numpy(), d64)]
        assert max(errors[name]) <= TOLERANCE["float32"], errors
        assert not out[34:].any() and not d_lhs[34:].any()
    ops_on_cpu.clear()
    e, h, i, t = 5, 136, 72, 7
    up, s_up = rd.quantize(torch.randn(e, h, 2 * i, generator=g) / 12, torch.int8)
    down, s_down = rd.quantize(torch.randn(e, i, h, generator=g) / 9, torch.int8)
    idx = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)])
    w = torch.softmax(torch.randn(t, 2, generator=g), -1)
    out = rd.moe_experts(torch.randn(t, h, generator=g), idx, w, up, down, is_transposed=True,
                         w_gate_up_scale=s_up, w_down_scale=s_down, implementation="jax")
    assert ops_on_cpu == ["quantized_forward", "quantized_forward"] and out.shape == (t, h)
    FACTS["quantized"] = {"errors": errors, "moe_calls": list(ops_on_cpu)}


# ---- an expert-parallel op: a mesh and partition specs ------------------------------------------------------------

def test_an_expert_parallel_op_registers_with_its_mesh_and_partition_specs(rd):
    """The shape moe_experts(..., mesh, expert_axis) will take on TPU: one more OpSpec, with a mesh over which the
    expert weights are split. A stand-in JAX function (each device's experts, summed over the axis), not MoE math."""
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    ops = importlib.import_module(f"{rd.__name__}._vendor.torch_tpu_ops")
    bridge = importlib.import_module(f"{rd.__name__}.torch_bridge")
    mesh = Mesh(topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2").devices, ("ep",))

    def experts_sum(x: jax.Array, w: jax.Array, *, scale: float) -> jax.Array:
        local = lambda x, w: jax.lax.psum(jax.numpy.einsum("tk,ekn->tn", x, w), "ep") * scale
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("ep")), out_specs=P(), check_vma=False)(x, w)

    spec = ops.OpSpec("experts_sum_ep4", experts_sum, differentiable=(0, 1), mesh=mesh,
                      input_partition_specs=(P(), P("ep")), output_partition_specs=P())
    op = bridge.TPU_OPS.add(spec)
    assert bridge.TPU_OPS.add(spec) is op  # the same description again: the same op
    with pytest.raises(ValueError, match="described differently"):
        bridge.TPU_OPS.add(ops.OpSpec("experts_sum_ep4", experts_sum, differentiable=(0,), mesh=mesh))
    assert str(op._opoverload._schema).endswith("experts_sum_ep4(Tensor x, Tensor w, *, float scale) -> Tensor")
    # torch tensors are per-device shards: w holds 2 of the 8 experts on each of the 4 devices
    x, w = meta(16, 32, grad=True), meta(2, 32, 8, grad=True)
    out = op(x, w, scale=0.5)
    assert tuple(out.shape) == (16, 8)
    d_x, d_w = torch.autograd.grad(out.sum(), (x, w))
    assert d_x.shape == x.shape and d_w.shape == w.shape  # the backward op's specs: the inputs' own
    jc = _callable(op)
    args, kwargs = jc._normalize_invocation_args((x.detach(), w.detach()), dict(scale=0.5))
    placeholders, statics = jc._get_jax_placeholders(args, kwargs)
    assert [p.shape for p in placeholders] == [(16, 32), (8, 32, 8)]  # global: the experts of all 4 devices
    exported = jc.exported(*placeholders, **statics)
    sharded = [jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=NamedSharding(mesh, s))
               for p, s in zip(placeholders, spec.input_partition_specs, strict=True)]
    with tpu_target("v6e"):
        jax.jit(exported.call).lower(*sharded).compile()
    FACTS["ops"]["expert_parallel"] = str(op._opoverload._schema)


# ---- tensors that are not on a TPU -----------------------------------------------------------------------------------

def test_cpu_tensors_run_the_cpu_path_and_say_so(rd, fa):
    ragged_ref = importlib.import_module(f"{rd.__name__}._vendor.ragged_reference")
    attn_ref = importlib.import_module(f"{fa.__name__}._vendor.attention_reference")
    g = torch.Generator().manual_seed(1)
    lhs, rhs, sizes = torch.randn(20, 16, generator=g), torch.randn(3, 16, 8, generator=g), torch.tensor([5, 0, 12])
    q, kv = torch.randn(2, 4, 6, 16, generator=g), torch.randn(2, 2, 10, 16, generator=g)
    cache_lens = torch.tensor([10, 3], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = rd.ragged_dot(lhs, rhs, sizes)
        rd_last = rd.last_implementation()
        prefill = fa.flash_attention(q, kv, kv, causal=True)
        decode = fa.decode_attention(q[:, :, 0], kv, kv, cache_lens)
        fa_last = fa.last_implementation()
    assert relative_error(out.numpy(), ragged_ref.reference_ragged_dot(lhs.numpy(), rhs.numpy(), sizes.numpy())) \
        <= TOLERANCE["float32"]
    assert relative_error(prefill.numpy(), attn_ref.reference_attention(q.numpy(), kv.numpy(), kv.numpy(),
                                                                        causal=True)) <= TOLERANCE["float32"]
    assert relative_error(decode.numpy(), attn_ref.reference_decode_attention(
        q[:, :, 0].numpy(), kv.numpy(), kv.numpy(), cache_lens.numpy())) <= TOLERANCE["float32"]
    messages = [str(w.message) for w in seen]
    for entry in ("ragged_dot", "flash_attention", "decode_attention"):
        said = [m for m in messages if m.startswith(f"{entry} of the torch-tpu build got tensors on cpu")]
        assert len(said) == 1 and "move the tensors to the TPU" in said[0], messages
    assert rd_last[0] == fa_last[0] == "torch" and "got tensors on cpu" in rd_last[1] and "decode" in fa_last[1]
    # the registered op itself, handed CPU tensors, cannot run them (torch_tpu allocates its output on "tpu")
    with pytest.raises(RuntimeError, match="device type at start of device string: tpu"):
        rd.tpu_ops()["ragged_dot"](lhs, rhs, sizes.to(torch.int32), preferred_element_type=F32)
    FACTS["cpu"] = {"warning": messages[0], "last_implementation": rd_last}


def test_torch_cpu_build_never_imports_torch_tpu_although_it_is_installed():
    """torch itself imports torch_tpu on `import torch` where it is installed (its device-backend autoload entry
    point); with that off, using the torch-cpu builds leaves torch_tpu unimported."""
    code = (
        "import sys, torch, kernel_hub as kh\n"
        "rd = kh.get_kernel('kernel-hub/ragged-dot-tpu', framework='torch', backend='cpu')\n"
        "fa = kh.get_kernel('kernel-hub/flash-attention-tpu', framework='torch', backend='cpu')\n"
        "rd.moe_experts(torch.randn(4, 8), torch.tensor([[0, 1]] * 4), torch.ones(4, 2) / 2, torch.randn(3, 12, 8),"
        " torch.randn(3, 8, 6))\n"
        "fa.flash_attention(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))\n"
        "print(rd.__kernel_hub__.variant, fa.__kernel_hub__.variant, 'torch_tpu' in sys.modules,"
        " hasattr(rd, 'tpu_ops'))\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torch-cpu", "torch-cpu", "False", "False"]


# ---- kernelize for a TPU -------------------------------------------------------------------------------------------

def test_kernelize_for_tpu_picks_the_torch_tpu_build_and_says_it_is_not_validated():
    from tiny_models import tiny_model

    model = tiny_model("qwen3_moe")
    tokens = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=tokens).logits
    report = kh.kernelize_report(kh.kernelize(model, device="tpu"))
    try:
        assert report.backend == "tpu" and len(report.replaced) == 2 and not report.kept
        for row in report.replaced:
            assert row.variant == "torch-tpu" and row.kind == "moe_experts"
            assert f"{namespace('ragged_dot')}::ragged_dot" in row.implementation
            assert row.max_error is None and row.tolerance is None
            assert row.not_validated.startswith("not validated: needs a TPU (the layers' weights are on cpu")
        text, data = str(report), json.loads(report.to_json())
        assert "2 layer(s) kernelized (2 not validated: needs a TPU), 0 kept" in text
        assert text.count("not validated: needs a TPU") >= 3  # the summary and each row
        assert all(r["not_validated"].startswith("not validated: needs a TPU") for r in data["replaced"])
        assert any(n.startswith("attention unchanged: needs a TPU") for n in report.notes)
        assert any(n.startswith("rms_norm unchanged: needs a TPU") for n in report.notes)  # its form is read off
        # the model still runs here: its CPU tensors take the CPU path, which says so
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            after = model(input_ids=tokens).logits
        assert relative_error(after.numpy(), before.double().numpy()) <= TOLERANCE["float32"]
        assert any("torch-tpu build got tensors on cpu" in str(w.message) for w in seen)
        FACTS["kernelize"] = {"table": text, "row": data["replaced"][0]}
    finally:
        kh.restore(model)
    with torch.no_grad():
        assert torch.equal(model(input_ids=tokens).logits, before)


def test_device_kind_falls_back_when_torch_tpu_names_no_chip(rd):
    ops = importlib.import_module(f"{rd.__name__}._vendor.torch_tpu_ops")
    assert torch.tpu.get_device_name() == "TPU"  # no chip on this host: no generation in the name
    assert ops.device_kind() == ops.FALLBACK_DEVICE_KIND and re.search(r"v\d", ops.FALLBACK_DEVICE_KIND)


# ---- rms-norm-tpu: its op, its schema, its backward op, and the compiler on what torch_tpu would run ----------------

RMS_OPTIONS = "float eps, bool zero_centered, bool scale_after_cast"


def test_rms_norm_registers_its_ops_and_they_compile_for_v5e_and_v6e():
    rn = kh.get_kernel("kernel-hub/rms-norm-tpu", framework="torch", backend="tpu")
    assert rn.__kernel_hub__.variant == "torch-tpu" and set(rn.tpu_ops()) == {"rms_norm"}
    ns = namespace("rms_norm")
    forward = getattr(torch.ops, ns).rms_norm.default
    backward = getattr(torch.ops, ns).rms_norm_backward.default
    assert str(forward._schema) == f"{ns}::rms_norm(Tensor x, Tensor weight, *, {RMS_OPTIONS}) -> Tensor"
    assert str(backward._schema) == (f"{ns}::rms_norm_backward(Tensor x, Tensor weight, Tensor grad_out, *, "
                                     f"{RMS_OPTIONS}) -> (Tensor, Tensor)")
    custom_ops = importlib.import_module("torch._library.custom_ops")
    assert custom_ops._maybe_get_opdef(f"{ns}::rms_norm")._backward_fn is not None
    assert f"{ns}::rms_norm" in rn.describe("tpu")
    options = dict(eps=1e-6, zero_centered=False, scale_after_cast=True)
    with FakeTensorMode():  # the fake kernel: shapes and dtypes of the contract
        y = rn.tpu_ops()["rms_norm"](torch.empty(64, 2112, dtype=BF16), torch.empty(2112, dtype=BF16), **options)
    assert y.shape == (64, 2112) and y.dtype == BF16
    cases = [("rms_norm fwd bf16 [64,2112]", rn.tpu_ops()["rms_norm"], (meta(64, 2112, dtype=BF16),
                                                                       meta(2112, dtype=BF16))),
             ("rms_norm bwd bf16 [4096,2880]", backward, (meta(4096, 2880, dtype=BF16), meta(2880, dtype=BF16),
                                                          meta(4096, 2880, dtype=BF16)))]
    for label, op, tensors in cases:
        jc = _callable(op)
        args, kwargs = jc._normalize_invocation_args(tensors, options)
        placeholders, statics = jc._get_jax_placeholders(args, kwargs)
        for generation in GENERATIONS:
            with tpu_target(generation) as device:
                chip = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,),
                                    abstract_device=AbstractDevice(device.device_kind, 1, "tpu"))
                with jax.sharding.use_abstract_mesh(chip):
                    exported = jc.exported(*placeholders, **statics)
                assert "tpu_custom_call" in exported.mlir_module(), f"{label}: no Mosaic kernel in the export"
                compiled = jax.jit(exported.call).lower(*on_device(placeholders, device)).compile()
            assert compiled.memory_analysis().output_size_in_bytes > 0
            FACTS.setdefault("rms_norm", []).append({"case": label, "generation": generation})
