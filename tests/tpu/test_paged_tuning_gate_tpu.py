"""The compile gate records which tuned-table entry each ragged paged attention case used, and the real compiler
takes the 8k entries where they are most at risk: the v5e, v6e and v7x entries for Qwen3-30B-A3B's 8k decode on
their chips, and on v6e and v7x (v7x has half a v6e's VMEM, so a v6e choice is no proof for it) the model geometry
whose entry comes nearest its chip's VMEM budget, and the fallback with its reason for a shape the table lacks.

Every entry's VMEM estimate fits its chip (kernels/pallas/flash_attention/tests/test_paged_tuning.py) and the tuner
compiled each entry when it wrote the table; compiling the entry nearest the budget here checks the estimate against
the compiler on every run, at a third of the cost of compiling all three (10-40 s each on one core).

An entry is compiled through the gate's mixed-batch case: that case runs the entry's whole block (block_q query rows
beside its pages per step), while a decode batch runs one query row per item with the same pages, a subset of the
same VMEM; the decode use of an entry is the first test's.
Skipped, with the reason, only where the TPU environment is missing (`make test` creates it)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.compile_gate import gate
from kernel_hub.tpu.package import folder_package, import_verified
from tests.bench_scripts import PAGED_TUNED_TABLE, load_file
from tests.tpu_toys import env_or_skip

ROOT = Path(__file__).resolve().parents[2]
FA = ROOT / "kernels/pallas/flash_attention"
CASE = "fwd:paged:qwen3_30b_a3b_decode_b64_8k:bf16"
SMALL = "fwd:paged:mixed_gqa_window:bf16"  # 4/2 heads x 128, pages of 16: no entry anywhere
GEOMETRY = {"qwen3_30b_a3b": (32, 4, 128), "gemma4_26b_a4b_sliding": (16, 8, 256),
            "gemma4_26b_a4b_global": (16, 2, 512)}


@functools.cache
def _tuned() -> dict:
    return load_file("paged_tuned_table_data", PAGED_TUNED_TABLE).TUNED


def gate_cases(gen: str) -> list[tuple[str, tuple]]:
    """(case name, tuned key) of each model geometry's mixed-batch gate case at 8192 positions (it runs the
    entry's whole block) whose key has an entry."""
    keys = {model: (gen, 128, "bfloat16", "bfloat16", hq, hkv, d, 8192) for model, (hq, hkv, d) in GEOMETRY.items()}
    return [(f"fwd:paged:{model}_mixed_4x496_60x1:bf16", key) for model, key in keys.items() if key in _tuned()]


@functools.cache
def _kernel_modules() -> tuple[ModuleType, ModuleType]:
    """The flash-attention build's config and paged_tuning modules, imported once through the verified loader."""
    fa = import_verified(folder_package(FA))
    return tuple(importlib.import_module(f"{fa.__name__}.{m}") for m in ("config", "paged_tuning"))


def nearest_budget(gen: str) -> tuple[str, tuple, float]:
    """(case name, tuned key, share of the budget) of the gate case whose entry's VMEM estimate comes nearest the
    chip's tile budget (the kernel's own estimate and budget, as test_paged_tuning checks them)."""
    config, tuning = _kernel_modules()
    budget = config.vmem_plan(chip(gen).device_kind)[0] * 5 // 8
    table = _tuned()
    shares = [(name, key, tuning.entry_vmem_bytes(key, table[key].block_q, table[key].pages_per_block, 2) / budget)
              for name, key in gate_cases(gen)]
    return max(shares, key=lambda s: s[2])


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


def _nearest_entry_compiles(env, fresh_cache, gen) -> None:
    """The model geometry whose 8k entry is nearest the chip's VMEM budget compiles its mixed-batch case with that
    entry on its generation."""
    name, key, _ = nearest_budget(gen)
    report = gate.compile_matrix(folder_package(FA), [gen], names=[name], env=env)
    assert report.passed, str(report)
    (case,) = report.cases
    text = "/".join(map(str, key))
    assert case.name == name and case.tuning.endswith(f"(tuned {text})"), (case.name, case.tuning)


def test_each_chip_has_every_geometry_s_8k_entry_to_choose_from() -> None:
    """The nearest entry is chosen among all three model geometries on both chips, each inside its budget."""
    for gen in ("v6e", "v7x"):
        assert len(gate_cases(gen)) == len(GEOMETRY), (gen, gate_cases(gen))
        assert 0.5 < nearest_budget(gen)[2] <= 1.0, gen


# One class per generation: the suite's workers take a module or a class each (--dist loadscope), so the two
# generations' compiles (a minute or two each) run side by side.
class TestNearestEntryOnV6e:
    def test_the_entry_nearest_the_vmem_budget_compiles(self, env, fresh_cache) -> None:
        _nearest_entry_compiles(env, fresh_cache, "v6e")


class TestNearestEntryOnV7x:
    def test_the_entry_nearest_the_vmem_budget_compiles(self, env, fresh_cache) -> None:
        _nearest_entry_compiles(env, fresh_cache, "v7x")
