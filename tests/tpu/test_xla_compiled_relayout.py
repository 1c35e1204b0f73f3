"""The compiled-program rule on a layer's weights read out of a stack through a relayout: libtpu (v7x) nests a copy
fusion between the stack in HBM's tiling and the dynamic slice the dot takes; the fusion is evaluated where the slice
reads, so the dot fusion moves the layer's weights, not the stack. Its control: a relayout whose whole output is
used moves the whole. And a kernel whose input slice XLA fused into it counts as the kernel."""

from __future__ import annotations

from pathlib import Path

from tpu_cost_model.hlo_program import parse_module
from tpu_cost_model.xla_compiled import charge_module

#: Trimmed from the decode step libtpu compiled for v7x (the q/k/v projection on the scan's stacked weights).
SLICED = (Path(__file__).parent / "fixtures" / "relayout_v7x.hlo.txt").read_text()

X, LAYER, OUT, STACK = 64 * 2048 * 2, 2048 * 768 * 2, 64 * 768 * 2, 48 * 2048 * 768 * 2


def _charged(text: str) -> dict[str, int]:
    return {op.name.split()[1]: op.bytes for op in charge_module(parse_module(text)).ops}


def test_a_slice_through_a_relayout_moves_the_layer_only():
    assert _charged(SLICED)["fusion.100"] == X + LAYER + OUT + 4  # the s32 layer index too


def test_a_relayout_used_whole_moves_the_whole():
    whole = SLICED.replace(
        "  %dynamic-slice.22 = bf16[1,2048,768]{2,1,0:T(8,128)(2,1)} dynamic-slice(%fusion.117, %param_1.893, "
        "%constant.528, %constant.528), dynamic_slice_sizes={1,2048,768}\n", "").replace(
        "bitcast(%dynamic-slice.22)", "reduce-precision(%fusion.117), exponent_bits=8, mantissa_bits=7")
    assert _charged(whole)["fusion.100"] == X + STACK + OUT + 4


def test_a_kernel_with_a_fused_input_is_a_kernel_not_glue():
    """A Pallas call that lets XLA fuse its weight's slice in (allow_input_fusion) compiles to a kCustom fusion whose
    root is the kernel: it is matched to the walk's kernel, and no XLA op is charged for it or its slice."""
    text = (Path(__file__).parent / "fixtures" / "fused_kernel_input_v6e.hlo.txt").read_text()
    cost = charge_module(parse_module(text))
    assert cost.kernels == ["route.6"] and cost.charged == []
