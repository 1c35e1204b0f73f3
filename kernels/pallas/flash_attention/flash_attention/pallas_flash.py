"""Pallas TPU flash attention for prefill: forward, and backward as two kernels under one custom_vjp.

Forward, grid (B, Hq / heads_per_block, q blocks, kv blocks): an online softmax over key blocks with running
max m and sum l in VMEM scratch; grouped-query heads read their kv head through the index map, so K/V are never
repeated. One step takes `heads_per_block` query heads of one kv group against one K/V block: at small head
dims a single head's [bq, bk] block is far less work than the ~0.35 us a grid step costs, and the heads share
the K/V block. Per-sequence lengths, the causal band and the sliding window give each query block a range
of key blocks [first, last]; the index map clamps the key block into that range, so steps outside it
re-address the block already resident and Pallas issues no DMA for them, and the body is skipped.
Inside a step the block is worked in chunk_q x chunk_kv tiles: each query chunk loops over only the key chunks
its band reaches (block-sparse causal skipping below the grid's granularity). Big blocks (the whole key sequence
of a kv head resident, a 1024-row query block) keep the grid to a few dozen steps, and the chunks keep the
wasted part of each diagonal block to a chunk's triangle.

Backward works in the transposed layout (keys on sublanes, queries on lanes) so the per-row
logsumexp and delta arrive as lane-dense [1, block_q] rows rather than columns:
  * dk/dv kernel, grid (B, Hkv, kv blocks, G * q blocks): the reduction axis walks every query block
    of every query head in the group, so dk and dv come out per kv head with no extra reduction;
  * dq kernel, grid (B, Hq, q blocks, kv blocks).
The sink gradient is a small XLA reduction. All dots accumulate in f32: bf16 operands (P cast to bf16 before P.V)
run at DEFAULT precision, one MXU pass; f32 operands use HIGHEST. Key chunks a query chunk sees in full skip the
mask (full_key_range): only the band's edges pay for it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import LANES

MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite "minus infinity": exp(MASKED - m) is 0, never NaN
EMPTY_LSE = 0.7 * float(jnp.finfo(jnp.float32).max)  # logsumexp of a row with no keys: exp(s - it) is 0


@dataclasses.dataclass(frozen=True)
class FlashStatic:
    """Everything static about one call (hashable: a nondiff argument of the custom_vjp)."""

    causal: bool
    sm_scale: float
    window: int | None
    soft_cap: float | None
    has_sinks: bool
    block_q: int
    block_kv: int
    group: int
    interpret: Any = False
    vmem_limit_bytes: int | None = None
    heads_per_block: int = 1  # forward: query heads per grid step (divides group)
    chunk_q: int = 0  # forward: query rows / key columns per inner tile (divide block_q / block_kv; 0: the block)
    chunk_kv: int = 0
    bwd_block_q: int = 0  # backward kernels' blocks (divide block_q / block_kv; 0: the forward's)
    bwd_block_kv: int = 0

    @property
    def cq(self) -> int:
        return self.chunk_q or self.block_q

    @property
    def ck(self) -> int:
        return self.chunk_kv or self.block_kv

    def backward(self) -> FlashStatic:
        """The statics the backward kernels run with: their own blocks (the forward's are sized for one pass
        over the keys per query block; the backward holds more [bq, bk] temporaries per step)."""
        return dataclasses.replace(self, block_q=self.bwd_block_q or self.block_q,
                                   block_kv=self.bwd_block_kv or self.block_kv, chunk_q=0, chunk_kv=0,
                                   bwd_block_q=0, bwd_block_kv=0)


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int]) -> jax.Array:
    """2-D dot contracting a's axis contract[0] with b's axis contract[1]; f32 result."""
    precision = jax.lax.Precision.HIGHEST if jnp.float32 in (a.dtype, b.dtype) else None
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _mxu(x: jax.Array, like: jax.Array) -> jax.Array:
    """f32 probabilities/gradients go to the MXU in the operand dtype (bf16 stays bf16)."""
    return x.astype(like.dtype)


def online_softmax_step(s: jax.Array, mask: jax.Array | None, v: jax.Array, m_scr: Any, l_scr: Any, acc_scr: Any,
                        *, values_transposed: bool = False) -> None:
    """One key block of the online softmax: fold masked logits `s` and values `v` ([bk, D], or [D, bk] when
    `values_transposed`) into the running max (m_scr), denominator (l_scr) and output accumulator (acc_scr).
    Scratch rows hold the row's value in every lane. Shared by the prefill and decode kernels. `mask` None: every
    logit of the block is seen (a block inside the band), and the masking's vector work is skipped."""
    if mask is not None:
        s = jnp.where(mask, s, MASKED)
    m_prev = m_scr[...]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, :1])
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=1, keepdims=True)
    m_scr[...] = m_next
    acc_scr[...] = acc_scr[...] * alpha[:, :1] + _dot(_mxu(p, v), v, (1, 1) if values_transposed else (1, 0))


