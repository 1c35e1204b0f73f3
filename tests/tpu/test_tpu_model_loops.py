"""The TPU cost model on loops whose bounds come from scalar memory or from data the kernel reads.

A while loop bounded by an SMEM input is walked with the value the call receives (its DMAs, vector work and
pipeline stages counted per iteration, by hand below); with the value unknown, the call is timed at both ends of
what its data allows (no iteration; as many as its DMAs stay inside the array) and says why. Tokamax's Mosaic ragged
dot (its grid an emit_pipeline inside one step, bounded by an SMEM count of active tiles) is read in the TPU env.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.tpu.chips import chip
from tests.client_env import child_env
from tests.tpu_toys import env_or_skip
from tpu_cost_model.schedule import Unmodeled, kernel_cost

ROOT = Path(__file__).resolve().parents[2]
SDS = jax.ShapeDtypeStruct
ROWS, WIDTH, CHUNK = 256, 128, 8  # x is [256, 128] f32, copied 8 rows an iteration: 32 chunks before its end


def _sum_chunks(bound, x_hbm, o_ref, buf, sem):
    """o = the sum of x's first `bound` chunks, one DMA an iteration of a while loop."""
    def body(i):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * CHUNK, CHUNK)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] += buf[...]
        return i + 1

    o_ref[...] = jnp.zeros_like(o_ref)
    jax.lax.while_loop(lambda i: i < bound, body, 0)


def _kernel(n_ref, x_hbm, o_ref, buf, sem):
    _sum_chunks(n_ref[0], x_hbm, o_ref, buf, sem)


