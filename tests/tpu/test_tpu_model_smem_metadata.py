"""The walker on a kernel that fills its own metadata in SMEM scratch (as megablox gmm_v2 does from its group sizes)
and on a kernel over a TensorCore mesh (`pl.kernel`); the HLO parser on an instruction printed over several lines;
the peer-source plumbing of the calibration's grouped-matmul rows (read from a git checkout at run time)."""

from __future__ import annotations

import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_cost_model.calibration_peers import issue_group_sizes, rank_routing
from tpu_cost_model.hlo_program import parse_module
from tpu_cost_model.peer_source import (
    PEER_FILES,
    PeerSourceMissing,
    load_peer,
    missing_apis,
    peer_shims,
    read_peer_sources,
)
from tpu_cost_model.schedule import kernel_cost

SDS = jax.ShapeDtypeStruct
ROWS, WIDTH, GROUPS = 64, 128, 6


def _kernel(sizes_ref, x_hbm, o_hbm, starts, sem):
    """Copies each group's rows of x to the output with one DMA per non-empty group, sized by the group's row
    count: the offsets are a running sum the kernel stores in SMEM scratch, then reads back."""
    starts[0] = 0

    def fill(g, carry):
        starts[g + 1] = starts[g] + sizes_ref[g]
        return carry

    jax.lax.fori_loop(0, GROUPS, fill, 0)

    def copy(g, carry):
        start, size = starts[g], starts[g + 1] - starts[g]

        @pl.when(size > 0)
        def _():
            dma = pltpu.make_async_copy(x_hbm.at[pl.ds(start, size)], o_hbm.at[pl.ds(start, size)], sem)
            dma.start()
            dma.wait()
        return carry

    jax.lax.fori_loop(0, GROUPS, copy, 0)


CALL = pl.pallas_call(_kernel, out_shape=SDS((ROWS, WIDTH), jnp.float32),
                      in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                      out_specs=pl.BlockSpec(memory_space=pl.ANY),
                      scratch_shapes=[pltpu.SMEM((GROUPS + 1,), jnp.int32), pltpu.SemaphoreType.DMA])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metadata_the_kernel_stores_in_smem_sizes_its_dmas(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(ROWS - int(rng.integers(0, 9)), np.ones(GROUPS) / GROUPS).astype(np.int32)
    sizes[rng.integers(0, GROUPS)] = 0  # an empty group starts no DMA
    (c,) = kernel_cost(CALL, sizes, SDS((ROWS, WIDTH), jnp.float32)).calls
    moved = int(sizes.sum()) * WIDTH * 4
    assert c.dmas == int(np.count_nonzero(sizes))
    assert c.read_bytes == sizes.nbytes + moved and c.write_bytes == moved
    assert c.upper is None and c.bounded == []


def test_all_groups_empty_moves_nothing_but_the_sizes():
    sizes = np.zeros(GROUPS, np.int32)
    (c,) = kernel_cost(CALL, sizes, SDS((ROWS, WIDTH), jnp.float32)).calls
    assert c.dmas == 0 and c.read_bytes == sizes.nbytes and c.write_bytes == 0


def test_scalar_only_loop_iterations_run_on_the_scalar_core_alone():
    """The fill loop's iterations start no DMA and do no vector work: their scalar ops (6 an iteration, read off the
    jaxpr: the counter, two SMEM loads, two adds, a store) are charged one scalar op each, in series. The copy loop's
    iterations that start a DMA are not scalar-only; an empty group's is (8 ops: the counter, three loads, an add, a
    subtract, a compare, a convert)."""
    from dataclasses import replace

    from kernel_hub.tpu.chips import chip
    from tpu_cost_model.rates import rates

    x = SDS((ROWS, WIDTH), jnp.float32)
    (full,) = kernel_cost(CALL, np.array([10, 10, 10, 10, 10, 14], np.int32), x).calls
    (gap,) = kernel_cost(CALL, np.array([10, 0, 10, 10, 10, 14], np.int32), x).calls
    assert full.scalar_ops == 6 * GROUPS and gap.scalar_ops == 6 * GROUPS + 8
    r = rates("v7x")
    without = full.seconds(chip("v7x"), replace(r, scalar_op_s=0.0))
    assert full.seconds(chip("v7x"), r) - without == pytest.approx(6 * GROUPS * r.scalar_op_s)


def _start_then_wait(x_hbm, o_hbm, sems):
    """One loop starts a DMA per group of rows, a second loop waits for them (a write kernel's shape)."""
    def copy(g):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(g * 8, 8)], o_hbm.at[pl.ds(g * 8, 8)], sems.at[g])

    jax.lax.fori_loop(0, GROUPS, lambda g, c: (copy(g).start(), c)[1], 0)
    jax.lax.fori_loop(0, GROUPS, lambda g, c: (copy(g).wait(), c)[1], 0)


def test_a_loop_of_dma_waits_is_not_scalar_only():
    """Waiting for DMAs idles under them (the DMA time already counts): neither loop is charged scalar ops."""
    call = pl.pallas_call(_start_then_wait, out_shape=SDS((ROWS, WIDTH), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.SemaphoreType.DMA((GROUPS,))])
    (c,) = kernel_cost(call, SDS((ROWS, WIDTH), jnp.float32)).calls
    assert c.dmas == GROUPS and c.scalar_ops == 0


