"""The ragged dot's torch build exports transformers' experts function, `experts_forward(self, hidden_states,
top_k_index, top_k_weights)`: for every layout transformers' use_experts_implementation describes (has_gate,
is_concatenated, is_transposed, has_bias) in float32 and bfloat16, on both of its paths ("torch": moe_experts with the
module's own gate; "jax": the whole block as the one function the TorchTPU op registers), against a float64 NumPy
loop that shares nothing with it; expert-parallel sentinels are never computed; anything else is one
NotImplementedError naming it; and the tiny transformers families run it through kernelize's experts-function
convention within tolerance of their own implementation."""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest
import torch
from torch import nn
from transformers.integrations.moe import use_experts_implementation

import kernel_hub as kh
from tests.tiny_models import tiny_model

E, H, INTER, T, K = 4, 24, 16, 10, 2
#: Relative error against the float64 loop: float32 accumulates; bfloat16 rounds the up projection, the bias sums, the
#: gate and the weighted rows (as transformers' own implementations do): a few units of 2^-8 each.
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


RD_LOAD = {"local": True, "framework": "torch", "backend": "cpu"}  # conftest.py rd


def _np_act(name: str, v: np.ndarray) -> np.ndarray:
    if name == "silu":
        return v / (1.0 + np.exp(-v))
    if name == "gelu_tanh":
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    raise AssertionError(name)


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def numpy_block(m: nn.Module, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> np.ndarray:
    """out[t] = sum_j w[t,j] * expert_{ids[t,j]}(x[t]) in float64, token by token; ids >= E contribute nothing."""
    x, ids, w = _f64(hidden), index.numpy(), _f64(weights)
    up = _f64(m.gate_up_proj if m.has_gate else m.up_proj)
    down = _f64(m.down_proj)
    out = np.zeros_like(x)
    for t, j in itertools.product(range(x.shape[0]), range(ids.shape[1])):
        e = int(ids[t, j])
        if e >= up.shape[0]:
            continue
        h = x[t] @ (up[e] if m.is_transposed else up[e].T)
        if m.has_bias:
            h = h + _f64(m.gate_up_proj_bias if m.has_gate else m.up_proj_bias)[e]
        if m.has_gate:
            half = h.shape[0] // 2
            g, u = (h[:half], h[half:]) if m.is_concatenated else (h[0::2], h[1::2])
            a = _np_act(m.act_name, g) * u
        else:
            a = _np_act(m.act_name, h)
        y = a @ (down[e] if m.is_transposed else down[e].T)
        if m.has_bias:
            y = y + _f64(m.down_proj_bias)[e]
        out[t] += w[t, j] * y
    return out


def _interleaved_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
    return self.act_fn(gate_up[..., 0::2]) * gate_up[..., 1::2]


def experts_module(*, has_gate: bool, is_concatenated: bool, is_transposed: bool, has_bias: bool,
                   dtype: torch.dtype, act: str = "silu", seed: int = 0) -> nn.Module:
    """A transformers experts class in the given layout (use_experts_implementation), random weights; its own
    forward (the "eager" implementation) is the float64 NumPy loop."""

    class Experts(nn.Module):
        def __init__(self, config):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            up_out = 2 * INTER if has_gate else INTER
            rand = lambda *s: nn.Parameter(torch.randn(*s, generator=g) * 0.3)
            setattr(self, "gate_up_proj" if has_gate else "up_proj",
                    rand(E, H, up_out) if is_transposed else rand(E, up_out, H))
            self.down_proj = rand(E, INTER, H) if is_transposed else rand(E, H, INTER)
            if has_bias:
                setattr(self, "gate_up_proj_bias" if has_gate else "up_proj_bias", rand(E, up_out))
                self.down_proj_bias = rand(E, H)
            self.act_fn = nn.SiLU() if act == "silu" else nn.GELU(approximate="tanh")
            self.act_name = act
            self.num_experts = E

        def forward(self, hidden_states, top_k_index, top_k_weights):
            out = numpy_block(self, hidden_states, top_k_index, top_k_weights)
            return torch.from_numpy(out).to(hidden_states.dtype)

    if has_gate and not is_concatenated:
        Experts._apply_gate = _interleaved_gate
    cls = use_experts_implementation(Experts, is_concatenated=is_concatenated, is_transposed=is_transposed,
                                     has_bias=has_bias, has_gate=has_gate)
    return cls(types.SimpleNamespace(_experts_implementation="eager")).to(dtype)


def routing(seed: int, sentinels: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g)
    index = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K]
    weights = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
    if sentinels:  # expert parallelism: slots routed to another rank's experts carry id E
        index[1, 0] = E
        index[4, 1] = E
        index[7] = E  # a token with no local expert at all
    return hidden, index, weights


