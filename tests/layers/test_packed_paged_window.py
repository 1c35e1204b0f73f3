"""The packed attention path's paged call (transformers' decode fast path: block_table, k_cache, v_cache) on a
sliding-window layer: the window reaches the kernel's flash_attn_with_kvcache, and the output matches a float64
softmax over each sequence's last `window` keys, bf16 and f32, on fresh random pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.verify.numerics import TOLERANCE, relative_error

torch = pytest.importorskip("torch")

from kernel_hub.layers.kinds.attention.packed import PackedKernel, kernel_packed  # noqa: E402

FA = Path(__file__).resolve().parents[2] / "kernels" / "pallas" / "flash_attention"


def _reference(q, hist_k, hist_v, window, scale):
    """q [Hq, D] at the last of L positions over hist [L, Hkv, D], keys within the window -> [Hq, D] (float64)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, hist_k, hist_v))
    hq, hkv, length = q.shape[0], k.shape[1], k.shape[0]
    keep = np.arange(length) > length - 1 - window
    out = np.zeros_like(q)
    for h in range(hq):
        logits = np.where(keep, k[:, h // (hq // hkv)] @ q[h] * scale, -np.inf)
        w = np.exp(logits - logits.max())
        out[h] = (w / w.sum()) @ v[:, h // (hq // hkv)]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_paged_decode_call_applies_the_sliding_window(dtype):
    kernel = PackedKernel.of(kh.get_local_kernel(FA, framework="torch", backend="cpu"))
    g = torch.Generator().manual_seed(int(dtype == torch.bfloat16))
    lengths, hq, hkv, d, page, window = [9, 3, 14], 4, 2, 16, 4, 5
    per_seq = 4
    table = torch.randperm(len(lengths) * per_seq + 2, generator=g)[: len(lengths) * per_seq].reshape(-1, per_seq)
    k_cache = torch.randn(len(lengths) * per_seq + 2, page, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=g).to(dtype)
    hist = [(torch.randn(n, hkv, d, generator=g).to(dtype), torch.randn(n, hkv, d, generator=g).to(dtype))
            for n in lengths]
    for s, (hk, hv) in enumerate(hist):
        for p in range(lengths[s] - 1):
            k_cache[table[s, p // page], p % page] = hk[p]
            v_cache[table[s, p // page], p % page] = hv[p]
    q = torch.randn(1, hq, len(lengths), d, generator=g).to(dtype)
    key = torch.stack([hk[-1] for hk, _ in hist], 1)[None]  # [1, Hkv, N, D]: the new rows
    value = torch.stack([hv[-1] for _, hv in hist], 1)[None]
    kwargs = {"cu_seq_lens_q": torch.arange(len(lengths) + 1, dtype=torch.int32),
              "cu_seq_lens_k": torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32), "block_table": table,
              "k_cache": k_cache, "v_cache": v_cache, "sliding_window": window, "scaling": 0.3}
    module = torch.nn.Module()
    out = kernel_packed(kernel, module, q, key, value, kwargs)  # [1, N, Hq, D]
    want = np.stack([_reference(q[0, :, s].float(), hk.float(), hv.float(), window, 0.3)
                     for s, (hk, hv) in enumerate(hist)])
    tol = TOLERANCE[str(dtype).removeprefix("torch.")]
    assert out.shape == (1, len(lengths), hq, d) and not out.isnan().any()
    assert relative_error(out[0].float(), torch.from_numpy(want).float()) <= tol
    unwindowed = kernel_packed(kernel, module, q, key, value, {**kwargs, "sliding_window": None})
    assert relative_error(unwindowed[0].float(), torch.from_numpy(want).float()) > 10 * tol  # the window mattered
