"""torch.compile(fullgraph=True) on kernelized tiny models: forward (plain and left-padded) and a short greedy generate.

The expert kernels run as torch custom ops with fake implementations under compile (ragged_dot/torch_cpu/grouped.py) and
the attention's mask check picks the kernel or the previous implementation in the graph (layers/attention.py
traced_plan), so dynamo traces the
whole model without a graph break. The reference is always the uncompiled, unkernelized copy with the same weights.

The graphs are compiled with the "aot_eager" backend: dynamo's full-graph trace and AOT autograd's fake-tensor pass
are what the kernels must survive (a data-dependent branch or a missing fake implementation fails there), while
inductor's C++ code generation costs minutes on a shared 2-core machine. One inductor case covers the lowering
(the custom ops keep oneDNN's mkldnn._linear_pointwise out of inductor's sight).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.experts import transformers as ex  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

TOL = 1e-4
#: compiling costs 10-40 s a case here (inductor ~3 min) on the shared 2 cores
pytestmark = pytest.mark.slow


def _model(family):
    m = tiny.tiny_model(family, num_hidden_layers=1 if family == "qwen3_moe" else 2)
    ref = copy.deepcopy(m)
    report = kh.kernelize_report(kh.kernelize(m))
    assert {r.kind for r in report.replaced} == {ex.LAYER_KIND, at.LAYER_KIND, "rms_norm"}, str(report)
    return m, ref


def _batch():
    g = torch.Generator().manual_seed(5)
    x = torch.randint(3, 128, (2, 7), generator=g)
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding in row 1: the mask's values reach the kernel's check
    return x, mask


def _compiled(model, backend="aot_eager"):
    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend=backend)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_compiled_forward_equals_unkernelized(family):
    m, ref = _model(family)
    x, mask = _batch()
    c = _compiled(m)
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            got = c(input_ids=x, use_cache=False, **kwargs).logits
            want = ref(input_ids=x, use_cache=False, **kwargs).logits
            keep = mask.bool() if kwargs else torch.ones_like(mask, dtype=torch.bool)
            assert torch.isfinite(got).all()
            assert (got[keep] - want[keep]).abs().max().item() <= TOL, kwargs


def test_compiled_mask_the_kernel_cannot_express_runs_the_previous_implementation():
    m, ref = _model("qwen3_moe")
    x, mask = _batch()
    mask[0, 2] = 0  # a hole in row 0: not one contiguous run, so the check picks the previous implementation
    c = _compiled(m)
    with torch.no_grad():
        got = c(input_ids=x, attention_mask=mask, use_cache=False).logits
        want = ref(input_ids=x, attention_mask=mask, use_cache=False).logits
    keep = mask.bool()
    assert (got[keep] - want[keep]).abs().max().item() <= TOL


def test_compiled_call_leaves_the_context_variables_as_it_found_them():
    """transformers' output capture (and kernels' use_kernelized_func) set a context variable before each forward
    and reset it after; under compile they fall back to a plain global. A torch.cond between the two made dynamo
    (torch 2.13) drop the reset: the next eager forward then collected no hidden states and every compiled call
    recompiled. After a compiled, left-padded call (the mask check in the graph) both are back to rest, an eager
    call returns every layer's hidden states equal to the unkernelized model's, and a second call reuses the graph."""
    from transformers.utils.output_capturing import _active_collector

    m, ref = _model("qwen3_moe")
    x, mask = _batch()
    c = _compiled(m)
    with torch.no_grad():
        c(input_ids=x, attention_mask=mask, use_cache=False)
        assert _active_collector.global_var is None and not _active_collector.compiling
        try:
            from kernels._internals.layer.layer import _ACTIVE_KERNEL_FUNCS
        except ImportError:  # a kernels without use_kernelized_func has no such variable
            _ACTIVE_KERNEL_FUNCS = None
        if _ACTIVE_KERNEL_FUNCS is not None:
            assert _ACTIVE_KERNEL_FUNCS.global_var is None and not _ACTIVE_KERNEL_FUNCS.uses_global_var
        got = m(input_ids=x, attention_mask=mask, use_cache=False, output_hidden_states=True).hidden_states
        want = ref(input_ids=x, attention_mask=mask, use_cache=False, output_hidden_states=True).hidden_states
        assert got is not None and len(got) == len(want) == m.config.num_hidden_layers + 1
        keep = mask.bool()
        for a, b in zip(got, want, strict=True):
            assert (a[keep] - b[keep]).abs().max().item() <= TOL
        with torch.compiler.set_stance("fail_on_recompile"):
            again = c(input_ids=x, attention_mask=mask, use_cache=False).logits
    assert torch.isfinite(again[keep]).all()


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_compiled_generate_equals_unkernelized(family):
    m, ref = _model(family)
    x, mask = _batch()
    m.forward = torch.compile(m.forward, fullgraph=True, backend="aot_eager")  # what generate calls per step
    torch._dynamo.reset()
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, pad_token_id=0,
                  cache_implementation="static")  # a fixed-shape cache, as transformers' own compiled generate uses
    got, want = m.generate(x, **kwargs), ref.generate(x, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert (a - b).abs().max().item() <= TOL


def test_inductor_forward_lowers_the_kernels():
    m, ref = _model("qwen3_moe")
    x, _ = _batch()
    c = _compiled(m, backend="inductor")
    with torch.no_grad():
        got, want = c(input_ids=x[:1, :4], use_cache=False).logits, ref(input_ids=x[:1, :4], use_cache=False).logits
    assert (got - want).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_eager_static_cache_generate_equals_unkernelized(family):
    """A static cache's keys past the filled length are masked: a decode query's own key is not the cache's last
    slot, so real query rows are the ones attending any key (they were read off the last slot and came out 0)."""
    m, ref = _model(family)
    x, mask = _batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True,
                  return_dict_in_generate=True, cache_implementation="static")
    got, want = m.generate(x, **kwargs), ref.generate(x, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert (a - b).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_compiled_frozen_model_runs_its_packed_experts(family):
    """A frozen model (requires_grad off, kernelize's default inference mode) gets its expert weights packed; the
    packed call is one custom op in the compiled graph (layers/packed_op.py), which runs the block's packed path."""
    from kernel_hub.layers.kinds.experts import packed_op, packing

    m = tiny.tiny_model(family, num_hidden_layers=1 if family == "qwen3_moe" else 2).requires_grad_(False)
    ref = copy.deepcopy(m)
    kh.kernelize(m)
    blocks = [mod for mod in m.modules() if packing.record_of(mod) is not None]
    assert blocks and all(packing.record_of(b).holders is not None for b in blocks), "expected packed expert blocks"
    x, mask = _batch()
    c = _compiled(m)
    with torch.no_grad():
        got = c(input_ids=x, attention_mask=mask, use_cache=False).logits
        want = ref(input_ids=x, attention_mask=mask, use_cache=False).logits
    keep = mask.bool()
    assert torch.isfinite(got).all()
    assert (got[keep] - want[keep]).abs().max().item() <= TOL
    assert all(packing.record_of(b).holders is not None for b in blocks), "the compiled call unpacked a block"
    handle = packing.record_of(blocks[0]).compile_handle
    kh.restore(m)  # the compiled graph's guards see the restored blocks: it recompiles, it never calls a stale op
    with torch.no_grad():
        again = c(input_ids=x, attention_mask=mask, use_cache=False).logits
    assert (again[keep] - want[keep]).abs().max().item() <= TOL
    del m, c, blocks
    torch._dynamo.reset()
    import gc

    gc.collect()
    with pytest.raises(RuntimeError, match="compile the model again"):  # a freed block is not kept alive by a handle
        packed_op.block(handle)


def test_inductor_generate_with_a_padded_value_head_and_a_mask_check():
    """DeepSeek-V3 (value head zero-padded to the query/key head, a left-padded batch: the attention's torch.cond on
    the mask check is in the graph) generates under inductor as it does uncompiled. Inductor compiled cond's branches
    for row-major q/k/v and once laid the operands out transposed (a size/stride assert at the first decode step)."""
    m, ref = _model("deepseek_v3")
    x, mask = _batch()
    m.forward = torch.compile(m.forward, fullgraph=True)  # inductor
    torch._dynamo.reset()
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, pad_token_id=0, cache_implementation="static")
    got, want = m.generate(x, **kwargs), ref.generate(x, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert (a - b).abs().max().item() <= TOL