LAYOUTS = [dict(has_gate=True, is_concatenated=c, is_transposed=t, has_bias=b)
           for c, t, b in itertools.product((True, False), repeat=3)] + \
          [dict(has_gate=False, is_concatenated=True, is_transposed=t, has_bias=b)
           for t, b in itertools.product((True, False), repeat=2)]


#: The layouts the "jax" path is checked in too (each compiles the JAX CPU ragged dot once, ~2.5 s on 2 cores): Qwen's,
#: GPT-OSS's and an ungated one with biases.
QWEN = dict(has_gate=True, is_concatenated=True, is_transposed=False, has_bias=False)
GPT_OSS = dict(has_gate=True, is_concatenated=False, is_transposed=True, has_bias=True)
UNGATED = dict(has_gate=False, is_concatenated=True, is_transposed=False, has_bias=True)
JAX_LAYOUTS = (QWEN, GPT_OSS, UNGATED)


def _rel(out: torch.Tensor, ref: np.ndarray) -> float:
    got = _f64(out)
    assert np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(k for k, v in d.items() if v) or "ungated")
def test_experts_forward_matches_the_layers_own_forward_in_every_layout(rd, layout, dtype) -> None:
    m = experts_module(**layout, dtype=dtype, act="silu" if layout["has_gate"] else "gelu_tanh")
    hidden, index, weights = routing(seed=1)
    hidden, weights = hidden.to(dtype), weights.to(dtype)
    ref = numpy_block(m, hidden, index, weights)
    own = m(hidden, index, weights)  # the layer's own forward ("eager": the NumPy loop, in the layer's dtype)
    impls = ("torch", "jax") if layout in JAX_LAYOUTS else ("torch",)
    with torch.no_grad():
        for impl in impls:
            out = rd.experts_forward(m, hidden, index, weights, implementation=impl)
            assert out.dtype == dtype and out.shape == (T, H)
            assert _rel(out, ref) <= TOL[dtype], (impl, _rel(out, ref))
            assert _rel(out, _f64(own)) <= TOL[dtype]
            assert rd.hf_experts.DISPATCH.last_implementation()[0] == impl


@pytest.mark.parametrize("layout", JAX_LAYOUTS, ids=["qwen", "gpt-oss-like", "ungated"])
def test_expert_parallel_sentinels_are_never_computed(rd, layout) -> None:
    m = experts_module(**layout, dtype=torch.float32, act="silu" if layout["has_gate"] else "gelu_tanh")
    hidden, index, weights = routing(seed=2, sentinels=True)
    ref = numpy_block(m, hidden, index, weights)  # skips ids >= E
    with torch.no_grad():
        for impl in ("torch", "jax"):
            out = rd.experts_forward(m, hidden, index, weights, implementation=impl)
            assert _rel(out, ref) <= 1e-5, impl
            assert torch.equal(out[7], torch.zeros(H)), impl  # no expert here: exactly zero, biases included
    # and what the sentinel slots hold does not matter: their weights and ids are never read as an expert's
    poisoned = weights.clone()
    poisoned[index == E] = float("nan")
    with torch.no_grad():
        for impl in ("torch", "jax"):
            out = rd.experts_forward(m, hidden, index, poisoned, implementation=impl)
            assert _rel(out, ref) <= 1e-5, impl


