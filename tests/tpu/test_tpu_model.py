"""The TPU cost model (tpu_cost_model.schedule) against hand counts of small grids.

The walker reads the kernels' own grids, index maps and bodies; the numbers below were counted by hand from
the kernels' documented schedules (metadata.py's work items, pallas_decode.py's clamped cache blocks), not
produced by the walker. These run in the main environment (jax only); the chip-table check needs .venv-tpu.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.tpu.chips import CHIPS, chip, parse_generations
from kernel_hub.tpu.env import TpuEnvironmentError, tpu_env
from tpu_cost_model.calibration import STEP_OVERHEAD_S, STREAM_FRACTION
from tpu_cost_model.rates import rates
from tpu_cost_model.schedule import kernel_cost

ROOT = Path(__file__).resolve().parents[2]
SDS = jax.ShapeDtypeStruct


RD_LOAD = {"local": True}  # the JAX build of the source folder (conftest.py rd)


@pytest.fixture(scope="module")
def fa():
    return kh.get_local_kernel(ROOT / "kernels/pallas/flash_attention")


# M=512 rows in 4 m-tiles of 128; groups 0..7 hold rows [0,100) [] [100,300) [300,312) [] [312,462) [462,512) [].
# Work items (tile, group), by hand: (0,0) (0,1:empty) (0,2) (1,2) (2,2) (2,3) (2,4:empty) (2,5) (3,5) (3,6)
# (3,7:empty) + 1 padding item = 12 = 4 tiles + 8 groups. The forward runs only the 8 items with rows (every
# m-tile has some, so no zero-only item is needed): its items axis is a dynamic grid bound of 8.
SIZES = np.array([100, 0, 200, 12, 0, 150, 50, 0], np.int32)
ITEMS, ITEMS_WITH_ROWS = 12, 8
LHS_TILES_VISITED = 4  # fetch_tile over the 8 run items: 0 0 1 2 2 2 3 3
GROUPS_VISITED = 5  # fetch_group over them: 0 2 2 2 3 5 5 6
# the forward's packed items: two int32 per item it may run (tiles + groups - 1 = 11) and the 8 groups' 9 row offsets
PREFETCH_BYTES = 2 * (ITEMS - 1) * 4 + (8 + 1) * 4
LHS, RHS = "args[3]", "args[4]"  # after the 3 scalar-prefetch operands


def _rd_cost(rd, k, tiles):
    call = lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False,
                                         config=rd.RaggedDotConfig(*tiles))
    return kernel_cost(call, SDS((512, k), jnp.bfloat16), SDS((8, k, 384), jnp.bfloat16), SIZES)


def test_ragged_dot_whole_k_reads_each_visited_block_once(rd):
    cost = _rd_cost(rd, 256, (128, 256, 384))
    (call,) = cost.calls
    assert call.grid == (1, ITEMS_WITH_ROWS, 1) and call.steps == ITEMS_WITH_ROWS
    assert call.fetches == {LHS: LHS_TILES_VISITED, RHS: GROUPS_VISITED, "outputs": 4}
    assert call.read_bytes == LHS_TILES_VISITED * 128 * 256 * 2 + GROUPS_VISITED * 256 * 384 * 2 + PREFETCH_BYTES
    assert call.write_bytes == 4 * 128 * 384 * 2  # each output tile written back once
    assert call.flops == ITEMS_WITH_ROWS * 2 * 128 * 256 * 384  # one 128-row window dot per item with rows
    assert cost.outside_bytes == 0  # tiles divide the operands: no padding copies
    v5e = chip("v5e")
    # calibrated (tests/tpu/test_tpu_calibration.py): DMAs at a streamed copy's bandwidth under the steps, the MXU and
    # the vector units side by side (the slower of the two) after each step's fixed cost, one step's worth of the
    # shorter side exposed (8 steps, no DMA of its own), the call's fixed cost once; v5e's step cost is measured,
    # its copy fraction is a band's middle
    r = rates("v5e")
    assert r.step_overhead_s == STEP_OVERHEAD_S and r.stream_fraction != STREAM_FRACTION
    assert call.vpu_elems > 0 and call.eup_elems == 0  # the window mask and casts; no transcendental
    dma = call.hbm_bytes / (v5e.hbm_bytes_per_s * r.stream_fraction)
    mxu = call.flops / v5e.bf16_flops_per_s
    clock = v5e.bf16_flops_per_s / (4 * 128 * 128 * 2)  # four 128 x 128 MXUs: 1.5 GHz
    vec = call.vpu_elems / (r.vpu_ops_per_cycle * clock)
    assert call.stages == 0  # no loop of its own starts a DMA
    compute = max(mxu, vec) + 8 * STEP_OVERHEAD_S
    assert cost.seconds(v5e) == pytest.approx(max(dma, compute) + min(dma, compute) / 8 + r.op_fixed_s)
    fast, slow = cost.band(v5e)
    assert fast < cost.seconds(v5e) < slow


def test_ragged_dot_split_k_refetches_every_step(rd):
    cost = _rd_cost(rd, 256, (128, 128, 384))
    (call,) = cost.calls
    steps = ITEMS_WITH_ROWS * 2  # k is the innermost grid axis: both blocks' indices change on every step
    assert call.grid == (1, ITEMS_WITH_ROWS, 2) and call.steps == steps
    assert call.read_bytes == steps * 128 * 128 * 2 + steps * 128 * 384 * 2 + PREFETCH_BYTES
    assert call.write_bytes == 4 * 128 * 384 * 2
    assert call.flops == ITEMS_WITH_ROWS * 2 * (2 * 128 * 128 * 384)


def test_ragged_dot_runs_one_zero_item_per_tile_without_rows(rd):
    # rows [0,100) in group 0 and [100,160) in group 2 of 512: items with rows (tile, group) = (0,0) (0,2) (1,2);
    # tiles 2 and 3 hold no rows: one item each writes their zeros; the empty groups 1 and 3 are not visited
    call = lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False,
                                         config=rd.RaggedDotConfig(128, 256, 384))
    cost = kernel_cost(call, SDS((512, 256), jnp.bfloat16), SDS((4, 256, 384), jnp.bfloat16),
                       np.array([100, 0, 60, 0], np.int32))
    (c,) = cost.calls
    assert c.grid == (1, 5, 1) and c.steps == 5
    assert c.flops == 3 * 2 * 128 * 256 * 384
    assert c.write_bytes == 4 * 128 * 384 * 2
    assert c.fetches[RHS] == 2  # groups 0 and 2; the zero items re-address group 2's block


def test_ragged_dot_expert_blocks_and_row_windows_by_hand(rd):
    """Blocks of 2 experts, row tiles of 256, 128-row windows. Block rows: b0 [0,100) b1 [100,312) b2 [312,462)
    b3 [462,512); tiles t0 [0,256) t1 [256,512). Items with rows: (t0,b0) (t0,b1) (t1,b1) (t1,b2) (t1,b3).
    Windows (from each expert's first row rounded down to 16, to its last row): (t0,b0) e0 [0,100): 1;
    (t0,b1) e2 [100,256) from 96: 2; (t1,b1) e2 [256,300): 1, e3 [300,312) from 288: 1; (t1,b2) e5 [312,462) from
    304: 2; (t1,b3) e6 [462,512) from 448: 1. 8 window dots; empty experts 1, 4, 7 run none."""
    cfg = rd.RaggedDotConfig(tm=256, tk=256, tn=384, experts_per_step=2)
    cost = kernel_cost(lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False, config=cfg),
                       SDS((512, 256), jnp.bfloat16), SDS((8, 256, 384), jnp.bfloat16), SIZES)
    (c,) = cost.calls
    assert c.grid == (1, 5, 1) and c.steps == 5
    assert c.fetches == {LHS: 2, RHS: 4, "outputs": 2}  # lhs tiles 0 0 1 1 1; blocks 0 1 1 2 3
    prefetch = 2 * (2 + 4 - 1) * 4 + (8 + 1) * 4  # 2 tiles + 4 blocks - 1 packed items, 8 groups' offsets
    assert c.read_bytes == 2 * 256 * 256 * 2 + 4 * (2 * 256 * 384 * 2) + prefetch
    assert c.write_bytes == 2 * 256 * 384 * 2
    assert c.flops == 8 * 2 * 128 * 256 * 384


def test_padding_outside_the_kernel_is_counted(rd):
    call = lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False,
                                         config=rd.RaggedDotConfig(128, 128, 128))
    cost = kernel_cost(call, SDS((128, 200), jnp.bfloat16), SDS((2, 200, 128), jnp.bfloat16),
                       np.array([60, 68], np.int32))
    lhs_pad = 128 * 200 * 2 + 128 * 256 * 2  # read [128, 200], write [128, 256]
    rhs_pad = 2 * 200 * 128 * 2 + 2 * 256 * 128 * 2
    assert cost.outside_bytes == lhs_pad + rhs_pad
    assert len(cost.outside_ops) == 2 and all(op.startswith("pad") for op in cost.outside_ops)


def test_decode_attention_skips_blocks_past_each_sequence(fa):
    # B=2 sequences of 300 and 0 keys in a 512-long cache, 128-key blocks: grid (2, 4) = 8 steps (one step covers
    # every kv head). Sequence 0 visits blocks 0, 1, 2 (then block 2 stays resident); sequence 1 is empty: block 0.
    call = lambda q, k, v, lens: fa.decode_attention(q, k, v, lens, implementation="pallas", interpret=False,
                                                     config=fa.AttentionConfig(decode_block_kv=128))
    kv = SDS((2, 1, 512, 128), jnp.float32)
    cost = kernel_cost(call, SDS((2, 4, 128), jnp.float32), kv, kv, np.array([300, 0], np.int32))
    (c,) = cost.calls
    assert c.grid == (2, 4) and c.steps == 8
    block = 128 * 128 * 4
    q_block = 4 * 128 * 4
    assert c.read_bytes == 2 * 4 * block + 2 * q_block + q_block + 2 * 4  # k, v; q per sequence; sinks; lengths
    assert c.write_bytes == 2 * q_block
    assert c.flops == 3 * 2 * (2 * 4 * 128 * 128)  # 3 working steps, q.k and p.v each
    assert c.mxu_flops == 6 * c.flops  # f32 on the MXU: 6 bf16 passes


def test_decode_with_a_window_walks_only_the_blocks_a_window_touches(fa):
    # 2 kv heads of 2 query heads each, cache 512, blocks of 128, window 130: a window touches at most
    # (130 - 1) // 128 + 2 = 3 blocks, so the grid is (2, 3). Sequence 0 (300 keys) needs keys 170..299: blocks
    # 1 and 2 (its third step re-addresses block 2); sequence 1 is empty: block 0 once, no work.
    call = lambda q, k, v, lens: fa.decode_attention(q, k, v, lens, sliding_window=130, implementation="pallas",
                                                     interpret=False, config=fa.AttentionConfig(decode_block_kv=128))
    kv = SDS((2, 2, 512, 128), jnp.float32)
    cost = kernel_cost(call, SDS((2, 4, 128), jnp.float32), kv, kv, np.array([300, 0], np.int32))
    (c,) = cost.calls
    assert c.grid == (2, 3) and c.steps == 6
    block = 2 * 128 * 128 * 4  # both kv heads
    q_block = 2 * 2 * 128 * 4
    assert c.read_bytes == 2 * 3 * block + 2 * q_block + 2 * 2 * 128 * 4 + 2 * 4  # k, v; q; sinks; lengths
    assert c.flops == 2 * 2 * 2 * (2 * 2 * 128 * 128)  # 2 working steps x 2 heads x (q.k + p.v)


def test_cache_read_in_its_tpu_layout_costs_no_copy(fa):
    # head dim 64 over 512 positions: XLA keeps the positions in the lanes, so the kernel's [D, S] view is free;
    # forcing that view on head dim 128 (kept row-major) is a real transpose of K and V, counted outside.
    call = lambda cfg: lambda q, k, v, lens: fa.decode_attention(q, k, v, lens, implementation="pallas",
                                                                 interpret=False, config=cfg)
    lens = np.array([512, 100], np.int32)
    kv64 = SDS((2, 1, 512, 64), jnp.float32)
    free = kernel_cost(call(fa.AttentionConfig(decode_block_kv=128)), SDS((2, 2, 64), jnp.float32), kv64, kv64, lens)
    assert free.outside_bytes == 0
    kv128 = SDS((2, 1, 512, 128), jnp.float32)
    forced = fa.AttentionConfig(decode_block_kv=128, decode_kv_transposed=True)
    copied = kernel_cost(call(forced), SDS((2, 2, 128), jnp.float32), kv128, kv128, lens)
    assert copied.outside_bytes == 2 * 2 * (2 * 512 * 128 * 4)  # K and V, each read and written once


def test_prefill_heads_per_step_loop_counts_every_head(fa):
    # 4 query heads over 1 kv head, 256 x 256, blocks of 128, not causal: 4 * Hq * Sq * Skv * D FLOPs in all,
    # whether one head per step (grid 1 x 4 x 2 x 2 = 16 steps) or all four in a loop inside one (4 steps).
    costs = {}
    for heads in (1, 4):
        cfg = fa.AttentionConfig(block_q=128, block_kv=128, heads_per_block=heads)
        call = lambda q, k, v, cfg=cfg: fa.flash_attention(q, k, v, implementation="pallas", interpret=False,
                                                           config=cfg)
        kv = SDS((1, 1, 256, 128), jnp.bfloat16)
        (costs[heads],) = kernel_cost(call, SDS((1, 4, 256, 128), jnp.bfloat16), kv, kv).calls
    assert costs[1].steps == 16 and costs[4].steps == 4
    assert costs[1].flops == costs[4].flops == 4 * 4 * 256 * 256 * 128


def _one_head_f32(seqs: list[tuple[int, int]], tokens: int, pages_per_seq: int) -> tuple:
    """ragged_paged_attention's arguments for one kv head of 128 f32 (a row is 512 bytes) in pages of 16: `tokens`
    packed rows (the sequences' new tokens first, then padding), sequence i owning pages i * pages_per_seq on."""
    pages = len(seqs) * pages_per_seq
    rows, cache = SDS((tokens, 1, 128), jnp.float32), SDS((pages, 16, 1, 128), jnp.float32)
    cu = np.concatenate([[0], np.cumsum([q for q, _ in seqs])]).astype(np.int32)
    return (rows, rows, rows, cache, cache, np.array([k for _, k in seqs], np.int32),
            np.arange(pages, dtype=np.int32).reshape(len(seqs), pages_per_seq), cu, np.int32(len(seqs)))


def test_cache_write_copies_runs_of_slots_as_power_of_two_dmas(fa):
    # Pages of 16, one kv head of 128 f32 (a row is 512 bytes). Sequence 0: 20 new tokens at positions 5..24, so
    # slots 5..15 of its first page (11 rows = 8 + 2 + 1: 3 DMAs) and 0..8 of its second (9 = 8 + 1: 2); sequence
    # 1: one token at position 15, a decode step its own item stores in the attention call (none here); sequence 2:
    # 16 tokens at 16..31, a whole page (1); 2 padding rows (none). 3 runs, 6 pieces: 12 DMAs (keys and values), one
    # pipeline stage per run, 36 rows read and written twice.
    seqs = [(20, 25), (1, 16), (16, 32)]
    call = jax.jit(lambda *a: fa.ragged_paged_attention(*a, implementation="pallas", interpret=False),
                   donate_argnums=(3, 4))
    cost = kernel_cost(call, *_one_head_f32(seqs, 39, 2))
    write = next(c for c in cost.calls if c.name == "ragged_paged_attention_cache_write")
    assert write.dmas == 12 and write.stages == 3
    assert write.dma_bytes == 2 * 2 * 36 * 512
    assert [c.name for c in cost.calls] == ["ragged_paged_attention_cache_write", "ragged_paged_attention_mixed_store"]


def test_decode_attention_stores_its_rows_in_the_same_call(fa):
    # Three sequences of one new token each (lengths 25, 16, 32 over two pages of 16) and two padding rows, one kv
    # head of 128 f32, two pages a step: each real item copies the pages it sees, of K and of V (2, 1 and 2 pages:
    # 10 DMAs, one step each) and stores its row's K and V (2 DMAs, 512 bytes each); padding items do nothing. One
    # kernel call, no write kernel.
    seqs = [(1, 25), (1, 16), (1, 32)]
    cfg = fa.AttentionConfig(paged_block_q=1, paged_pages_per_block=2)
    args = _one_head_f32(seqs, 5, 2)

    def cost(update: bool):
        call = jax.jit(lambda *a: fa.ragged_paged_attention(*a, implementation="pallas", interpret=False, config=cfg,
                                                            update_cache=update), donate_argnums=(3, 4))
        return kernel_cost(call, *args).calls

    (stored,), (read_only,) = cost(True), cost(False)
    assert stored.name == "ragged_paged_attention_store" and read_only.name == "ragged_paged_attention"
    assert read_only.dmas == 2 * (2 + 1 + 2)
    assert stored.dmas == 2 * (2 + 1 + 2) + 3 * 2


def test_generations_parse_and_refuse():
    assert parse_generations("v6e, v5e,v6e") == ("v6e", "v5e")
    with pytest.raises(ValueError, match="known: v4, v5e, v5p, v6e, v7x"):
        parse_generations("v5x")


_TPU_INFO = """
import json
from jax.experimental import topologies
from jax._src.pallas.mosaic import tpu_info as t
out = {}
for gen, topo in %s:
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topo).devices
    dev = devices[0]
    # jax's figures are per TensorCore; a device is dev.num_cores of them (1 unless megacore)
    info = t.get_tpu_info_for_chip(t.chip_version_from_device_kind(dev.device_kind), dev.num_cores)
    chips = len({tuple(d.coords) for d in devices})
    out[gen] = [dev.device_kind, info.mem_bw_bytes_per_second * dev.num_cores,
                info.bf16_ops_per_second * dev.num_cores, len(devices) / chips]
print(json.dumps(out))
"""


def test_chip_table_matches_jax_per_device_and_the_mock_devices():
    """Our figures are per JAX device: v7x's published per-chip ones over its two devices (one per TensorCore,
    as the mock topology lays out: 2 devices per chip coordinate) agree with jax's per-TensorCore table, as v5e's
    and v6e's agree with it. Google's 7.37 TB/s v7x over jax's 7.40 is the widest gap, 0.4%."""
    try:
        env = tpu_env()
    except TpuEnvironmentError as exc:
        pytest.skip(str(exc))
    pairs = [(c.generation, c.topology) for c in CHIPS.values() if c.generation in ("v5e", "v6e", "v7x")]
    done = subprocess.run([str(env.python), "-c", _TPU_INFO % pairs], capture_output=True, text=True, timeout=120)
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(facts) == ["v5e", "v6e", "v7x"]
    for gen, (kind, bandwidth, flops, devices_per_chip) in facts.items():
        assert kind == chip(gen).device_kind
        assert devices_per_chip == chip(gen).devices_per_chip
        assert bandwidth == pytest.approx(chip(gen).hbm_bytes_per_s, rel=0.005)
        assert flops == pytest.approx(chip(gen).bf16_flops_per_s, rel=0.005)
    assert chip("v7x").hbm_bytes_per_s == chip("v7x").chip_hbm_bytes_per_s / 2


def test_the_kernels_tile_chooser_sees_the_same_per_device_figures(rd):
    """The kernels' vendored chip facts (what ragged_dot's tile choice balances bytes against steps with) are the
    cost model's per-device figures, v7x's halved chip ones included: the two tables cannot drift apart."""
    kernel_chips = importlib.import_module(rd.__name__ + "._vendor.chips").CHIPS
    assert set(kernel_chips) == set(CHIPS)
    for gen, facts in kernel_chips.items():
        assert facts.hbm_bytes_per_s == pytest.approx(chip(gen).hbm_bytes_per_s, rel=1e-12), gen
        assert facts.bf16_flops_per_s == pytest.approx(chip(gen).bf16_flops_per_s, rel=1e-12), gen
    assert kernel_chips["v7x"].hbm_bytes_per_s == 7370e9 / 2


# ------------------------------------------------------------------ anyone's Pallas kernel: hand-counted schedules

from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

from tpu_cost_model.schedule import Unmodeled  # noqa: E402


def test_megablox_gmm_dynamic_grid_from_the_routing():
    # jax's megablox gmm, tiles 128x128x128, M=512 (4 m-tiles), K=N=256 (2 k-, 2 n-tiles), the SIZES routing:
    # groups 0, 2, 3, 5, 6 hold rows [0,100) [100,300) [300,312) [312,462) [462,512). By hand, the (m-tile, group)
    # pairs with rows: tile 0: 0, 2; tile 1: 2; tile 2: 2, 3, 5; tile 3: 5, 6 -> 8 active tiles, so the grid is
    # (2 n, 8 active, 2 k) = 32 steps. k is innermost: the lhs and rhs blocks change on every step.
    from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm

    cost = kernel_cost(lambda a, b, s: gmm(a, b, s, tiling=(128, 128, 128)), SDS((512, 256), jnp.bfloat16),
                       SDS((8, 256, 256), jnp.bfloat16), SIZES)
    (c,) = cost.calls
    assert c.grid == (2, 8, 2) and c.steps == 32
    block = 128 * 128 * 2
    metadata = (9 + 11 + 11 + 1) * 4  # group offsets [G+1], group ids and m-tile ids [tiles_m + G - 1], offset [1]
    assert c.read_bytes == 32 * block + 32 * block + metadata
    # the f32 output block (m-tile, n) changes with the m-tile: runs 0 | 1 | 2 | 3 per n-tile = 4 x 2 write-backs
    assert c.write_bytes == 8 * 128 * 128 * 4
    assert c.flops == 32 * 2 * 128 ** 3  # megablox multiplies the whole tile on every step
    assert cost.outside_bytes == 0


def _manual_dma_call():
    """Every even step copies its 8-row slice HBM -> VMEM -> HBM itself; odd steps do nothing."""

    def kernel(x_hbm, o_hbm, buf, sem):
        i = pl.program_id(0)

        @pl.when(i % 2 == 0)
        def _():
            pltpu.async_copy(x_hbm.at[pl.ds(i * 8, 8)], buf, sem).wait()
            copy = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(i * 8, 8)], sem)
            copy.start()
            copy.wait()

    return pl.pallas_call(kernel, out_shape=SDS((64, 128), jnp.float32), grid=(8,),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])