CALL = pl.pallas_call(_kernel, out_shape=SDS((CHUNK, WIDTH), jnp.float32),
                      in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                      scratch_shapes=[pltpu.VMEM((CHUNK, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA])
X = SDS((ROWS, WIDTH), jnp.float32)
CHUNK_BYTES = CHUNK * WIDTH * 4


@pytest.mark.parametrize("trips", [0, 3, 12, 32])
def test_a_while_loop_bounded_by_an_smem_input_runs_its_concrete_trip_count(trips):
    cost = kernel_cost(CALL, np.array([trips], np.int32), X)
    (c,) = cost.calls
    assert c.dmas == trips and c.stages == trips  # one DMA an iteration, each iteration one pipeline stage
    assert c.read_bytes == 4 + trips * CHUNK_BYTES  # the SMEM count, then the chunks copied in
    assert c.vpu_elems == trips * CHUNK * WIDTH  # one add an iteration (the zeroing is a broadcast)
    assert cost.bounded == [] and c.upper is None


def test_modeled_time_grows_with_the_trip_count():
    v6e = chip("v6e")
    times = [kernel_cost(CALL, np.array([t], np.int32), X).seconds(v6e) for t in (1, 4, 16)]
    assert times[0] < times[1] < times[2]
    assert np.isfinite(times).all()


def test_an_unknown_trip_count_is_bounded_on_both_sides_with_the_reason():
    cost = kernel_cost(CALL, SDS((1,), jnp.int32), X)
    (c,) = cost.calls
    assert c.dmas == 0 and c.upper is not None and c.upper.dmas == ROWS // CHUNK  # 0 .. 32 iterations
    assert c.upper.read_bytes == 4 + ROWS * WIDTH * 4
    assert any("at least 0 iteration" in why for why in cost.bounded)
    assert any("at most 32 iteration" in why and "past the end of an array" in why for why in cost.bounded)
    v6e = chip("v6e")
    lo, hi = cost.band(v6e)
    known = [kernel_cost(CALL, np.array([t], np.int32), X).seconds(v6e) for t in (0, 32)]
    assert lo <= known[0] and known[1] <= hi and lo < hi


def test_a_loop_nothing_bounds_is_still_refused():
    def kernel(n_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref) + jax.lax.while_loop(lambda i: i < n_ref[0], lambda i: i + 1, 0)

    call = pl.pallas_call(kernel, out_shape=SDS((8, 128), jnp.int32),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])
    with pytest.raises(Unmodeled, match="nothing its body reads bounds it"):
        kernel_cost(call, SDS((1,), jnp.int32))


_TOKAMAX = """
import json, sys
import numpy as np, jax
import tokamax
from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import tpu_target
from tpu_cost_model.schedule import kernel_cost
sizes = np.array([100, 0, 130, 26], np.int32)
sds = jax.ShapeDtypeStruct
fn = lambda a, b, s: tokamax.ragged_dot(a, b, s, implementation="mosaic")
with tpu_target("v6e"):
    cost = kernel_cost(fn, sds((256, 512), "bfloat16"), sds((4, 512, 512), "bfloat16"), sizes, generation="v6e")
c = cost.calls[0]
print(json.dumps({"name": c.name, "flops": c.flops, "read": c.read_bytes, "stages": c.stages, "dmas": c.dmas,
                  "seconds": cost.seconds(chip("v6e")), "band": cost.band(chip("v6e")), "bounded": cost.bounded}))
"""


def test_tokamax_mosaic_ragged_dot_is_read_not_refused():
    """Its whole grid is an emit_pipeline inside one step, bounded by an SMEM count of active tiles: walked with
    the count the routing gives, the weights of the three groups with rows read, their dots counted."""
    env = env_or_skip()
    done = subprocess.run([str(env.python), "-c", _TOKAMAX], capture_output=True, text=True, timeout=600,
                          env=child_env(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3",
                                        ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bounded"] == []  # the count was concrete
    assert out["read"] >= 3 * 512 * 512 * 2 + 256 * 512 * 2  # the visited experts' weights and the rows
    assert out["flops"] >= 2 * 256 * 512 * 512  # every row's dot, at least once
    assert out["stages"] > 1 and out["dmas"] > 0  # the pipeline's iterations inside the one grid step
    lo, hi = out["band"]
    assert 0 < lo <= out["seconds"] <= hi


def _gather_kernel(idx_ref, x_hbm, o_ref, buf, sem):
    """Reads a 2-D SMEM table per iteration (which chunk to copy, whether to skip it) inside a fori_loop."""
    def body(i, acc):
        @pl.when(idx_ref[1, i] > 0)
        def _():
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(idx_ref[0, i] * CHUNK, CHUNK)], buf, sem)
            copy.start()
            copy.wait()
            o_ref[...] += buf[...]
        return acc + idx_ref[1, i]

    o_ref[...] = jnp.zeros_like(o_ref)
    jax.lax.fori_loop(0, idx_ref.shape[1], body, 0)


GATHER = pl.pallas_call(_gather_kernel, out_shape=SDS((CHUNK, WIDTH), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                        scratch_shapes=[pltpu.VMEM((CHUNK, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA])


def _uncached(monkeypatch):
    """The walk without its caches: every equation's facts and every `get`'s indexers read afresh, and no walk
    reused from an earlier one."""
    from tpu_cost_model import schedule_grid as sg
    from tpu_cost_model import schedule_steps as ss

    monkeypatch.setattr(ss.Steps, "_facts_of", lambda self, eqn: ss._EqnFacts(eqn))
    monkeypatch.setattr(ss.Steps, "_indexers", ss.Steps._indexers_slow)
    monkeypatch.setattr(sg, "walk_key", lambda eqn, invals: None)


def _fields(cost):
    return [(c.name, c.steps, c.read_bytes, c.write_bytes, c.flops, c.dmas, c.dma_bytes, c.stages, c.vpu_elems,
             c.eup_elems, sorted(c.dots.items()), sorted(c.fetches.items()), c.bounded,
             None if c.upper is None else (c.upper.read_bytes, c.upper.dmas, c.upper.stages)) for c in cost.calls]


@pytest.mark.parametrize("case", ["while", "while unknown", "gather"])
def test_the_cached_walk_charges_what_the_uncached_walk_charges(case, monkeypatch):
    rng = np.random.default_rng()
    table = np.stack([rng.integers(0, ROWS // CHUNK, 40), rng.integers(0, 2, 40)]).astype(np.int32)
    table[1, :3] = 0  # leading chunks skipped
    call, args = {"while": (CALL, (np.array([rng.integers(1, 33)], np.int32), X)),
                  "while unknown": (CALL, (SDS((1,), jnp.int32), X)),
                  "gather": (GATHER, (table, X))}[case]
    v6e = chip("v6e")
    fast = kernel_cost(call, *args)
    with monkeypatch.context() as m:
        _uncached(m)
        slow = kernel_cost(call, *args)
    assert _fields(fast) == _fields(slow)
    assert fast.seconds(v6e) == slow.seconds(v6e) and fast.band(v6e) == slow.band(v6e)
    if case == "gather":  # one chunk copied per marked entry, by hand
        (c,) = fast.calls
        assert c.dmas == int(table[1].sum()) and c.read_bytes == table.nbytes + int(table[1].sum()) * CHUNK_BYTES


_TOKAMAX_BOTH_WAYS = _TOKAMAX.split("c = cost.calls[0]")[0] + """
from tpu_cost_model import schedule_grid as sg
from tpu_cost_model import schedule_steps as ss
sg.walk_key = lambda eqn, invals: None
ss.Steps._facts_of = lambda self, eqn: ss._EqnFacts(eqn)
ss.Steps._indexers = ss.Steps._indexers_slow
with tpu_target("v6e"):
    slow = kernel_cost(fn, sds((256, 512), "bfloat16"), sds((4, 512, 512), "bfloat16"), sizes, generation="v6e")
def fields(k):
    c = k.calls[0]
    return [c.read_bytes, c.write_bytes, c.flops, c.dmas, c.stages, c.vpu_elems, c.eup_elems,
            sorted(map(str, c.dots.items())), k.seconds(chip("v6e")), list(k.band(chip("v6e")))]
print(json.dumps({"fast": fields(cost), "slow": fields(slow)}))
"""


def test_tokamax_walk_is_the_same_with_and_without_the_caches():
    env = env_or_skip()
    done = subprocess.run([str(env.python), "-c", _TOKAMAX_BOTH_WAYS], capture_output=True, text=True, timeout=600,
                          env=child_env(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3",
                                        ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["fast"] == out["slow"]
    assert out["fast"][4] > 1  # the pipeline's stages were walked



def test_splash_attention_squeezed_head_blocks_are_read():
    """jax's splash attention with sinks (a peer, vmapped over kv heads) hands the walk blocks with a squeezed head
    dim where it checks for whole-array (SMEM) inputs: the walk reads it (a squeezed dim is a block of one) and moves
    at least q, k, v and the output once."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, s, d = 2, 512, 128
    mask = sm.MultiHeadMask([sm.CausalMask((s, s)) for _ in range(heads)])
    bs = sk.BlockSizes(block_q=256, block_kv=256, block_kv_compute=256)
    with jax.default_device(jax.devices("cpu")[0]):
        splash = sk.make_splash_mqa_single_device(mask=mask, block_sizes=bs)
    sinks = np.zeros((2, heads), np.float32)  # two kv heads, each an MQA kernel with sinks, as the peer runs it
    call = lambda q, k, v, z: jax.vmap(lambda a, b, c, w: splash(a, b, c, sinks=w))(q, k, v, z)
    cost = kernel_cost(call, SDS((2, heads, s, d), jnp.bfloat16), SDS((2, s, d), jnp.bfloat16),
                       SDS((2, s, d), jnp.bfloat16), sinks, generation="v5e")
    assert cost.calls
    assert cost.hbm_bytes >= 2 * (2 * heads * s * d + 2 * s * d) * 2


def test_a_walk_is_reused_only_for_the_same_kernel_and_values(monkeypatch):
    """The walk reads no chip: the same call at the same values is walked once and its copy returned (changing the
    copy leaves the stored walk alone); another trip count or another kernel is walked afresh."""
    from tpu_cost_model import schedule_grid as sg

    monkeypatch.setattr(sg, "_WALKS", {})
    walks = []
    real = sg._walk
    monkeypatch.setattr(sg, "_walk", lambda eqn, invals: walks.append(1) or real(eqn, invals))
    rng = np.random.default_rng()
    trips = int(rng.integers(1, 33))
    first = kernel_cost(CALL, np.array([trips], np.int32), X)
    first.calls[0].notes.append("changed by the caller")
    again = kernel_cost(CALL, np.array([trips], np.int32), X)
    assert len(walks) == 1
    assert _fields(again) == _fields(first) and "changed by the caller" not in again.calls[0].notes
    assert again.calls[0].dmas == trips
    other = kernel_cost(CALL, np.array([trips - 1], np.int32), X)
    assert len(walks) == 2 and other.calls[0].dmas == trips - 1
    table = np.stack([rng.integers(0, ROWS // CHUNK, 40), rng.integers(0, 2, 40)]).astype(np.int32)
    gathered = kernel_cost(GATHER, table, X)
    assert len(walks) == 3 and gathered.calls[0].dmas == int(table[1].sum())
    table[1] = 1 - table[1]  # the same kernel, other SMEM values
    flipped = kernel_cost(GATHER, table, X)
    assert len(walks) == 4 and flipped.calls[0].dmas == int(table[1].sum())


def _bitwise_bound_kernel(n_ref, x_hbm, o_ref, buf, sem):
    """The trip count is (n & 12) | 1, (n ^ 3) >> 1 logically, and ~n & 7 combined: integer bit operations on a
    scalar read from SMEM, as kernels compute block counts."""
    n = n_ref[0]
    _sum_chunks(((n & 12) | 1) + jax.lax.shift_right_logical(n ^ 3, 1) + (~n & 7), x_hbm, o_ref, buf, sem)


BITWISE = pl.pallas_call(_bitwise_bound_kernel, out_shape=SDS((CHUNK, WIDTH), jnp.float32),
                         in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                         scratch_shapes=[pltpu.VMEM((CHUNK, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA])


@pytest.mark.parametrize("n", [0, 5, 6, 13])
def test_integer_bit_operations_on_scalars_are_bitwise(n):
    expected = ((n & 12) | 1) + ((n ^ 3) >> 1) + (~n & 7)  # Python's ints: the independent reference
    cost = kernel_cost(BITWISE, np.array([n], np.int32), X)
    (c,) = cost.calls
    assert c.dmas == expected and c.stages == expected
