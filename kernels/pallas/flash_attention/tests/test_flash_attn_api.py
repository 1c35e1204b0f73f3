"""flash_attn_func / flash_attn_varlen_func (flash_attn_api.py), flash-attn's interface on the torch builds, against a
float64 softmax attention written here from flash-attn's own definition of its masks (bottom-right causal,
window_size=(left, right) inclusive, -1 unbounded): plain and packed (varlen) batches of unequal lengths, GQA/MQA,
sinks (s_aux), soft-cap, scale, bf16 and f32; packed rows no sequence owns come out 0; what the kernel cannot compute
is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def fa_torch():
    """The torch-cpu build as it ships (its __init__ is torch_api.py)."""
    import kernel_hub as kh

    return kh.get_local_kernel(Path(__file__).resolve().parents[1], framework="torch", backend="cpu")


def _visible(i: int, j: int, lq: int, lk: int, causal: bool, left: int, right: int) -> bool:
    """flash-attn's mask: query i of lq sits at key position i + lk - lq; window bounds are inclusive."""
    pos = i + lk - lq
    if causal:
        right = 0
    return (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right)


def _reference_one(q, k, v, *, causal, window, scale, softcap, sinks):
    """q [lq, Hq, D], k/v [lk, Hkv, D] -> [lq, Hq, D] float64."""
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    out = torch.zeros(lq, hq, d, dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)].double(), v[:, h // (hq // hkv)].double()
        for i in range(lq):
            keep = torch.tensor([_visible(i, j, lq, lk, causal, *window) for j in range(lk)], dtype=torch.bool)
            if not keep.any():
                continue  # nothing to attend: 0
            logits = (kh @ q[i, h].double()) * scale
            if softcap:
                logits = softcap * torch.tanh(logits / softcap)
            logits = logits.masked_fill(~keep, float("-inf"))
            if sinks is not None:
                logits = torch.cat([logits, sinks[h].double().reshape(1)])
            out[i, h] = torch.softmax(logits, 0)[:lk] @ vh
    return out


def _inputs(seed, shapes, dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in shapes]


FUNC_CASES = {  # name: (B, Sq, Skv, Hq, Hkv, D, dtype, options)
    "causal-gqa-f32": (2, 7, 7, 4, 2, 16, torch.float32, dict(causal=True)),
    "causal-window-sinks-bf16": (2, 9, 9, 4, 1, 16, torch.bfloat16, dict(causal=True, window_size=(3, 3), sinks=True)),
    "bottom-right-softcap-f32": (1, 3, 8, 2, 2, 8, torch.float32, dict(causal=True, softcap=4.0, softmax_scale=0.3)),
    "full-left-window-f32": (2, 6, 6, 2, 1, 8, torch.float32, dict(window_size=(2, -1))),
    "right-zero-is-causal-f32": (1, 5, 5, 2, 2, 8, torch.float32, dict(window_size=(-1, 0))),
}


@pytest.mark.parametrize("name", list(FUNC_CASES))
def test_flash_attn_func_matches_flash_attn_definition(fa_torch, name: str) -> None:
    b, sq, skv, hq, hkv, d, dtype, opts = FUNC_CASES[name]
    q, k, v = _inputs(len(name), [(b, sq, hq, d), (b, skv, hkv, d), (b, skv, hkv, d)], dtype)
    sinks = torch.randn(hq, generator=torch.Generator().manual_seed(7)) if opts.pop("sinks", False) else None
    out = fa_torch.flash_attn_func(q, k, v, s_aux=sinks, **opts)
    assert out.shape == q.shape and out.dtype == dtype
    scale = opts.get("softmax_scale") or d ** -0.5
    ref = torch.stack([_reference_one(q[i], k[i], v[i], causal=opts.get("causal", False),
                                      window=opts.get("window_size", (-1, -1)), scale=scale,
                                      softcap=opts.get("softcap"), sinks=sinks) for i in range(b)])
    assert rel_error(out.double().numpy(), ref.numpy()) <= TOL[str(dtype).removeprefix("torch.")], name


def test_flash_attn_varlen_func_keeps_sequences_apart(fa_torch) -> None:
    """Three packed sequences of lengths 5, 1, 8 (queries) over 5, 6, 8 keys (the second a cached decode step), two
    spare rows past cu_seqlens_q[-1]; causal with a window and sinks, MQA; each sequence against its own reference."""
    lq, lk, hq, hkv, d = [5, 1, 8], [5, 6, 8], 4, 1, 16
    cu_q = torch.tensor([0, 5, 6, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 11, 19], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = _inputs(3, [(16, hq, d), (19, hkv, d), (19, hkv, d)], dtype)
        sinks = torch.randn(hq, generator=torch.Generator().manual_seed(5)).to(dtype)
        out = fa_torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True,
                                              window_size=(3, 3), s_aux=sinks)
        assert out.shape == q.shape and out.dtype == dtype
        assert torch.equal(out[14:], torch.zeros_like(out[14:]))
        for b in range(3):
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            ref = _reference_one(q[qs], k[ks], v[ks], causal=True, window=(3, 3), scale=d ** -0.5, softcap=None,
                                 sinks=sinks.float())
            assert rel_error(out[qs].double().numpy(), ref.numpy()) <= TOL[str(dtype).removeprefix("torch.")], b


def test_flash_attn_varlen_func_is_differentiable(fa_torch) -> None:
    """Gradients flow through the packing to the packed q/k/v (training with padding-free batches)."""
    q, k, v = (t.requires_grad_() for t in _inputs(1, [(9, 2, 8), (9, 2, 8), (9, 2, 8)], torch.float64))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    fa_torch.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True).square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and bool(t.grad.isfinite().all()) and float(t.grad.abs().sum()) > 0


