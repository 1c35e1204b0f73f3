"""Padding-free batches on a kernelized model: sequences packed one after another in a row, with `position_ids` that
restart at 0, get the same logits, bit for bit, as the same sequences padded in a batch (transformers' own
`test_*_padding_matches_padding_free_with_position_ids` asks this within bf16's epsilon), and both run on the kernel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.attention import kernel_call as at_call  # noqa: E402
from kernel_hub.layers.kinds.attention.call_plan import plan_call  # noqa: E402
from kernel_hub.layers.kinds.attention.segments import find_segments, gather, scatter  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

REPO = "kernel-hub/flash-attention-tpu"


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel(REPO, framework="torch", backend="cpu")


def block_causal(lengths: list[int], total: int, window: int | None = None) -> torch.Tensor:
    """Independent reference: the [total, total] mask of sequences of `lengths` packed from position 0, the rest
    padding (attending nothing)."""
    m = torch.zeros(total, total, dtype=torch.bool)
    at_ = 0
    for n in lengths:
        for i in range(n):
            for j in range(n):
                if j <= i and (window is None or j > i - window):
                    m[at_ + i, at_ + j] = True
        at_ += n
    return m


def test_segments_found_and_checked():
    m = torch.stack([block_causal([3, 1, 4], 10), block_causal([10], 10)])
    seg, real, why = find_segments(m, causal=True, window=None)
    assert why == "" and seg is not None
    assert seg.batch.tolist() == [0, 0, 0, 1] and seg.start.tolist() == [0, 3, 4, 0]
    assert seg.length.tolist() == [3, 1, 4, 10] and seg.width == 10
    assert real[0].tolist() == [True] * 8 + [False] * 2
    windowed = block_causal([5, 5], 10, window=2)[None]
    seg, _, why = find_segments(windowed, causal=True, window=2)
    assert why == "" and seg.length.tolist() == [5, 5]
    assert find_segments(windowed, causal=True, window=3)[2].startswith("mask is not causal")
    leak = block_causal([4, 4], 8)
    leak[5, 2] = True  # a token of the second sequence sees one of the first
    assert find_segments(leak[None], causal=True, window=None)[0] is None
    blind = block_causal([4, 4], 8)
    blind[6, 6] = False  # a real row that does not see its own token
    assert "own token" in find_segments(blind[None], causal=True, window=None)[2]
    assert find_segments(torch.ones(1, 2, 4, dtype=torch.bool), causal=False, window=None)[0] is None
    one = block_causal([6], 8)[None]  # one sequence a row: not packed, the padded reading's reason stands
    assert find_segments(one, causal=True, window=None)[::2] == (None, "")
    holes = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    holes[:, 2] = False  # a hole in the middle of one sequence: neither reading fits, and the reason says which
    plan, why = plan_call(holes[None, None], 6, 6, causal=True, window=None)
    assert plan is None and why == "a query row that does not attend its own token"
    plan, why = plan_call(one[:, None], 8, 8, causal=True, window=2)
    assert plan is None and why.startswith("mask is not causal/sliding-window over padded sequences")
    uneven = block_causal([40] + [1] * 200, 240)[None]  # 201 rows of 40 slots for 240 tokens: refused
    seg, _, why = find_segments(uneven, causal=True, window=None)
    assert seg is None and "201 packed sequences up to 40 long" in why


def test_plan_call_runs_packed_masks_per_sequence():
    m = block_causal([2, 3], 6)
    plan, why = plan_call(m[None, None], 6, 6, causal=True, window=None)
    assert why == "" and plan.segments is not None
    assert plan.q_lengths.tolist() == [2, 3] and plan.kv_lengths.tolist() == [2, 3]
    x = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(1, 2, 6, 3)
    g = gather(x, plan.segments)
    assert g.shape == (2, 2, 3, 3)
    assert torch.equal(g[0, :, :2], x[0, :, :2]) and torch.equal(g[1], x[0, :, 2:5])
    back = scatter(g, plan.segments, (1, 2, 6, 3))
    assert torch.equal(back[0, :, :5], x[0, :, :5]) and not back[0, :, 5].any()  # padding row 5 comes out 0


def padded_and_packed(seed: int, batch: int = 5, width: int = 9):
    """A left-padded batch (one row full width) and the same sequences packed in one row."""
    g = torch.Generator().manual_seed(seed)
    lengths = [width] + torch.randint(1, width + 1, (batch - 1,), generator=g).tolist()
    ids = torch.randint(3, 120, (batch, width), generator=g)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, width - n:] = 1
    ids[mask == 0] = 0
    pos = (mask.cumsum(1) - 1) * mask
    packed_ids = ids[mask.bool()][None]
    packed_pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return (ids, mask, pos), (packed_ids, packed_pos)


def logits_both(model, seed):
    (ids, mask, pos), (packed_ids, packed_pos) = padded_and_packed(seed)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[mask.bool()]
        packed = model(input_ids=packed_ids, position_ids=packed_pos, use_cache=False).logits[0]
    return padded.float(), packed.float()


def eager_attention(q, k, v, mask):
    """Independent reference in float64: q/k/v [B, H, S, D], bool mask [B, S, S]; rows attending nothing are 0."""
    logits = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(logits, -1))
    return probs @ v.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("window", [None, 3], ids=["causal", "window3"])
def test_attention_layer_same_bits_padded_or_packed(fa, dtype, window):
    """The kernel path of one attention call: each sequence's output rows are identical whether its tokens came
    left-padded in a batch or packed in one row, and both match the float64 reference."""
    g = torch.Generator().manual_seed(7)
    lengths, width, heads, dim = [11, 1, 6, 11, 3], 11, 2, 16
    seqs = [torch.randn(3, heads, n, dim, generator=g).to(dtype) for n in lengths]
    padded = torch.zeros(3, len(lengths), heads, width, dim, dtype=dtype)
    pmask = torch.zeros(len(lengths), width, width, dtype=torch.bool)
    for b, (x, n) in enumerate(zip(seqs, lengths, strict=True)):
        padded[:, b, :, width - n:] = x
        pmask[b, width - n:, width - n:] = block_causal([n], n, window)
    packed = torch.cat(seqs, dim=2)[:, None]  # [3, 1, H, T, D]
    total = sum(lengths)
    kmask = block_causal(lengths, total, window)[None]
    module = torch.nn.Module()
    module.is_causal = True
    kwargs = {"sliding_window": window}
    out_p, plan_p, why_p = at_call.kernel_call(module, fa.flash_attention, *padded, pmask[:, None], kwargs)
    out_k, plan_k, why_k = at_call.kernel_call(module, fa.flash_attention, *packed, kmask[:, None], kwargs)
    assert why_p == why_k == "" and plan_k.segments is not None and plan_p.segments is None
    real = torch.zeros(len(lengths), width, dtype=torch.bool)
    for b, n in enumerate(lengths):
        real[b, width - n:] = True
    rows_p, rows_k = out_p[real], out_k[0]  # [T, H, D] each, the same tokens in the same order
    assert torch.isfinite(rows_k.float()).all()
    assert torch.equal(rows_p, rows_k)
    ref = eager_attention(*packed[:, 0], kmask)[0].transpose(0, 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((rows_k.double() - ref).abs().max() / ref.abs().max()).item() <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_padding_free_logits_match_padded(family, dtype, fa, no_rms_norm):
    """transformers' padding-free check on a kernelized model, every call on the kernel: padded and packed logits
    within bfloat16's epsilon (transformers' tolerance), and each within the unkernelized model's."""
    # bf16 MoE: every expert picked, so a last-bit router tie cannot flip a choice between the two implementations
    extra = {"num_experts_per_tok": 8} if family == "mixtral" and dtype == torch.bfloat16 else {}
    model = tiny.llama(dtype) if family == "llama" else tiny.tiny_model(family, dtype=dtype, **extra)
    model.config._attn_implementation = "eager"
    reference = [logits_both(model, seed) for seed in range(3)]
    kh.kernelize(model, mapping={"attention": fa, "moe_experts": None})
    hooks = [m.__dict__[at.HOOK_ATTR] for m in model.modules() if at.HOOK_ATTR in m.__dict__]
    assert hooks and all(h.flash is not None for h in hooks)
    served = sum(h.calls for h in hooks)
    eps = torch.finfo(torch.bfloat16).eps
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for seed, (ref_padded, ref_packed) in enumerate(reference):
        padded, packed = logits_both(model, seed)
        assert torch.isfinite(packed).all()
        torch.testing.assert_close(padded, packed, rtol=eps, atol=eps)
        scale = ref_packed.abs().max()
        assert ((packed - ref_packed).abs().max() / scale).item() <= tol
        assert ((padded - ref_padded).abs().max() / scale).item() <= tol
    assert sum(h.calls for h in hooks) == served + 2 * len(hooks) * len(reference)  # every call on the kernel
    assert all(h.fallbacks == 0 for h in hooks)