def finish_softmax(m: jax.Array, denom: jax.Array, acc: jax.Array, sink: jax.Array | None = None) -> jax.Array:
    """The output rows of an online softmax (f32): a sink's logit (the row's value in every lane) folded into the
    denominator first when given; a row that saw no key gives zeros. Shared by the decode and paged kernels."""
    if sink is not None:
        m_fin = jnp.maximum(m, sink)
        rescale = jnp.exp(m - m_fin)
        denom = denom * rescale + jnp.exp(sink - m_fin)
        acc = acc * rescale[:, :1]
    safe = jnp.where(denom > 0, denom, 1.0)
    return acc / safe[:, :1]


def key_range(q_len: jax.Array, kv_len: jax.Array, r0: jax.Array, rows: int, st: FlashStatic):
    """(lo, hi, empty): the keys that query rows r0 .. r0 + rows - 1 attend, as positions. Scalar math."""
    r1 = jnp.minimum(r0 + rows, q_len) - 1
    off = kv_len - q_len
    lo = jnp.int32(0)
    hi = kv_len - 1
    if st.causal:
        hi = jnp.minimum(hi, r1 + off)
    if st.window is not None:
        lo = jnp.maximum(lo, r0 + off - st.window + 1)
    return lo, hi, (r1 < r0) | (hi < lo)


def full_key_range(q_len: jax.Array, kv_len: jax.Array, r0: jax.Array, rows: int, st: FlashStatic):
    """(lo, hi): the keys that every one of query rows r0 .. r0 + rows - 1 attends (hi < lo: none; none either when
    a row is past q_len). A key chunk inside [lo, hi] needs no mask. Scalar math."""
    off = kv_len - q_len
    lo = jnp.int32(0)
    hi = jnp.where(r0 + rows > q_len, -1, kv_len - 1)
    if st.causal:
        hi = jnp.minimum(hi, r0 + off)
    if st.window is not None:
        lo = jnp.maximum(lo, r0 + rows - 1 + off - st.window + 1)
    return lo, hi


def kv_block_range(q_len: jax.Array, kv_len: jax.Array, qi: jax.Array, st: FlashStatic):
    """(first, last, empty): the key blocks query block qi attends. Scalar math: runs in index maps."""
    lo, hi, empty = key_range(q_len, kv_len, qi * st.block_q, st.block_q, st)
    return lo // st.block_kv, jnp.maximum(hi, 0) // st.block_kv, empty


def q_block_range(q_len: jax.Array, kv_len: jax.Array, kj: jax.Array, st: FlashStatic):
    """(first, last, empty): the query blocks that attend key block kj."""
    c0 = kj * st.block_kv
    c1 = jnp.minimum(c0 + st.block_kv, kv_len) - 1
    off = kv_len - q_len
    lo = jnp.int32(0)
    hi = q_len - 1
    if st.causal:
        lo = jnp.maximum(lo, c0 - off)
    if st.window is not None:
        hi = jnp.minimum(hi, c1 + st.window - 1 - off)
    empty = (c1 < c0) | (hi < lo)
    return jnp.maximum(lo, 0) // st.block_q, jnp.maximum(hi, 0) // st.block_q, empty


def _clamp(idx: jax.Array, first: jax.Array, last: jax.Array, empty: jax.Array) -> jax.Array:
    return jnp.where(empty, 0, jnp.clip(idx, first, jnp.maximum(first, last)))


