"""The compiled-program rule on a scanned program libtpu compiled (tests/tpu/fixtures/scan_v6e.hlo.txt, written by
fixtures/make_scan_fixture.py): the layers' while loop charged body x trip count (read from the loop's bounds), the
cache write that updates the donated cache in place charged by the rows it writes, the layer's read by its slice,
an XLA dot on the scan's stacked weights by its layer's weights."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.client_env import child_env
from tests.tpu_toys import env_or_skip
from tpu_cost_model.hlo_program import parse_module
from tpu_cost_model.xla_compiled import KERNEL_TARGET, NotReadable, aliased_operands, charge_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SCRIPT = FIXTURES / "make_scan_fixture.py"
MOVES_NOTHING = {"parameter", "bitcast", "tuple", "get-tuple-element", "constant", "copy-done"}


def _load(folder: Path = FIXTURES) -> tuple[str, dict]:
    return (folder / "scan_v6e.hlo.txt").read_text(), json.loads((folder / "scan_v6e.json").read_text())


def _loop(text: str):
    module = parse_module(text)
    (loop,) = [i for i in module.entry.instructions if i.opcode == "while"]
    return module, loop, module.computations[loop.attrs["body"].lstrip("%")]


def _cache_write(module, body):
    """The body's fusion whose result is the whole cache: the scatter of the new rows."""
    cache = next(i for i in module.entry.instructions if i.opcode == "parameter").arrays[0]
    (write,) = [i for i in body.instructions if i.opcode == "fusion" and i.arrays[0].dims == cache.dims]
    return write


def _check_loop(text: str, meta: dict) -> None:
    module, loop, body = _loop(text)
    assert "known_trip_count" not in loop.attrs.get("backend_config", "")  # read from the bounds, not stated
    cost = charge_module(module)
    kernels = [i for i in body.instructions if i.opcode == "custom-call"
               and i.attrs.get("custom_call_target", "").strip('"') == KERNEL_TARGET]
    assert len(kernels) == 1 and len(cost.kernels) == meta["layers"]
    counts = Counter(op.name.split()[1] for op in cost.ops)
    kept = [i.name for i in body.instructions if i.opcode not in MOVES_NOTHING and i.opcode != "custom-call"]
    assert kept and all(counts[name] == meta["layers"] for name in kept)


def _check_in_place(text: str, meta: dict) -> None:
    module, _, body = _loop(text)
    cache_bytes = 4 * meta["layers"] * meta["cache_shape"][1] * meta["cache_shape"][2] * meta["lanes"]
    update = 4 * meta["rows"] * meta["lanes"]
    write = _cache_write(module, body)
    assert write.arrays[0].nbytes == cache_bytes and write.arrays[0].memory_space == 0  # the cache, in HBM
    assert 0 in aliased_operands(write)  # libtpu writes into operand 0, the donated cache
    ops = {op.name.split()[1]: op for op in charge_module(module).ops}
    charged = ops[write.name]
    assert "in-place" in charged.name
    assert update <= charged.bytes <= 2 * update + 4096  # the rows (read and written) and their indices
    # a layer's read through a dynamic slice moves that layer, not the whole cache
    reads = [i for i in body.instructions if i.opcode == "fusion" and write.name in i.operands]
    assert reads and all(ops[i.name].bytes <= cache_bytes // meta["layers"] + 4096 for i in reads)
    # the XLA dot on the scan's stacked weights reads its layer's weights (a slice in a nested fusion), not all
    layer_weights = 4 * meta["lanes"] * meta["lanes"]
    (dot,) = [op for op in ops.values() if op.dots]
    assert layer_weights <= dot.bytes <= layer_weights + 2 * 4 * meta["rows"] * meta["lanes"] + 4096


def test_the_loop_is_charged_once_per_layer():
    _check_loop(*_load())


def test_the_trip_count_follows_the_loop_bound_or_its_stated_count():
    text, _ = _load()
    module, loop, _ = _loop(text)
    cond = module.computations[loop.attrs["condition"].lstrip("%")]
    (bound,) = [i for i in cond.instructions if i.opcode == "constant"]
    three = re.sub(rf"(%{re.escape(bound.name)} = [^\n]*constant\()6\)", r"\g<1>3)", text)
    assert three != text and len(charge_module(parse_module(three)).kernels) == 3
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"%{loop.name} = "))
    stated = text.replace(line, line + ', backend_config={"known_trip_count":{"n":"4"}}')
    assert len(charge_module(parse_module(stated)).kernels) == 4
    root = next(i for i in cond.instructions if i.root)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"ROOT %{root.name} = "))
    unbounded = text.replace(line, line.replace("direction=LT", "direction=NE"))
    assert unbounded != text
    with pytest.raises(NotReadable, match="trip count"):
        charge_module(parse_module(unbounded))


def test_an_in_place_cache_write_is_charged_by_its_rows():
    _check_in_place(*_load())


def test_a_write_libtpu_does_not_alias_is_charged_whole():
    text, _ = _load()
    module, _, body = _loop(text)
    write = _cache_write(module, body)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"%{write.name} = "))
    unmarked = text.replace(line, re.sub(r'\{"indices":\["0","\d+"\]\}', "", line))  # operand 0 not aliased
    assert unmarked != text
    ops = {op.name.split()[1]: op for op in charge_module(parse_module(unmarked)).ops}
    cache_bytes = write.arrays[0].nbytes
    assert "in-place" not in ops[write.name].name and ops[write.name].bytes >= 2 * cache_bytes


def test_a_fresh_compile_of_the_scan(tmp_path):
    """In the TPU environment: the same toy compiled now; the loop and the in-place write are charged alike."""
    env = env_or_skip()
    done = subprocess.run([str(env.python), str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=child_env(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3",
                                        ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    _check_loop(*_load(tmp_path))
    _check_in_place(*_load(tmp_path))
