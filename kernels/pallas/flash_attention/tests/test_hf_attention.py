"""attention_forward (hf_attention.py), transformers' attention-function hook, against a float64 masked softmax written
out here in absolute positions: no mask, right padding in a prefill, left padding in a prefill and in a cached step,
with GQA, sinks, a sliding window and a soft-cap, bf16 and f32; padding query rows come out 0; calls it cannot
express raise UnsupportedAttentionCall and compute nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def fa_torch():
    """The torch-cpu build as it ships (its __init__ is torch_api.py, which attention_forward resolves through)."""
    import kernel_hub as kh

    return kh.get_local_kernel(Path(__file__).resolve().parents[1], framework="torch", backend="cpu")


class Layer(torch.nn.Module):
    is_causal = True


def _reference(q, k, v, mask, *, scale, window, softcap, sinks):
    """[B, Sq, H, D] float64: query i sits at absolute position Skv - Sq + i, attends real keys j <= it (and inside the
    window); GQA by head groups; sinks add exp(sink) to the denominator."""
    b, hq, sq, _ = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, hq, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kh, vh = k[bi, h // (hq // hkv)].double(), v[bi, h // (hq // hkv)].double()
            for i in range(sq):
                pos = skv - sq + i
                keep = torch.tensor([(mask is None or bool(mask[bi, j])) and j <= pos
                                     and (window is None or j > pos - window) for j in range(skv)])
                logits = (kh @ q[bi, h, i].double()) * scale
                if softcap is not None:
                    logits = softcap * torch.tanh(logits / softcap)
                logits = logits.masked_fill(~keep, float("-inf"))
                if sinks is not None:
                    logits = torch.cat([logits, sinks[h].double().reshape(1)])
                p = torch.softmax(logits, 0)[:skv]
                out[bi, i, h] = p @ vh
    return out


CASES = {  # name: (batch, Sq, Skv, padding, dtype, features)
    "no-mask-f32": (2, 9, 9, None, torch.float32, dict(window=4)),
    "right-prefill-bf16": (3, 11, 11, "right", torch.bfloat16, dict(sinks=True)),
    "left-prefill-f32": (3, 10, 10, "left", torch.float32, dict(window=3, softcap=5.0, sinks=True)),
    "left-cached-bf16": (2, 1, 12, "left", torch.bfloat16, dict(window=5)),
    "left-cached-3-f32": (2, 3, 12, "left", torch.float32, dict()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_forward_matches_masked_softmax(name, fa_torch):
    b, sq, skv, padding, dtype, feats = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    hq, hkv, d = 4, 2, 16
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    k, v = (torch.randn(b, hkv, skv, d, generator=g).to(dtype) for _ in range(2))
    sinks = torch.randn(hq, generator=g) if feats.get("sinks") else None
    mask = None
    if padding is not None:
        real = torch.tensor([skv, skv - 4, skv - 1][:b])  # a full row, one padded by 4, one by 1
        idx = torch.arange(skv)[None]
        mask = idx < real[:, None] if padding == "right" else idx >= (skv - real)[:, None]
    out, weights = fa_torch.attention_forward(Layer(), q, k, v, mask, scaling=0.3, sliding_window=feats.get("window"),
                                              softcap=feats.get("softcap"), s_aux=sinks)
    assert weights is None and out.shape == (b, sq, hq, d) and out.dtype == dtype
    ref = _reference(q, k, v, mask, scale=0.3, window=feats.get("window"), softcap=feats.get("softcap"), sinks=sinks)
    rows = torch.ones(b, sq, dtype=torch.bool) if mask is None or sq != skv else mask  # real query rows
    assert not out.isnan().any()
    assert rel_error(out[rows], ref[rows]) <= TOL[str(dtype).removeprefix("torch.")]
    assert fa_torch.last_implementation()[0] == "torch"
    assert bool((out[~rows] == 0).all())  # padding query rows


def test_calls_it_cannot_express_are_refused(fa_torch):
    q = torch.randn(2, 4, 6, 8)
    holes = torch.ones(2, 6, dtype=torch.bool)
    holes[0, 2] = False
    right = torch.ones(2, 6, dtype=torch.bool)
    right[1, 4:] = False
    empty = torch.ones(2, 6, dtype=torch.bool)
    empty[1] = False
    cases = {
        "not one contiguous run": (q, q, q, holes, {}),
        "attention dropout": (q, q, q, None, {"dropout": 0.1}),
        "right padding in a cached step": (q[:, :, :1], q, q, right, {}),
        "head sizes": (q, q, q[..., :4], None, {}),
        "expected FlashAttention-2's": (q, q, q, torch.ones(2, 1, 6, 6, dtype=torch.bool), {}),
        "contiguous run per sequence": (q, q, q, empty, {}),
        "padding in a cached step": (q[:, :, :5], q, q, right.flip(-1), {}),
    }
    for what, (qq, kk, vv, mask, kw) in cases.items():
        with pytest.raises(fa_torch.UnsupportedAttentionCall, match=what):
            fa_torch.attention_forward(Layer(), qq, kk, vv, mask, **kw)
