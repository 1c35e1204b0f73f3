"""moe_experts (the ragged-dot kernel's MoE block), on one device and expert-parallel over 8 simulated devices.

* The float64 NumPy backward (moe_reference_grads.py) against central finite differences of the float64 forward
  (reference_moe_experts): the gradient oracle is itself checked.
* The dispatch decisions and the interconnect model against byte counts worked out by hand.
* One device, in this process: every implementation (cpu, xla, the Pallas kernel interpreted) forward and gradients
  against the float64 references; bad input gets one clear error.
* The Pallas path on one device's share of a routing: the kernel fetches the weights of the experts that have rows
  and of no other (tpu_cost_model.schedule walks its grid with the real group metadata).
* 8 simulated CPU devices (a subprocess, tests/moe_mesh_worker.py): 1 device, expert-parallel 8 and 4x2 (expert x
  tensor), every dispatch scheme, f32 and bf16, forward and the gradients in x, topk_weights, w_gate_up and w_down,
  experts with no token, one place holding every row, T not a multiple of the device count: against the float64
  references and against one device; weights stacked over layers (layer=) forward, psum and all-to-all.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_hub.verify.numerics import relative_error
from tests.moe_reference_grads import moe_grads
from tests.simulated_devices import run_worker
from tpu_cost_model.ici import (
    LINK_EFFICIENCY,
    STEP_LATENCY_S,
    collective_seconds,
    fixed_seconds,
    interconnect,
    link_efficiency,
    ring_hops,
)

F32, BF16 = 1e-5, 2e-2  # f32 and bf16 bounds vs the unsharded layer
RD_LOAD = {"local": True}  # the JAX build of the source folder (conftest.py rd)


def _problem(seed: int, t=9, h=16, i=8, e=6, k=3, empty=(4,)):
    rng = np.random.default_rng(seed)
    pool = [x for x in range(e) if x not in empty]
    ids = np.stack([rng.choice(pool, k, replace=False) for _ in range(t)]).astype(np.int32)
    return (rng.standard_normal((t, h)), ids, rng.random((t, k)), rng.standard_normal((e, h, 2 * i)) / np.sqrt(h),
            rng.standard_normal((e, i, h)) / np.sqrt(i), rng.standard_normal((t, h)))


# ---- the gradient oracle -------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_numpy_backward_matches_finite_differences(rd, activation):
    x, ids, w, wgu, wd, dout = _problem(0, t=3, h=5, i=4, e=3, k=2, empty=())
    loss = lambda *a: float(np.sum(rd.reference_moe_experts(a[0], ids, *a[1:], activation=activation) * dout))
    grads = moe_grads(x, ids, w, wgu, wd, dout, activation)
    args = [x, w, wgu, wd]
    for n, (arg, grad) in enumerate(zip(args, grads, strict=True)):
        fd = np.zeros_like(arg)
        for idx in np.ndindex(arg.shape):
            eps = 1e-6
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[n][idx] += eps
            minus[n][idx] -= eps
            fd[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert relative_error(grad, fd) < 1e-7, (n, relative_error(grad, fd))


# ---- decisions and the interconnect model --------------------------------------------------------------------


def test_dispatch_bytes_and_choice_by_hand(rd):
    qwen_decode = rd.MoeSizes(64, 2048, 8, 128, 8)
    ring = 2 * 7 / 8 * 64 * 2048 * 2  # all-reduce of bf16 [64, 2048] over 8
    assert rd.collective_bytes("psum", qwen_decode) == ring == 458752
    assert rd.collective_bytes("all_gather", qwen_decode) == ring  # all-gather + reduce-scatter: the same bytes
    # exact all-to-all: 8 destinations x (8 tokens x top-8) rows each way
    assert rd.collective_bytes("all_to_all", qwen_decode) == 2 * 7 / 8 * 8 * 64 * 2048 * 2
    scheme, why = rd.choose_scheme(qwen_decode)
    assert scheme == "psum" and "fewer collectives" in why  # tied with all_gather in bytes, one collective
    assert rd.rows_per_device("psum", qwen_decode) == (512, rd.rows_per_device("psum", qwen_decode)[1])
    assert rd.rows_per_device("psum", qwen_decode, 1.25)[0] == 80  # 1.25 x 512 / 8
    # top-2 over 8 devices with a capacity factor: the all-to-all moves less than an all-reduce of every token
    mixtral = rd.MoeSizes(4096, 4096, 2, 8, 8)
    cap = 160  # 1.25 x (512 tokens x 2) / 8 destinations
    assert rd.collective_bytes("all_to_all", mixtral, 1.25) == 2 * 7 / 8 * 8 * cap * 4096 * 2
    assert rd.choose_scheme(mixtral, 1.25)[0] == "all_to_all"
    assert rd.choose_scheme(mixtral)[0] == "psum"  # exact buffers: the all-to-all would send 8x
    with pytest.raises(ValueError, match="split evenly"):
        rd.MoeSizes(64, 2048, 8, 100, 8)


def test_ici_model_by_hand():
    v6e, v5e, v5p = interconnect("v6e"), interconnect("v5e"), interconnect("v5p")
    # a link one way: bidirectional / (2 x ports) at the fitted efficiency; a ring drives two links
    assert v6e.link_bytes_per_s == pytest.approx(100e9 * LINK_EFFICIENCY) == v5p.link_bytes_per_s  # 800/4, 1200/6
    assert v6e.ring_bytes_per_s == pytest.approx(200e9 * LINK_EFFICIENCY)
    assert 0.8 < LINK_EFFICIENCY < 0.95  # the v6e 64 MiB permute: 776.34 us
    # v5e has no measured collective: its efficiency and fixed cost are bands, the point their middle
    assert v5e.ring_bytes_per_s == pytest.approx(100e9 * 0.85)
    assert link_efficiency("v5e", "fast") == 0.95 and link_efficiency("v5e", "slow") == 0.75
    assert fixed_seconds("v5e") == pytest.approx((fixed_seconds("v5e", "fast") + fixed_seconds("v5e", "slow")) / 2)
    assert v6e.hbm_bytes == 32 * 2**30 and v5e.hbm_bytes == 16 * 2**30
    bw, lat = collective_seconds("all_reduce", 8, 458752, "v6e")
    assert bw == pytest.approx(458752 / (200e9 * LINK_EFFICIENCY))
    assert lat == pytest.approx(5.0e-6 + 13 * STEP_LATENCY_S)  # 14 ring steps: the first is the fixed cost
    fast = collective_seconds("all_reduce", 8, 458752, "v6e", "fast")
    slow = collective_seconds("all_reduce", 8, 458752, "v6e", "slow")
    assert fast[1] < lat < slow[1] and fast[0] == bw == slow[0]  # measured efficiency: one figure at every end
    v5e_fast, v5e_slow = (collective_seconds("all_reduce", 8, 1e6, "v5e", end) for end in ("fast", "slow"))
    assert v5e_fast[0] < v5e_slow[0] and v5e_fast[1] < v5e_slow[1]
    assert ring_hops(8) == pytest.approx(16 / 7)
    assert collective_seconds("all_to_all", 8, 1e6, "v5e")[0] == pytest.approx(1e6 * 16 / 7 / (100e9 * 0.85))
    assert collective_seconds("all_reduce", 1, 1e6, "v5e") == (0.0, 0.0)
    # the public v6e permutes (marin-community/marin issue 6736): 1 MiB 17.45 us, 64 MiB 776.34 us
    for size, measured in ((2**20, 17.45e-6), (64 * 2**20, 776.34e-6)):
        assert sum(collective_seconds("collective_permute", 8, size, "v6e")) == pytest.approx(measured, rel=0.05)
    with pytest.raises(ValueError, match="modelled"):
        interconnect("v4")


# ---- one device ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation,interpret", [("cpu", None), ("xla", None), ("pallas", True)])
def test_one_device_forward_and_gradients(rd, implementation, interpret):
    x, ids, w, wgu, wd, dout = _problem(1)
    args = [jnp.asarray(a, jnp.float32) for a in (x, w, wgu, wd)]
    kw = {"implementation": implementation, "interpret": interpret, "activation": "gelu"}
    out = rd.moe_experts(args[0], ids, *args[1:], **kw)
    assert relative_error(out, rd.reference_moe_experts(x, ids, w, wgu, wd, "gelu")) <= F32
    assert rd.last_implementation()[0] == implementation
    loss = lambda a, b, c, d: jnp.sum(rd.moe_experts(a, ids, b, c, d, **kw) * dout)
    got = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    for g, ref in zip(got, moe_grads(*[np.asarray(a) for a in (args[0], ids, *args[1:])], dout, "gelu"), strict=True):
        assert relative_error(g, ref) <= F32


def test_gate_up_pair_is_the_same_block(rd):
    x, ids, w, wgu, wd, _ = _problem(2)
    fused = rd.moe_experts(x, ids, w, wgu, wd)
    pair = rd.moe_experts(x, ids, w, (wgu[..., :8], wgu[..., 8:]), wd)
    assert relative_error(pair, fused) <= F32


def test_bad_input_names_what_to_fix(rd):
    x, ids, w, wgu, wd, _ = _problem(3)
    with pytest.raises(ValueError, match="w_gate_up"):
        rd.moe_experts(x, ids, w, wgu[..., :-1], wd)
    with pytest.raises(ValueError, match="topk_weights"):
        rd.moe_experts(x, ids, w[:, :2], wgu, wd)
    with pytest.raises(TypeError, match="topk_ids must be integers"):
        rd.moe_experts(x, ids.astype(np.float32), w, wgu, wd)
    with pytest.raises(ValueError, match="unknown activation"):
        rd.moe_experts(x, ids, w, wgu, wd, activation="tanh")
    with pytest.raises(ValueError, match="need a mesh"):
        rd.moe_experts(x, ids, w, wgu, wd, expert_axis="expert")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("expert",))
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        rd.moe_experts(x, ids, w, wgu, wd, mesh=mesh, expert_axis="experts")
    with pytest.raises(ValueError, match="unknown dispatch"):
        rd.moe_experts(x, ids, w, wgu, wd, mesh=mesh, expert_axis="expert", dispatch="ring")


def test_partition_specs(rd):
    from jax.sharding import PartitionSpec as P

    specs, out = rd.partition_specs("expert", None, "psum")
    assert specs == (P(), P(), P(), P("expert", None, None), P("expert", None, None)) and out == P()
    specs, out = rd.partition_specs("expert", "tensor", "all_gather")
    assert specs[0] == P("expert") and out == P("expert")
    assert specs[3] == (P("expert", None, "tensor"),) * 2 and specs[4] == P("expert", "tensor", None)


def test_pallas_reads_only_the_weight_blocks_of_experts_with_rows(rd):
    """One device's share (experts 16..31 of 128, Qwen3-30B-A3B widths, decode 64 tokens): tokens route only to
    experts 17, 20, 26 among them (and to other devices' experts). Since ragged_dot 1.4.0 a forward grid step
    loads the weights of `experts_per_step` consecutive experts as one block (decode pays ~0.35 us per step on a
    TPU); the kernel walk fetches exactly the blocks holding those three experts, each once per N tile, and no
    block without rows. With a routing this concentrated a block carries idle experts' weights too: the price of
    fewer steps, chosen by config.choose_config for an even routing."""

    from tpu_cost_model.schedule import kernel_cost

    t, h, i, k, el, first = 64, 2048, 768, 8, 16, 16
    rng = np.random.default_rng(0)
    elsewhere = [e for e in range(128) if not first <= e < first + el]
    ids = np.stack([np.concatenate([[(17, 20, 26)[r % 3]], rng.choice(elsewhere, k - 1, replace=False)])
                    for r in range(t)]).astype(np.int32)
    sds = jax.ShapeDtypeStruct
    cost = kernel_cost(lambda x, gu, d: rd.moe_device_work(x, ids, np.full((t, k), 0.125, np.float32), gu, d,
                                                           first_expert=first),
                       sds((t, h), jnp.bfloat16), sds((el, h, 2 * i), jnp.bfloat16), sds((el, i, h), jnp.bfloat16))
    choose = sys.modules[rd.__name__ + ".pallas.config"].choose_config
    assert len(cost.calls) == 2
    for call, (kk, n) in zip(cost.calls, ((h, 2 * i), (i, h)), strict=True):
        cfg, _ = choose(t * k, kk, n, el, "bfloat16")  # the tiles the kernel takes off a TPU (no chip facts)
        assert cfg.tk >= kk  # whole K per step here: a weight block is fetched once per (block, N tile)
        blocks = {(e - first) // cfg.experts_per_step for e in (17, 20, 26)}
        n_tiles = -(-n // cfg.tn)
        rhs = [v for name, v in call.fetches.items() if name != "outputs"][1]
        assert rhs == len(blocks) * n_tiles
        weights = len(blocks) * cfg.experts_per_step * kk * n * 2
        assert weights <= call.read_bytes < weights + kk * n * 2  # + the rows and scalars, under one expert


# ---- 8 simulated devices -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh_results():
    return run_worker("moe_mesh_worker.py")


def test_mesh_configs_match_float64_and_one_device(mesh_results):
    assert mesh_results["devices"] == 8
    rows = mesh_results["rows"]
    configs = {r["config"] for r in rows if r["dtype"] == "float32"}
    assert configs == {"1dev"} | {f"{m}:{s}" for m in ("ep8", "ep4xtp2") for s in ("psum", "all_gather",
                                                                                    "all_to_all")}
    assert {r["config"] for r in rows if r["dtype"] == "bfloat16"} == {"1dev", "ep8:psum", "ep8:all_to_all",
                                                                       "ep4xtp2:psum"}
    for r in rows:
        bound = F32 if r["dtype"] == "float32" else BF16
        assert r["fwd_error"] <= bound, r
        assert len(r["grad_errors"]) == 4 and max(r["grad_errors"]) <= bound, r
        assert r["vs_1dev"] <= bound, r
    assert {r["routing"] for r in rows} == {"skewed_empty", "one_place"}


def test_mesh_gelu_pallas_and_fused_gate_up(mesh_results):
    extra = {e["config"]: e for e in mesh_results["extra"]}
    assert extra["ep8:psum:gelu"]["fwd_error"] <= F32 and max(extra["ep8:psum:gelu"]["grad_errors"]) <= F32
    assert extra["ep8:psum:pallas"]["fwd_error"] <= F32
    assert extra["ep8:psum:pallas"]["implementation"] == "pallas"
    assert extra["ep4xtp2:psum:fused_gate_up"]["fwd_error"] <= F32  # one [E,H,2I] array under a tensor split


def test_mesh_stacked_layers(mesh_results):
    """moe_experts(layer=) with the stacks' expert dim split over 8 devices: the float64 block of that layer."""
    extra = {e["config"]: e for e in mesh_results["extra"]}
    for label in ("ep8:psum:pallas:stacked", "ep8:all_to_all:stacked"):
        assert extra[label]["fwd_error"] <= F32 and extra[label]["vs_unstacked"] <= F32, extra[label]
