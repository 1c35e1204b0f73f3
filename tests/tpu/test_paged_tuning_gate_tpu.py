"""The compile gate records which tuned-table entry each ragged paged attention case used, and every 8k entry of the
table compiles on its own generation through the gate: the v5e, v6e and v7x entries for Qwen3-30B-A3B's 8k decode on
their chips, every model geometry's entry on v6e and v7x (v7x has half a v6e's VMEM, so a v6e choice is no proof for
it), and the fallback with its reason for a shape the table lacks.

An entry is compiled through the gate's mixed-batch case: that case runs the entry's whole block (block_q query rows
beside its pages per step), while a decode batch runs one query row per item with the same pages, a subset of the
same VMEM; the decode use of an entry is the first test's. Each mixed compile takes about a minute on one core.
Skipped, with the reason, only where the TPU environment is missing (`make test` creates it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernel_hub.tpu.compile_gate import gate
from kernel_hub.tpu.package import folder_package
from tests.tpu_toys import env_or_skip

ROOT = Path(__file__).resolve().parents[2]
FA = ROOT / "kernels/pallas/flash_attention"
CASE = "fwd:paged:qwen3_30b_a3b_decode_b64_8k:bf16"
SMALL = "fwd:paged:mixed_gqa_window:bf16"  # 4/2 heads x 128, pages of 16: no entry anywhere
GEOMETRY = {"qwen3_30b_a3b": (32, 4, 128), "gemma4_26b_a4b_sliding": (16, 8, 256),
            "gemma4_26b_a4b_global": (16, 2, 512)}


def _tuned() -> dict:
    path = FA / "flash_attention/paged_tuned_table.py"
    spec = importlib.util.spec_from_file_location("paged_tuned_table_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TUNED


def gate_cases(gen: str) -> list[tuple[str, str]]:
    """(case name, tuned key) of each model geometry's mixed-batch gate case at 8192 positions (it runs the
    entry's whole block) whose key has an entry."""
    out = []
    for model, (hq, hkv, d) in GEOMETRY.items():
        key = (gen, 128, "bfloat16", "bfloat16", hq, hkv, d, 8192)
        if key in _tuned():
            text = "/".join(map(str, key))
            out.append((f"fwd:paged:{model}_mixed_4x496_60x1:bf16", text))
    return out


@pytest.fixture(scope="module")
def env():
    return env_or_skip()


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """One empty compile cache for the module: the second test reuses the first's Qwen3 decode results."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNEL_HUB_CACHE", str(tmp_path_factory.mktemp("gate_cache")))
        mp.delenv("FLASH_ATTENTION_PAGED_BLOCKS", raising=False)
        yield


def test_the_gate_records_the_entry_each_paged_case_used(env, fresh_cache) -> None:
    report = gate.compile_matrix(folder_package(FA), ["v5e", "v6e", "v7x"], names=[CASE], env=env)
    small = gate.compile_matrix(folder_package(FA), ["v6e"], names=[SMALL], env=env)
    assert report.passed and small.passed, f"{report}\n{small}"
    tuning = {(c.name, c.generation): c.tuning for c in [*report.cases, *small.cases]}
    for gen in ("v5e", "v6e", "v7x"):
        got = tuning[(CASE, gen)]
        assert got.endswith(f"(tuned {gen}/128/bfloat16/bfloat16/32/4/128/8192)"), tuning
        assert got.startswith("block_q 1, ")  # a decode batch runs one token per item
    assert "(fallback: no tuned entry for v6e/16/bfloat16/bfloat16/4/2/128/" in tuning[(SMALL, "v6e")], tuning


def _every_8k_entry_compiles(env, fresh_cache, gen) -> None:
    """Each model geometry with an 8k entry compiles its mixed-batch case with that entry on its generation."""
    cases = dict(gate_cases(gen))
    assert cases, f"no 8k entry for {gen}"
    report = gate.compile_matrix(folder_package(FA), [gen], names=sorted(cases), env=env)
    assert report.passed, str(report)
    assert sorted(c.name for c in report.cases) == sorted(cases)
    for c in report.cases:
        assert c.tuning.endswith(f"(tuned {cases[c.name]})"), (c.name, c.tuning)


# One class per generation: the suite's workers take a module or a class each (--dist loadscope), so the two
# generations' compiles (minutes each) run side by side.
class TestEvery8kEntryOnV6e:
    def test_every_8k_entry_compiles_on_its_generation(self, env, fresh_cache) -> None:
        _every_8k_entry_compiles(env, fresh_cache, "v6e")


class TestEvery8kEntryOnV7x:
    def test_every_8k_entry_compiles_on_its_generation(self, env, fresh_cache) -> None:
        _every_8k_entry_compiles(env, fresh_cache, "v7x")