def test_manual_dma_counted_on_the_steps_that_reach_it():
    (c,) = kernel_cost(_manual_dma_call(), SDS((64, 128), jnp.float32)).calls
    # steps 0, 2, 4, 6 each: one 8x128 f32 slice read from HBM, one written back = 4 KiB each way
    assert c.steps == 8 and c.dmas == 8
    assert c.read_bytes == 4 * 8 * 128 * 4 and c.write_bytes == 4 * 8 * 128 * 4
    assert c.fetches == {"args[0]": 0, "outputs": 0}  # nothing moved by BlockSpecs
    assert c.ici_bytes == 0 and c.flops == 0


def test_emit_pipeline_inner_blocks_and_a_remote_copy():
    def outer(x_hbm, o_hbm):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((16, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(inner, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    call = pl.pallas_call(outer, out_shape=SDS((64, 128), jnp.float32), grid=(2,),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY))
    (c,) = kernel_cost(call, SDS((64, 128), jnp.float32), generation="v6e").calls
    # 2 outer steps x 4 inner blocks of 16x128 f32 (8 KiB), each fetched in and written out once
    assert c.dmas == 2 * 4 * 2 and c.read_bytes == c.write_bytes == 2 * 4 * 16 * 128 * 4

    def remote(x_hbm, o_hbm, send, recv):
        copy = pltpu.make_async_remote_copy(x_hbm, o_hbm, send, recv, device_id=(1,),
                                            device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait_send()
        copy.wait_recv()

    call = pl.pallas_call(remote, out_shape=SDS((64, 128), jnp.float32), grid=(1,),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    (c,) = kernel_cost(call, SDS((64, 128), jnp.float32)).calls
    assert c.ici_bytes == 64 * 128 * 4 and c.dmas == 1


def test_aliased_argument_costs_a_copy_and_calls_add_up():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def call(x):
        return pl.pallas_call(kernel, out_shape=SDS((64, 128), jnp.float32), input_output_aliases={0: 0})(x)

    one = kernel_cost(call, SDS((64, 128), jnp.float32))
    assert one.calls[0].aliases == ((0, 0),)
    assert one.outside_bytes == 2 * 64 * 128 * 4  # XLA copies the (not donated) argument before writing in place
    two = kernel_cost(lambda x: call(call(x)), SDS((64, 128), jnp.float32))
    assert len(two.calls) == 2 and two.outside_bytes == one.outside_bytes  # the intermediate is written in place
    assert two.hbm_bytes == 2 * one.calls[0].hbm_bytes + one.outside_bytes


def test_shard_map_is_costed_per_device():
    from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    mesh = AbstractMesh((4,), ("x",))

    def f(a, b, s):
        local = lambda a, b, s: jax.lax.psum(gmm(a, b, s, tiling=(128, 128, 128)), "x")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("x"), P("x")), out_specs=P(), check_vma=False)(a, b, s)

    cost = kernel_cost(f, SDS((512, 256), jnp.bfloat16), SDS((32, 256, 256), jnp.bfloat16), np.tile(SIZES, 4))
    (c,) = cost.calls
    assert c.grid == (2, 8, 2)  # device 0's 8 experts hold the SIZES routing: as in the single-device count
    assert cost.ici_bytes == 512 * 256 * 4  # the psum of one device's f32 [512, 256] result


def test_what_the_model_cannot_read_is_refused_naming_the_primitive():
    def kernel(x_ref, o_ref):
        total = jnp.sum(x_ref[...])
        o_ref[...] = x_ref[...] * jax.lax.while_loop(lambda c: c < total, lambda c: c + 1.0, 0.0)

    with pytest.raises(Unmodeled, match="cannot read primitive 'while' in pallas_call kernel: its condition "
                                        "depends on vector data"):
        kernel_cost(pl.pallas_call(kernel, out_shape=SDS((8, 128), jnp.float32)), SDS((8, 128), jnp.float32))
    # a grid bound from data the model does not have (group sizes given abstract) is refused, not zero
    from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm

    with pytest.raises(Unmodeled, match="'pallas_call'.*dynamic grid bound"):
        kernel_cost(lambda a, b, s: gmm(a, b, s), SDS((512, 256), jnp.bfloat16), SDS((8, 256, 256), jnp.bfloat16),
                    SDS((8,), jnp.int32))


def test_a_block_reads_only_the_pages_its_item_sees(fa):
    # Pages of 16 f32 rows, 4 pages a block (64 positions). Decode at 40 with a window of 20 sees 20..39: pages 1
    # and 2; decode at 16 sees 0..16: pages 0 and 1. Each page is one K and one V copy: 8 DMAs of 16 x 128 x 4 bytes,
    # where whole blocks would be 16 (the block past the reach once re-read the sequence's last page).
    seqs = [(1, 40), (1, 17)]
    cfg = fa.AttentionConfig(paged_block_q=1, paged_pages_per_block=4)
    args = _one_head_f32(seqs, 2, 4)
    call = jax.jit(lambda *a: fa.ragged_paged_attention(*a, implementation="pallas", interpret=False, config=cfg,
                                                        sliding_window=20, update_cache=False))
    (read,) = kernel_cost(call, *args).calls
    assert read.name == "ragged_paged_attention"
    assert read.dmas == 8
    assert read.dma_bytes == 8 * 16 * 128 * 4


def test_a_mixed_batchs_write_kernel_writes_only_the_chunks_rows(fa):
    # A decode step (25 positions) beside a 4-token chunk at 16..19, pages of 16 f32 rows, one kv head of 128: the
    # write kernel copies the chunk's one run (4 rows, one piece each of K and V); the decode step's row is stored by
    # its own item in the attention call.
    seqs = [(1, 25), (4, 20)]
    cfg = fa.AttentionConfig(paged_block_q=4, paged_pages_per_block=2)
    args = _one_head_f32(seqs, 5, 2)
    call = jax.jit(lambda *a: fa.ragged_paged_attention(*a, implementation="pallas", interpret=False, config=cfg),
                   donate_argnums=(3, 4))
    calls = {c.name: c for c in kernel_cost(call, *args).calls}
    assert sorted(calls) == ["ragged_paged_attention_cache_write", "ragged_paged_attention_mixed_store"]
    write = calls["ragged_paged_attention_cache_write"]
    assert write.dmas == 2 and write.dma_bytes == 2 * 2 * 4 * 128 * 4  # HBM to HBM: each byte read and written