def _mesh_kernel(sizes_ref, x_hbm, o_hbm):
    def body(buf, sem):
        n = sizes_ref[0]

        @pl.when(n > 0)
        def _():
            pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem).start()
            pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem).wait()
            pltpu.make_async_copy(buf.at[pl.ds(0, n)], o_hbm.at[pl.ds(0, n)], sem).start()
            pltpu.make_async_copy(buf.at[pl.ds(0, n)], o_hbm.at[pl.ds(0, n)], sem).wait()

    pl.run_scoped(body, pltpu.VMEM((ROWS, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA)


@pytest.mark.parametrize("rows", [0, 5, ROWS])
def test_a_kernel_over_a_one_core_mesh_is_walked_like_one_step(rows):
    def f(n, x):
        return pl.kernel(_mesh_kernel, out_type=SDS((ROWS, WIDTH), jnp.float32),
                         mesh=pltpu.create_tensorcore_mesh("core", num_cores=1))(
            pltpu.with_memory_space_constraint(n, pltpu.SMEM), x)

    (c,) = kernel_cost(f, np.array([rows], np.int32), SDS((ROWS, WIDTH), jnp.float32), generation="v6e").calls
    assert c.steps == 1 and c.dmas == (2 if rows else 0)
    assert c.read_bytes == 4 + rows * WIDTH * 4 and c.write_bytes == rows * WIDTH * 4


MULTI_LINE = """HloModule m, entry_computation_layout={(f32[8,128]{1,0})->f32[8,128]{1,0}}

ENTRY %main (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0} parameter(0)
  %k-1.1 = f32[8,128]{1,0} custom-call(%p), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"dims.size_m":8,
"name":"a }{ b"
}}, metadata={op_name="k"}
  ROOT %n = f32[8,128]{1,0} negate(%k-1.1)
}
"""


def test_an_instruction_printed_over_several_lines_is_one_instruction():
    entry = parse_module(MULTI_LINE).entry
    assert [i.opcode for i in entry.instructions] == ["parameter", "custom-call", "negate"]
    assert entry.instructions[1].name == "k-1.1" and tuple(entry.instructions[2].operands) == ("k-1.1",)


def test_an_instruction_left_open_at_the_end_is_refused():
    with pytest.raises(ValueError, match="unbalanced"):
        parse_module(MULTI_LINE.replace('"a }{ b"\n}}', '"a }{ b"'))


@pytest.mark.parametrize(("groups", "touched", "rows", "m"), [(64, 30, 3, 96), (512, 72, 1, 80), (8, 8, 2, 16)])
def test_issue_routing_pads_into_the_last_touched_group(groups, touched, rows, m):
    sizes = issue_group_sizes(groups, touched, rows, m)
    assert sizes.sum() == m and np.count_nonzero(sizes) == touched and sizes.dtype == np.int32
    assert (sizes[:touched - 1] == rows).all() and sizes[touched - 1] == rows + m - touched * rows
    with pytest.raises(ValueError):
        issue_group_sizes(groups, touched, rows, touched * rows - 1)


@pytest.mark.parametrize("tokens", [1, 7, 256])
def test_an_ep_rank_sees_its_experts_and_a_sentinel_for_the_rest(tokens):
    ids = rank_routing(tokens, 128, 8, 16, seed=tokens)
    assert ids.shape == (tokens, 8) and ids.min() >= 0 and ids.max() <= 16
    full = np.random.default_rng(tokens).random((tokens, 128)).argsort(axis=1)[:, :8]
    assert ((full < 16) == (ids < 16)).all() and (ids[full < 16] == full[full < 16]).all()


SOURCE = '''import dataclasses
@dataclasses.dataclass(frozen=True)
class Tiles:
    m: int
def gmm_v2(x):
    return Tiles(x)
'''


def _checkout(folder, text: str) -> str:
    path = PEER_FILES["tpu_inference_gmm_v2"][1]
    (folder / path).parent.mkdir(parents=True)
    (folder / path).write_text(text)
    git = ["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "k"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_peer_source_is_read_from_a_checkouts_head_with_its_commit(tmp_path):
    commit = _checkout(tmp_path, SOURCE)
    (tmp_path / PEER_FILES["tpu_inference_gmm_v2"][1]).write_text("uncommitted edit")  # HEAD is what counts
    found = read_peer_sources([tmp_path])
    assert set(found) == {"tpu_inference_gmm_v2"}
    got = found["tpu_inference_gmm_v2"]
    assert got["commit"] == commit and got["text"] == SOURCE and got["repo"] == "vllm-project/tpu-inference"
    assert load_peer(found, "tpu_inference_gmm_v2").gmm_v2(3).m == 3
    with pytest.raises(PeerSourceMissing, match="tokamax"):
        load_peer(found, "tokamax_gmm_v2")


def test_a_plain_folder_is_read_without_a_commit(tmp_path):
    path = tmp_path / PEER_FILES["tokamax_gmm_v2"][1]
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    found = read_peer_sources([tmp_path / "missing", tmp_path])
    assert set(found) == {"tokamax_gmm_v2"} and found["tokamax_gmm_v2"]["commit"].startswith("unknown")


def test_the_shim_stands_in_only_while_it_is_held():
    before, missing = hasattr(pltpu, "TensorCoreMesh"), missing_apis()
    with peer_shims() as applied:
        assert hasattr(pltpu, "TensorCoreMesh") and len(applied) == len(missing)
        if applied:
            mesh = pltpu.TensorCoreMesh(axis_name="core")
            assert mesh.axis_names == ("core",) and np.size(mesh.devices) == 1
    assert hasattr(pltpu, "TensorCoreMesh") == before