def test_flash_attn_interface_refuses_what_it_cannot_compute(fa_torch) -> None:
    q = torch.randn(1, 4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    packed = q[0]
    cases = {
        "dropout_p": lambda: fa_torch.flash_attn_func(q, q, q, dropout_p=0.1),
        "return_attn_probs": lambda: fa_torch.flash_attn_func(q, q, q, return_attn_probs=True),
        "alibi_slopes": lambda: fa_torch.flash_attn_varlen_func(packed, packed, packed, cu, cu, 4, 4,
                                                                alibi_slopes=torch.ones(2)),
        "right=1": lambda: fa_torch.flash_attn_func(q, q, q, window_size=(-1, 1)),
        "max_seqlen_q=2": lambda: fa_torch.flash_attn_varlen_func(packed, packed, packed, cu, cu, 2, 4),
        "offsets must start at 0": lambda: fa_torch.flash_attn_varlen_func(packed, packed, packed, cu + 1, cu, 4, 4),
        "s_aux of shape (3,)": lambda: fa_torch.flash_attn_func(q, q, q, s_aux=torch.zeros(3)),
    }
    for needle, call in cases.items():
        with pytest.raises(fa_torch.UnsupportedAttentionCall, match="flash-attention-tpu") as err:
            call()
        assert needle in str(err.value), (needle, str(err.value))


def test_flash_attn_signatures_carry_what_transformers_reads(fa_torch) -> None:
    """transformers 5.25 passes an option only when the function's signature names it (its
    _lazy_define_process_function): the sinks as `s_aux`, the window as `window_size`, `softcap`, `dropout_p`."""
    import inspect

    params = inspect.signature(fa_torch.flash_attn_varlen_func).parameters
    assert {"s_aux", "window_size", "softcap", "dropout_p", "max_seqlen_q", "max_seqlen_k", "cu_seqlens_q",
            "cu_seqlens_k", "softmax_scale", "causal"} <= set(params)
    assert {"s_aux", "window_size", "softcap", "softmax_scale", "causal"} <= set(
        inspect.signature(fa_torch.flash_attn_func).parameters)
