"""The compiled-program rule on libtpu's sliced prefetch of a kernel operand into VMEM (trimmed from Gemma 4's decode
step compiled for v6e at batch 1, where the whole stacked q/k/v projection was handed to the attention front): each
async slice moves the piece it takes, with no fixed cost (a DMA beside the work), the ConcatBitcast that joins the
pieces moves nothing, and a static slice reads only its output's worth of its operand."""

from __future__ import annotations

from pathlib import Path

from tpu_cost_model.hlo_program import parse_module
from tpu_cost_model.xla_compiled import charge_module

TEXT = (Path(__file__).parent / "fixtures" / "sliced_prefetch_v6e.hlo.txt").read_text()
PIECE, STACK = 4194304, 5 * 2816 * 1024 * 2


def _ops() -> dict:
    return {op.name.split()[1]: op for op in charge_module(parse_module(TEXT)).ops}


def test_each_async_slice_moves_its_piece_without_a_fixed_cost():
    ops = _ops()
    for name in ("slice.184", "slice.185"):
        assert ops[name].bytes == PIECE  # read from HBM; written to VMEM (no HBM bytes)
        assert not ops[name].fixed and ops[name].free is None


def test_the_joined_pieces_and_a_static_slice():
    ops = _ops()
    assert "custom-call" not in " ".join(op.name for op in charge_module(parse_module(TEXT)).charged)
    assert ops["slice.9"].bytes == 2 * STACK  # all of it read and written: the output is the whole
    half = TEXT.replace("ROOT %slice.9 = bf16[5,2816,1024]", "ROOT %slice.9 = bf16[5,2816,512]").replace(
        "slice={[0:5], [0:2816], [0:1024]}", "slice={[0:5], [0:2816], [0:512]}").replace(
        "-> bf16[5,2816,1024] {", "-> bf16[5,2816,512] {")
    charged = {op.name.split()[1]: op for op in charge_module(parse_module(half)).ops}
    assert charged["slice.9"].bytes == STACK  # half read, half written: not the whole operand read
