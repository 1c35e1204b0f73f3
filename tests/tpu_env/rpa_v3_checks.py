"""Ours (flash-attention-tpu's ragged_paged_attention_v3) and vLLM TPU's RPA v3 (tpu-inference 0.32.0) on the same
inputs, in the TPU environment (.venv-tpu, where tpu-inference is installed). Not collected by the main suite:
tests/tpu/test_rpa_v3_tpu.py runs `python rpa_v3_checks.py OUT.json` and reads OUT.

RPA v3's Pallas kernel is tried interpreted both ways; on jax 0.10.2 (it pins 0.11.2) neither runs it (the fast
interpreter refuses its dynamically sized slices, the TPU simulator its reshaped refs), and the reason is recorded.
Its own pure-JAX definition, `ref_ragged_paged_attention` (same module, same arguments, cache update included), is
what ours is compared with then; ours runs as the interpreted Pallas kernel and as the CPU path.

Inputs: a mixed batch (decode steps and prefill chunks, pages shuffled, one sequence longer than the window) with
GQA, in f32 and bf16; the fused cache is built with RPA v3's own `merge_kv`. Written: per case the largest relative
difference of the outputs and of the updated caches (ours vs RPA v3), and of each against the float64 reference.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernel_hub as kh
from kernel_hub.verify.numerics import relative_error
from tpu_cost_model.tpu_inference_peers import as_chip, import_kernel

ROOT = Path(__file__).resolve().parents[2]
SEQS = ((1, 40), (12, 12), (1, 70), (5, 33), (1, 1))  # (new tokens, length including them)
HQ, HKV, D, PAGE, PAGES_PER_SEQ = 8, 2, 128, 16, 5
FEATURES = {"sliding_window": 32, "soft_cap": 20.0}


def inputs(rpa, dtype: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    s = len(SEQS)
    tokens = sum(q for q, _ in SEQS) + 3  # three padding rows
    pages = s * PAGES_PER_SEQ + 2
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    k_cache, v_cache = normal(pages * PAGE, HKV, D), normal(pages * PAGE, HKV, D)
    kv_cache = rpa.merge_kv(k_cache, v_cache)
    kv_cache = kv_cache.reshape(pages, PAGE, *kv_cache.shape[1:])
    q_lens = np.array([q for q, _ in SEQS], np.int32)
    return {
        "queries": normal(tokens, HQ, D), "keys": normal(tokens, HKV, D), "values": normal(tokens, HKV, D),
        "kv_cache": kv_cache,
        "kv_lens": jnp.asarray([k for _, k in SEQS], jnp.int32),
        "page_indices": jnp.asarray(rng.permutation(pages)[: s * PAGES_PER_SEQ], jnp.int32),
        "cu_q_lens": jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32),
        "distribution": jnp.asarray([0, 0, s], jnp.int32),
    }


@contextlib.contextmanager
def fast_interpreter():
    """Every pallas_call made inside runs in Pallas' fast interpreter: RPA v3 takes no `interpret` argument, and jax
    0.10.2's TPU simulator (force_tpu_interpret_mode) cannot follow its reshaped refs."""
    real = pl.pallas_call
    pl.pallas_call = lambda *a, **kw: real(*a, **{**kw, "interpret": True})
    try:
        yield
    finally:
        pl.pallas_call = real


ORDER = ("queries", "keys", "values", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "distribution")


def float64_reference(fa, x: dict) -> tuple[np.ndarray, np.ndarray]:
    """(out, fused cache) from our float64 reference, the fused layout unpacked and packed in NumPy."""
    fused = np.asarray(x["kv_cache"], np.float64)
    pages = fused.shape[0]
    merged = fused.reshape(pages, PAGE, -1, fused.shape[-1])
    k, v = merged[:, :, 0:2 * HKV:2, :D], merged[:, :, 1:2 * HKV:2, :D]
    table = np.asarray(x["page_indices"]).reshape(len(SEQS), PAGES_PER_SEQ)
    out, k, v = fa.reference_ragged_paged_attention(
        x["queries"], x["keys"], x["values"], k, v, x["kv_lens"], table, x["cu_q_lens"], len(SEQS),
        sm_scale=1 / np.sqrt(D), **FEATURES)
    merged = merged.copy()
    merged[:, :, 0:2 * HKV:2, :D], merged[:, :, 1:2 * HKV:2, :D] = k, v
    return out, merged.reshape(fused.shape)


def main(out_path: str) -> None:
    # CPU compiles without XLA's backend optimisation, as the suite's own processes compile (conftest.py): nothing
    # here compiles for a TPU, and the differences written are the same either way
    jax.config.update("jax_disable_most_optimizations", True)
    fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention")
    rpa = import_kernel("rpa_v3")
    facts: dict = {"jax": jax.__version__, "cases": {}}
    for dtype in ("float32", "bfloat16"):
        fresh = lambda dt=dtype: [inputs(rpa, dt, seed=3)[k] for k in ORDER]  # RPA v3 donates its inputs
        x = inputs(rpa, dtype, seed=3)
        kw = dict(sm_scale=1 / np.sqrt(D), **FEATURES)
        row: dict = {"rpa_v3_kernel_interpreted": {}}
        for mode, ctx in (("fast", fast_interpreter), ("tpu_simulator", pltpu.force_tpu_interpret_mode)):
            try:
                with ctx(), as_chip(rpa, "v6e"):
                    call = rpa.ragged_paged_attention(*fresh(), vmem_limit_bytes=32 << 20, **kw)
                    theirs = jax.block_until_ready(call)
                row["rpa_v3_kernel_interpreted"][mode] = "ran"
                row["compared_with"] = f"RPA v3 kernel ({mode} interpreter)"
                break
            except Exception as exc:  # the interpreter's refusal is the fact recorded
                text = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
                line = next((ln for ln in reversed(text) if "Error" in ln), text[0] if text else "")
                row["rpa_v3_kernel_interpreted"][mode] = f"{type(exc).__name__}: {line.strip()}"[:200]
        else:
            theirs = rpa.ref_ragged_paged_attention(*fresh(), **kw)
            row["compared_with"] = "RPA v3 ref_ragged_paged_attention"
        ref = float64_reference(fa, x)
        rows = int(x["cu_q_lens"][-1])  # RPA v3's reference returns the valid rows only (ours: padding rows are 0)
        theirs = (theirs[0][:rows], theirs[1])
        row["padding_rows_zero"] = {}
        row["rpa_v3_vs_f64"] = [relative_error(t, r) for t, r in zip(theirs, (ref[0][:rows], ref[1]), strict=True)]
        for impl in ("pallas", "cpu"):
            ours = fa.ragged_paged_attention_v3(*fresh(), implementation=impl, **kw)
            row["padding_rows_zero"][impl] = bool((np.asarray(ours[0][rows:], np.float32) == 0).all())
            ours = (ours[0][:rows], ours[1])
            row[f"{impl}_vs_rpa_v3"] = [relative_error(o, t) for o, t in zip(ours, theirs, strict=True)]
            row[f"{impl}_vs_f64"] = [relative_error(o, r) for o, r in zip(ours, (ref[0][:rows], ref[1]), strict=True)]
            row[f"{impl}_trace"] = fa.last_implementation()[1]
        facts["cases"][dtype] = row
    Path(out_path).write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