def _mask(rows: jax.Array, cols: jax.Array, q_len: jax.Array, kv_len: jax.Array, st: FlashStatic) -> jax.Array:
    mask = (rows < q_len) & (cols < kv_len)
    pos = rows + (kv_len - q_len)
    if st.causal:
        mask &= cols <= pos
    if st.window is not None:
        mask &= cols > pos - st.window
    return mask


def _logits(a: jax.Array, b: jax.Array, st: FlashStatic) -> tuple[jax.Array, jax.Array | None]:
    """Scaled (and soft-capped) a @ b.T in f32, plus tanh for the soft-cap derivative."""
    s = _dot(a, b, (1, 1)) * st.sm_scale
    if st.soft_cap is None:
        return s, None
    t = jnp.tanh(s / st.soft_cap)
    return st.soft_cap * t, t


# ----------------------------------------------------------------------------------------------- forward


#: Key columns one unmasked online-softmax step of the forward takes at most (a few chunks at once: fewer rescales
#: of the running output, logits of at most chunk_q x 512 in f32).
WIDE_STEP_COLUMNS = 512


def _wide_steps(st: FlashStatic) -> int:
    """Key chunks per unmasked softmax step: as many as fit WIDE_STEP_COLUMNS and the key block."""
    return max(1, min(WIDE_STEP_COLUMNS, st.block_kv) // st.ck)


def _fwd_kernel(qlen_ref, kvlen_ref, sinks_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, m_scr, l_scr, acc_scr,
                *, st: FlashStatic, nk: int):
    """One (query block, key block) step for `heads_per_block` heads, in inner tiles of chunk_q x chunk_kv: each
    query chunk loops over only the key chunks its causal band / window / length reaches, so the masked part of a
    diagonal block is neither computed nor (being outside every chunk's range) touched. With one key block per
    sequence (nk == 1) a chunk's running max/sum/accumulator live in a one-chunk scratch and the chunk is finished
    at once; otherwise the scratch holds every row of the block across the key steps."""
    b, hb, qi, kj = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    q_len, kv_len = qlen_ref[b], kvlen_ref[b]
    first, last, empty = kv_block_range(q_len, kv_len, qi, st)
    heads, cq, ck = st.heads_per_block, st.cq, st.ck
    whole = nk == 1  # the state of one chunk at a time

    if not whole:
        @pl.when(kj == 0)
        def _init():
            m_scr[...] = jnp.full(m_scr.shape, MASKED, jnp.float32)
            l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
            acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    def state(i, c):
        rows = pl.ds(0, cq) if whole else pl.ds(c * cq, cq)
        h = 0 if whole else i
        return m_scr.at[h, rows], l_scr.at[h, rows], acc_scr.at[h, rows]

    def chunk(i, c):
        """Query chunk c of head i against the key chunks of block kj it attends."""
        r0 = qi * st.block_q + c * cq
        lo, hi, none = key_range(q_len, kv_len, r0, cq, st)
        base = kj * st.block_kv
        c_first = jnp.maximum(lo - base, 0) // ck
        c_last = jnp.where(none, -1, (jnp.minimum(hi, base + st.block_kv - 1) - base) // ck)
        m_ref, l_ref, acc_ref = state(i, c)
        if whole:
            m_ref[...] = jnp.full(m_ref.shape, MASKED, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        q = q_ref[i, pl.ds(c * cq, cq), :]

        def kv_chunk(j, carry, *, masked: bool = True, width: int = 1):
            cols0 = pl.multiple_of(j * ck, ck)
            k, v = k_ref[pl.ds(cols0, width * ck), :], v_ref[pl.ds(cols0, width * ck), :]
            s, _ = _logits(q, k, st)
            mask = None
            if masked:
                rows = r0 + jax.lax.broadcasted_iota(jnp.int32, (cq, ck), 0)
                cols = base + cols0 + jax.lax.broadcasted_iota(jnp.int32, (cq, ck), 1)
                mask = _mask(rows, cols, q_len, kv_len, st)
            online_softmax_step(s, mask, v, m_ref, l_ref, acc_ref)
            return carry

        # key chunks every row of this query chunk sees in full run unmasked, `wide` chunks per softmax step (the
        # running max's rescale is paid once per step); the band's edges keep the mask
        f_lo, f_hi = full_key_range(q_len, kv_len, r0, cq, st)
        f_first = jnp.clip((jnp.maximum(f_lo - base, 0) + ck - 1) // ck, c_first, c_last + 1)
        f_last = jnp.clip((f_hi - base + 1) // ck - 1, f_first - 1, c_last)
        wide = _wide_steps(st)
        n_wide = (f_last + 1 - f_first) // wide
        jax.lax.fori_loop(c_first, f_first, kv_chunk, None)
        jax.lax.fori_loop(0, n_wide, lambda j, carry: kv_chunk(f_first + j * wide, carry, masked=False, width=wide),
                          None)
        jax.lax.fori_loop(f_first + n_wide * wide, f_last + 1, functools.partial(kv_chunk, masked=False), None)
        jax.lax.fori_loop(f_last + 1, c_last + 1, kv_chunk, None)
        if whole:
            _finish_chunk(i, c, hb, m_ref, l_ref, acc_ref, sinks_ref, o_ref, lse_ref, st)

    def _step():
        def head(i, carry):
            for c in range(st.block_q // cq):  # static: lane offsets of the lse row stay static
                chunk(i, c)
            return carry

        _over_heads(heads, head)

    if whole:  # every chunk runs (an empty one finishes as zeros): the step writes its whole output block
        _step()
    else:
        pl.when(jnp.logical_not(empty) & (kj >= first) & (kj <= last))(_step)

    if not whole:
        @pl.when(kj == pl.num_programs(3) - 1)
        def _finish():
            def head(i, carry):
                for c in range(st.block_q // cq):
                    _finish_chunk(i, c, hb, *state(i, c), sinks_ref, o_ref, lse_ref, st)
                return carry

            _over_heads(heads, head)


def _finish_chunk(i, c, hb, m_ref, l_ref, acc_ref, sinks_ref, o_ref, lse_ref, st: FlashStatic) -> None:
    """Normalise query chunk c of head i: output rows and their lane-dense logsumexp."""
    m, denom, acc = m_ref[...], l_ref[...], acc_ref[...]
    if st.has_sinks:  # the sink joins the denominator only: rescale to max(m, sink) and add its term
        sink = sinks_ref[hb * st.heads_per_block + i]
        m_fin = jnp.maximum(m, sink)
        rescale = jnp.exp(m - m_fin)
        denom = denom * rescale + jnp.exp(sink - m_fin)
        acc = acc * rescale[:, :1]
        m = m_fin
    has_keys = denom > 0
    safe_l = jnp.where(has_keys, denom, 1.0)
    rows = pl.ds(c * st.cq, st.cq)
    o_ref[i, rows, :] = (acc / safe_l[:, :1]).astype(o_ref.dtype)
    lse = jnp.where(has_keys, m + jnp.log(safe_l), EMPTY_LSE)  # [cq, LANES]
    lse_ref[i, :, rows] = lse.T[:1, :]  # lane-dense row for the backward kernels


def _over_heads(heads: int, body: Any) -> None:
    """body(i, None) for each head of the block, as a loop (not unrolled: Mosaic's compile time grows with the
    unrolled code, ~3x at 8 heads of 256 x 1024 tiles)."""
    if heads == 1:
        body(0, None)
    else:
        jax.lax.fori_loop(0, heads, body, None)


def flash_forward(q, k, v, sinks, q_len, kv_len, st: FlashStatic):
    """q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] with Sq, Skv multiples of the blocks -> (o, lse[B,Hq,1,Sq])."""
    b, hq, sq, d = q.shape
    skv = k.shape[2]
    nq, nk = sq // st.block_q, skv // st.block_kv
    bq, bk, g, hpb = st.block_q, st.block_kv, st.group, st.heads_per_block
    if g % hpb:
        raise ValueError(f"heads_per_block {hpb} must divide the group of {g} query heads per kv head")
    if bq % st.cq or bk % st.ck:
        raise ValueError(f"chunks {st.cq}x{st.ck} must divide the blocks {bq}x{bk}")
    state_heads, state_rows = (1, st.cq) if nk == 1 else (hpb, bq)

    def kv_map(bi, hb, qi, kj, qlen_ref, kvlen_ref, sinks_ref):
        first, last, empty = kv_block_range(qlen_ref[bi], kvlen_ref[bi], qi, st)
        return bi, (hb * hpb) // g, _clamp(kj, first, last, empty), 0

    q_map = lambda bi, hb, qi, kj, *_: (bi, hb, qi, 0)
    lse_map = lambda bi, hb, qi, kj, *_: (bi, hb, 0, qi)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st, nk=nk),
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, hq, 1, sq), jnp.float32)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(b, hq // hpb, nq, nk),
            in_specs=[
                pl.BlockSpec((None, hpb, bq, d), q_map),
                pl.BlockSpec((None, None, bk, d), kv_map),
                pl.BlockSpec((None, None, bk, d), kv_map),
            ],
            out_specs=[pl.BlockSpec((None, hpb, bq, d), q_map), pl.BlockSpec((None, hpb, 1, bq), lse_map)],
            scratch_shapes=[
                pltpu.VMEM((state_heads, state_rows, LANES), jnp.float32),
                pltpu.VMEM((state_heads, state_rows, LANES), jnp.float32),
                pltpu.VMEM((state_heads, state_rows, d), jnp.float32),
            ],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=st.vmem_limit_bytes,
        ),
        interpret=st.interpret,
        name="flash_attention_fwd",
    )(q_len, kv_len, sinks, q, k, v)


# ---------------------------------------------------------------------------------------------- backward


def _probs_t(q, k, lse, qi, kj, q_len, kv_len, st: FlashStatic):
    """Transposed probabilities p.T [bk, bq] (and tanh for the soft cap) of one block pair."""
    s_t, t = _logits(k, q, st)
    shape = (st.block_kv, st.block_q)
    cols = kj * st.block_kv + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    rows = qi * st.block_q + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    mask = _mask(rows, cols, q_len, kv_len, st)
    return jnp.where(mask, jnp.exp(s_t - lse), 0.0), t


def _dlogits_t(p_t, t, v, do, delta, st: FlashStatic):
    """d(logits before the cap).T: p * (dO.v - delta), times the soft cap's 1 - tanh^2."""
    ds_t = p_t * (_dot(v, do, (1, 1)) - delta)
    if t is not None:
        ds_t = ds_t * (1.0 - t * t)
    return ds_t


def _dkv_kernel(qlen_ref, kvlen_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                dk_scr, dv_scr, *, st: FlashStatic, nq: int):
    b, kj, r = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    qi = r % nq
    q_len, kv_len = qlen_ref[b], kvlen_ref[b]
    first, last, empty = q_block_range(q_len, kv_len, kj, st)

    @pl.when(r == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    @pl.when(jnp.logical_not(empty) & (qi >= first) & (qi <= last))
    def _step():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        p_t, t = _probs_t(q, k, lse_ref[...], qi, kj, q_len, kv_len, st)
        dv_scr[...] += _dot(_mxu(p_t, do), do, (1, 0))
        ds_t = _dlogits_t(p_t, t, v, do, delta_ref[...], st)
        dk_scr[...] += _dot(_mxu(ds_t, q), q, (1, 0)) * st.sm_scale

    @pl.when(r == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


def _dq_kernel(qlen_ref, kvlen_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_scr,
               *, st: FlashStatic):
    b, qi, kj = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    q_len, kv_len = qlen_ref[b], kvlen_ref[b]
    first, last, empty = kv_block_range(q_len, kv_len, qi, st)

    @pl.when(kj == 0)
    def _init():
        dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

    @pl.when(jnp.logical_not(empty) & (kj >= first) & (kj <= last))
    def _step():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        p_t, t = _probs_t(q, k, lse_ref[...], qi, kj, q_len, kv_len, st)
        ds_t = _dlogits_t(p_t, t, v, do, delta_ref[...], st)
        dq_scr[...] += _dot(_mxu(ds_t, k), k, (0, 0)) * st.sm_scale

    @pl.when(kj == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = dq_scr[...].astype(dq_ref.dtype)


def flash_backward(q, k, v, o, lse, do, q_len, kv_len, st: FlashStatic):
    """(dq, dk, dv, delta) for padded operands; delta = rowsum(dO * O) [B,Hq,1,Sq] f32."""
    st = st.backward()
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    nq, nk = sq // st.block_q, skv // st.block_kv
    bq, bk, g = st.block_q, st.block_kv, st.group
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)[:, :, None, :]
    params = lambda: pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        vmem_limit_bytes=st.vmem_limit_bytes,
    )

    # dk, dv: reduction index r walks (query head in group, query block).
    def qrow_map(bi, hk, kj, r, qlen_ref, kvlen_ref):
        first, last, empty = q_block_range(qlen_ref[bi], kvlen_ref[bi], kj, st)
        return bi, hk * g + r // nq, _clamp(r % nq, first, last, empty), 0

    def lrow_map(bi, hk, kj, r, qlen_ref, kvlen_ref):
        first, last, empty = q_block_range(qlen_ref[bi], kvlen_ref[bi], kj, st)
        return bi, hk * g + r // nq, 0, _clamp(r % nq, first, last, empty)

    kv_own = lambda bi, hk, kj, r, *_: (bi, hk, kj, 0)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, nq=nq),
        out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(b, hkv, nk, g * nq),
            in_specs=[
                pl.BlockSpec((None, None, bq, d), qrow_map),
                pl.BlockSpec((None, None, bk, d), kv_own),
                pl.BlockSpec((None, None, bk, d), kv_own),
                pl.BlockSpec((None, None, bq, d), qrow_map),
                pl.BlockSpec((None, None, 1, bq), lrow_map),
                pl.BlockSpec((None, None, 1, bq), lrow_map),
            ],
            out_specs=[pl.BlockSpec((None, None, bk, d), kv_own), pl.BlockSpec((None, None, bk, d), kv_own)],
            scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)],
        ),
        compiler_params=params(),
        interpret=st.interpret,
        name="flash_attention_dkv",
    )(q_len, kv_len, q, k, v, do, lse, delta)

    def kv_map(bi, h, qi, kj, qlen_ref, kvlen_ref):
        first, last, empty = kv_block_range(qlen_ref[bi], kvlen_ref[bi], qi, st)
        return bi, h // g, _clamp(kj, first, last, empty), 0

    q_own = lambda bi, h, qi, kj, *_: (bi, h, qi, 0)
    l_own = lambda bi, h, qi, kj, *_: (bi, h, 0, qi)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(b, hq, nq, nk),
            in_specs=[
                pl.BlockSpec((None, None, bq, d), q_own),
                pl.BlockSpec((None, None, bk, d), kv_map),
                pl.BlockSpec((None, None, bk, d), kv_map),
                pl.BlockSpec((None, None, bq, d), q_own),
                pl.BlockSpec((None, None, 1, bq), l_own),
                pl.BlockSpec((None, None, 1, bq), l_own),
            ],
            out_specs=pl.BlockSpec((None, None, bq, d), q_own),
            scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32)],
        ),
        compiler_params=params(),
        interpret=st.interpret,
        name="flash_attention_dq",
    )(q_len, kv_len, q, k, v, do, lse, delta)
    return dq, dk, dv, delta


# ------------------------------------------------------------------------------------------- custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def flash_attention_padded(st: FlashStatic, q, k, v, sinks, q_len, kv_len):
    """Differentiable flash attention over block-padded operands (sinks: [Hq] f32, zeros if unused)."""
    return flash_forward(q, k, v, sinks, q_len, kv_len, st)[0]


def _vjp_fwd(st, q, k, v, sinks, q_len, kv_len):
    o, lse = flash_forward(q, k, v, sinks, q_len, kv_len, st)
    return o, (q, k, v, sinks, q_len, kv_len, o, lse)


def _vjp_bwd(st, res, do):
    q, k, v, sinks, q_len, kv_len, o, lse = res
    dq, dk, dv, delta = flash_backward(q, k, v, o, lse, do, q_len, kv_len, st)
    if st.has_sinks:  # d sink = -sum over rows of P(sink) * rowsum(dO * O)
        p_sink = jnp.exp(sinks[None, :, None, None] - lse)
        dsinks = -jnp.sum(p_sink * delta, axis=(0, 2, 3))
    else:
        dsinks = jnp.zeros_like(sinks)
    return dq, dk, dv, dsinks, None, None


flash_attention_padded.defvjp(_vjp_fwd, _vjp_bwd)
