"""The cost model's rules beyond the grid walk: MXU passes from a dot's dtypes and precision, vector work, the XLA op
rule, what XLA removes before anything is charged, per-generation constants with bands, and `explain`.

Expected numbers are counted by hand from the shapes (bytes, FLOPs, pass counts from XLA's documented bf16_1x /
bf16_3x / bf16_6x decompositions and the chips' published int8 / fp8 rates), never read back from the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from kernel_hub.tpu.chips import chip
from tpu_cost_model import rates as rates_mod
from tpu_cost_model.peers_worker import holds_across_band
from tpu_cost_model.rates import mxu_passes, rates
from tpu_cost_model.schedule import explain, kernel_cost
from tpu_cost_model.tutorial_matmul import timed

SDS = jax.ShapeDtypeStruct
P = jax.lax.Precision


@pytest.mark.parametrize(("lhs", "rhs", "precision", "generation", "passes"), [
    ("bfloat16", "bfloat16", None, "v5e", 1.0),
    ("float32", "float32", None, "v6e", 1.0),
    ("float32", "float32", P.DEFAULT, "v7x", 1.0),
    ("float32", "float32", P.HIGH, "v5e", 3.0),
    ("float32", "float32", P.HIGHEST, "v5e", 6.0),
    ("float32", "float32", (P.DEFAULT, P.HIGHEST), "v6e", 6.0),  # the stronger operand precision wins
    ("float32", "bfloat16", None, "v7x", 1.0),  # RPA v3's P.V: an f32 softmax against bf16 values
    ("int8", "int8", None, "v5e", 0.5),
    ("int8", "int8", None, "v6e", 0.5),
    ("int8", "int8", None, "v7x", 1.0),  # no faster int8 rate published for v7x
    ("float8_e4m3fn", "float8_e4m3fn", None, "v7x", 0.5),
    ("float8_e4m3fn", "float8_e4m3fn", None, "v6e", 1.0),  # upcast on a chip with no fp8 MXU
    ("bfloat16", "int8", None, "v5e", 1.0),  # mixed widths: the wider operand's pass
])
def test_mxu_passes_per_dtype_precision_and_generation(lhs, rhs, precision, generation, passes):
    got, why = mxu_passes(lhs, rhs, precision, generation)
    assert got == passes and why


def _f32_dot_kernel(precision):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jax.lax.dot_general(x_ref[...], y_ref[...], (((1,), (0,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32)

    return pl.pallas_call(kernel, out_shape=SDS((128, 128), jnp.float32), grid=(2,),
                          in_specs=[pl.BlockSpec((128, 128), lambda i: (0, 0))] * 2,
                          out_specs=pl.BlockSpec((128, 128), lambda i: (0, 0)))


def test_the_walker_reads_each_dots_precision_from_the_program():
    """The same f32 kernel at DEFAULT and at HIGHEST: one bf16 pass against six, so its MXU time is 6x."""
    x = SDS((128, 128), jnp.float32)
    flops = 2 * 2 * 128**3  # two steps of one 128^3 dot
    fast = kernel_cost(_f32_dot_kernel(None), x, x).calls[0]
    slow = kernel_cost(_f32_dot_kernel(P.HIGHEST), x, x).calls[0]
    assert fast.dots == {("float32", "float32", "DEFAULT"): flops}
    assert slow.dots == {("float32", "float32", "HIGHEST"): flops}
    assert fast.mxu_flops_on("v6e") == flops and slow.mxu_flops_on("v6e") == 6 * flops


def test_vector_work_counts_elements_and_transcendentals():
    def kernel(x_ref, o_ref):
        s = x_ref[...]
        o_ref[...] = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))

    call = pl.pallas_call(kernel, out_shape=SDS((8, 128), jnp.float32), grid=(3,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
    (c,) = kernel_cost(call, SDS((8, 128), jnp.float32)).calls
    assert c.eup_elems == 3 * 8 * 128  # one exp per element on each of the 3 steps
    assert c.vpu_elems == 3 * (8 * 128 + 8 * 128)  # the row max reads every element, the subtract writes each


def test_xla_matmul_by_the_xla_op_rule():
    """XLA's own matmul: its passes at the fitted efficiency or its bytes at the streamed bandwidth, whichever is
    longer, plus one op's fixed cost. v7x's constants in this rule are its measured ones, so its band is the point
    wherever the efficiency does not matter (a bytes-bound op)."""
    v5e, v7x = chip("v5e"), chip("v7x")
    x = SDS((4096, 4096), jnp.float32)
    cost = kernel_cost(lambda a, b: jnp.matmul(a, b, precision=P.HIGH), x, x)
    (op,) = cost.xla
    r = rates("v5e")
    mxu = 3 * 2 * 4096**3 / (v5e.bf16_flops_per_s * r.xla_efficiency)  # HIGH: three bf16 passes
    assert op.bytes == 3 * 4096 * 4096 * 4
    assert cost.seconds(v5e) == pytest.approx(mxu + r.op_fixed_s)
    copy = kernel_cost(lambda a: a * 2, SDS((4096, 4096), jnp.bfloat16))
    one = 2 * 4096 * 4096 * 2 / (v7x.hbm_bytes_per_s * rates("v7x").stream_fraction) + rates("v7x").op_fixed_s
    assert copy.seconds(v7x) == pytest.approx(one)
    assert copy.band(v7x) == pytest.approx((one, one))  # every constant it uses is measured on v7x
    lo, hi = copy.band(chip("v6e"))
    assert lo < copy.seconds(chip("v6e")) < hi  # v6e's copy fraction and op cost are bands


def test_transposes_that_cancel_are_not_charged():
    """The tutorial's transposed-RHS matmul: the caller's swap and the wrapper's swap back cancel (XLA folds them);
    a single transpose is a real copy of both its bytes in and out; so is one whose middle value is read."""
    x = SDS((1024, 1024), jnp.bfloat16)
    pair = kernel_cost(timed("transpose_rhs", 512, 1024, 1024), x, x)
    assert pair.outside_bytes == 0 and len(pair.removed_ops) == 2
    one = kernel_cost(lambda a: a.T * 2, SDS((256, 512), jnp.float32))
    assert any(line.startswith("transpose 1.0 MiB") for line in one.outside_ops)
    kept = kernel_cost(lambda a: (a.T.T, a.T * 2), SDS((256, 512), jnp.float32))
    assert any(line.startswith("transpose") for line in kept.outside_ops)  # the middle value is read: materialized
    assert any("undoes" in line for line in kept.removed_ops)


def test_zero_width_pads_are_not_charged():
    x = SDS((256, 256), jnp.float32)
    none = kernel_cost(lambda a: jnp.pad(a, ((0, 0), (0, 0))) + 1, x)
    assert not any(line.startswith("pad") for line in none.outside_ops)
    some = kernel_cost(lambda a: jnp.pad(a, ((0, 8), (0, 0))) + 1, x)
    assert any(line.startswith("pad") for line in some.outside_ops)


def _in_place(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(kernel, out_shape=SDS((64, 128), jnp.float32), input_output_aliases={0: 0})(x)


def test_an_output_aliased_to_a_donated_argument_is_not_copied():
    x = SDS((64, 128), jnp.float32)
    kept = kernel_cost(_in_place, x)
    donated = kernel_cost(jax.jit(_in_place, donate_argnums=0), x)
    assert kept.outside_bytes == 2 * 64 * 128 * 4  # XLA copies an argument it may not overwrite
    assert donated.outside_bytes == 0 and any("donated" in line for line in donated.removed_ops)


def test_measured_constants_have_no_band_and_unmeasured_ones_do():
    v5e, v6e, v7x = rates_mod.constants("v5e"), rates_mod.constants("v6e"), rates_mod.constants("v7x")
    assert not v5e["step_overhead_s"].is_band and v6e["step_overhead_s"].is_band
    assert not v7x["stream_fraction"].is_band and v5e["stream_fraction"].is_band and v6e["stream_fraction"].is_band
    assert not v7x["op_fixed_s"].is_band and v5e["op_fixed_s"].is_band
    # no generation's point is another generation's measurement
    assert v5e["stream_fraction"].point != v7x["stream_fraction"].point
    fast, slow = rates("v6e", "fast"), rates("v6e", "slow")
    assert fast.stream_fraction > slow.stream_fraction and fast.step_overhead_s < slow.step_overhead_s
    assert fast.xla_efficiency > slow.xla_efficiency and fast.op_fixed_s < slow.op_fixed_s
    with pytest.raises(ValueError, match="v9"):
        rates("v9")
    with pytest.raises(ValueError, match="end must be"):
        rates("v5e", "middle")


def test_a_claim_holds_across_the_band_only_at_both_ends():
    assert holds_across_band((1.0, 1.2, 1.5), (1.1, 1.3, 1.6)) == (True, "at both ends of the band")
    held, why = holds_across_band((1.0, 1.2, 1.5), (1.1, 1.3, 1.4))
    assert not held and "slow end" in why
    held, why = holds_across_band((1.0, 1.4, 1.5), (1.1, 1.3, 1.6))
    assert not held and "point" in why


def test_explain_shows_the_program_and_each_charge():
    x = SDS((1024, 1024), jnp.bfloat16)
    text = explain(timed("transpose_rhs", 512, 1024, 1024), x, x, generation="v5e", hlo=True)
    assert "pallas_call" in text and "transpose" in text  # the jaxpr the model reads
    assert "kernel _kernel grid=(2, 1, 1)" in text
    assert text.count("removed transpose") == 2
    assert "modeled on v5e" in text and "band" in text
    assert "stablehlo" in text or "func.func" in text