def test_both_paths_have_the_same_gradients(rd) -> None:
    m = experts_module(**GPT_OSS, dtype=torch.float32)  # interleaved, transposed, biases
    hidden, index, weights = routing(seed=3, sentinels=True)
    grads = []
    for impl in ("torch", "jax"):
        h, w = hidden.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        m.zero_grad()
        rd.experts_forward(m, h, index, w, implementation=impl).square().sum().backward()
        grads.append([h.grad, w.grad] + [p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all() and (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_layouts_it_cannot_compute_raise_one_not_implemented_error_naming_it(rd) -> None:
    hidden, index, weights = routing(seed=4)

    def refused(m: nn.Module, words: str) -> None:
        with pytest.raises(NotImplementedError, match=words) as info:
            rd.experts_forward(m, hidden, index, weights)
        assert type(m).__name__ in str(info.value) and "experts_implementation" in str(info.value)

    post_norm = experts_module(**LAYOUTS[0], dtype=torch.float32)
    post_norm.has_post_expert_norm = True
    refused(post_norm, "has_post_expert_norm=True")

    class Plain(nn.Module):  # experts weights, but no transformers layout
        gate_up_proj = nn.Parameter(torch.zeros(E, 2 * INTER, H))
    refused(Plain(), "carries no use_experts_implementation layout \\(has_gate, is_concatenated")

    custom = experts_module(**LAYOUTS[0], dtype=torch.float32)
    custom._apply_gate = lambda gu: gu[..., :INTER] * gu[..., INTER:]  # bilinear, written for its own sizes
    refused(custom, "its gate .* matches none of the known forms")

    tanh = experts_module(**LAYOUTS[-1], dtype=torch.float32)
    tanh.act_fn = nn.Tanh()
    refused(tanh, "its activation Tanh is none of silu")

    fp8 = experts_module(**LAYOUTS[0], dtype=torch.float32)
    fp8.gate_up_proj = nn.Parameter(fp8.gate_up_proj.detach().to(torch.float8_e4m3fn), requires_grad=False)
    refused(fp8, "gate_up_proj is not a dense float32/bfloat16/float16")

    bad_bias = experts_module(**LAYOUTS[0], dtype=torch.float32)  # concatenated, transposed, bias
    bad_bias.down_proj_bias = nn.Parameter(torch.zeros(E, H + 1))
    refused(bad_bias, "has_bias is set but gate_up_proj_bias / down_proj_bias")


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "gemma4"])
def test_tiny_families_run_our_experts_function_through_kernelize(rd, family) -> None:
    """Only our experts_forward offered (nothing of kernel-hub's contract): kernelize checks it on each block against
    the block's own implementation and replaces every block; the logits stay within tolerance; restore is exact."""
    model = tiny_model(family)
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    only = types.SimpleNamespace(experts_forward=rd.experts_forward, __name__="ragged-dot experts_forward")
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": only, "attention": None, "rms_norm": None}))
    assert report.replaced and not report.kept, str(report)
    assert all(r.convention == "experts_forward" and r.max_error <= 1e-4 for r in report.replaced)
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-4
    assert rd.hf_experts.DISPATCH.last_implementation()[0] == "torch"
    kh.restore(model)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)


def test_the_torch_build_exports_it_in_transformers_convention_and_kernelize_prefers_our_contract(rd) -> None:
    from kernel_hub.layers.kinds.experts.contract import experts_function_problems
    from kernel_hub.layers.kinds.experts.plan import experts_convention

    assert "experts_forward" in rd.__all__ and experts_function_problems(rd.experts_forward) == []
    assert experts_convention(rd)[0] == "moe_experts"  # packing and quantized weights need kernel-hub's contract
    assert experts_function_problems(lambda self, hidden_states: None)[0].startswith(
        "experts_forward: cannot be called as fn(module, hidden_states, top_k_index, top_k_weights)")
