"""The compiled-program rule for XLA's ops around the kernels: the HLO parser (hlo_program.py) on a program libtpu
compiled (tests/tpu/fixtures/toy_v6e.hlo.txt, written by fixtures/make_hlo_fixture.py), the charge of what that
program keeps (xla_compiled.py), and in the TPU environment the same on a fresh compile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kernel_hub.tpu.chips import chip
from tests.client_env import child_env
from tests.tpu_toys import env_or_skip
from tpu_cost_model.hlo_program import VMEM, HloParseError, parse_module
from tpu_cost_model.xla_compiled import KERNEL_TARGET, charge_module, side_by_side
from tpu_cost_model.xla_ops import XlaOp

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SCRIPT = FIXTURES / "make_hlo_fixture.py"
#: Opcodes that move no data: an op the charge lists as charged is never one of them.
MOVES_NOTHING = {"parameter", "bitcast", "tuple", "get-tuple-element", "constant", "copy-done", "custom-call"}


def _load(stem: str, folder: Path = FIXTURES) -> tuple[str, dict]:
    return (folder / f"{stem}.hlo.txt").read_text(), json.loads((folder / f"{stem}.json").read_text())


def _check_charge(text: str, meta: dict) -> None:
    """What the charge lists is exactly the compiled entry's data-moving instructions, each with its HBM bytes."""
    module = parse_module(text)
    entry = module.entry
    cost = charge_module(module)
    kernels = [i.name for i in entry.instructions
               if i.opcode == "custom-call" and i.attrs.get("custom_call_target", "").strip('"') == KERNEL_TARGET]
    assert cost.kernels == kernels and len(kernels) == meta["kernels"]
    kept = [i for i in entry.instructions if i.opcode not in MOVES_NOTHING]
    charged = cost.charged
    assert [op.name.split()[1] for op in charged] == [i.name for i in kept]
    shapes = {i.name: i for i in entry.instructions}
    for op, inst in zip(charged, kept, strict=True):
        arrays = [*inst.arrays, *(a for o in inst.operands for a in shapes[o].arrays)]
        assert op.bytes == sum(a.nbytes for a in arrays if a.memory_space != VMEM)
    # libtpu fuses the scale into the transpose and folds the select on a constant predicate: fewer ops than traced
    assert 0 < len(charged) < len(meta["jaxpr_charged"])
    assert "select_n" in meta["jaxpr_charged"] and not any(i.opcode == "select" for i in entry.instructions)


def test_the_parser_reads_a_compiled_program():
    text, meta = _load("toy_v6e")
    module = parse_module(text)
    entry = module.entry
    (param,) = [i for i in entry.instructions if i.opcode == "parameter"]
    assert param.arrays[0].dtype == "f32" and param.arrays[0].dims == tuple(meta["shape"])
    assert param.arrays[0].nbytes == 4 * meta["shape"][0] * meta["shape"][1] and param.arrays[0].memory_space == 0
    fusions = [i for i in entry.instructions if i.opcode == "fusion"]
    assert fusions and all(i.attrs["kind"].startswith("k") and i.called()[0] in module.computations for i in fusions)
    for inst in entry.instructions:
        assert all(o in {i.name for i in entry.instructions} for o in inst.operands), inst
    assert sum(i.root for i in entry.instructions) == 1
    assert any(a.memory_space == VMEM for i in entry.instructions for a in i.arrays)  # libtpu placed some in VMEM


def test_the_charge_counts_only_what_the_compiled_program_keeps():
    _check_charge(*_load("toy_v6e"))


def test_a_broken_text_is_refused_with_its_line():
    text, _ = _load("toy_v6e")
    with pytest.raises(HloParseError, match="HloModule"):
        parse_module("ENTRY %x {\n}")
    broken = text.replace(" parameter(0)", " parameter(0", 1)
    with pytest.raises(HloParseError, match="line"):
        parse_module(broken)
    with pytest.raises(HloParseError, match="ENTRY"):
        parse_module(text.replace("ENTRY %", "%", 1))


def test_side_by_side_shows_both_rules_and_their_totals():
    c = chip("v6e")
    jaxpr = [XlaOp("transpose", 1 << 20), XlaOp("mul", 1 << 20)]
    compiled = [XlaOp("fusion f kLoop", 1 << 20)]
    text = side_by_side(jaxpr, compiled, c)
    assert "transpose" in text and "fusion f kLoop" in text and text.count("total") == 2
    assert f"total {sum(op.seconds(c) for op in jaxpr) * 1e6:.2f} us" in text
    assert side_by_side(jaxpr, None, c).splitlines()[-1].rstrip().endswith("| -")


def test_a_fresh_compile_without_a_kernel_keeps_fewer_ops_than_the_jaxpr(tmp_path):
    """In the TPU environment: a transpose times a scale and a select on a constant predicate, nothing else,
    compiled for a mock v6e; the charge lists exactly what the compiled program keeps, fewer ops than traced."""
    env = env_or_skip()
    for flags in (["--no-kernel"], []):
        done = subprocess.run([str(env.python), str(SCRIPT), str(tmp_path), *flags], capture_output=True, text=True,
                              timeout=600, env=child_env(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3",
                                                         ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
        assert done.returncode == 0, done.stderr[-2000:]
    text, meta = _load("toy_v6e_no_kernel", tmp_path)
    assert meta["kernels"] == 0
    _check_charge(text, meta)
    _check_charge(*_load("toy_v6e", tmp_path))


def test_a_dot_with_a_boolean_operand_is_charged_as_one_pass():
    """A one-hot matrix built from a comparison reaches the MXU as a pred operand: charged, never refused."""
    text = """HloModule one_hot, entry_computation_layout={(pred[8,128]{1,0}, bf16[128,256]{1,0})->f32[8,256]{1,0}}

ENTRY %main (p0: pred[8,128], p1: bf16[128,256]) -> f32[8,256] {
  %p0 = pred[8,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    (op,) = charge_module(parse_module(text)).charged
    assert op.dots == {("bool", "bfloat16", "DEFAULT"): 2 * 8 * 128 * 256}
    assert op.mxu_flops_on("v6e") == 2 * 8 * 128 * 256
    assert op.seconds(chip("v6e")) > 0
