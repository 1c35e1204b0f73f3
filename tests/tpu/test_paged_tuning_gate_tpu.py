"""The compile gate records which tuned-table entry each ragged paged attention case used: the shipped v5e entry for
Qwen3-30B-A3B's 8k decode on v5e (compiled there), and the fallback with its reason on a chip the table lacks.
Skipped, with the reason, only where the TPU environment is missing (`make test` creates it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub.tpu.compile_gate import gate
from kernel_hub.tpu.package import folder_package
from tests.tpu_toys import env_or_skip

ROOT = Path(__file__).resolve().parents[2]
CASE = "fwd:paged:qwen3_30b_a3b_decode_b64_8k:bf16"
KEY = "v5e/128/bfloat16/bfloat16/32/4/128/8192"


@pytest.fixture(scope="module")
def env():
    return env_or_skip()


def test_the_gate_records_the_entry_each_paged_case_used(env, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("FLASH_ATTENTION_PAGED_BLOCKS", raising=False)
    report = gate.compile_matrix(folder_package(ROOT / "kernels/pallas/flash_attention"), ["v5e", "v6e"],
                                 names=[CASE], env=env)
    assert report.passed, str(report)
    tuning = {c.generation: c.tuning for c in report.cases}
    assert tuning["v5e"].endswith(f"(tuned {KEY})"), tuning
    assert tuning["v5e"].startswith("block_q 1, ")  # a decode batch runs one token per item
    assert "(fallback: no tuned entry for v6e/128/bfloat16/bfloat16/32/4/128/8192;" in tuning["v6e"], tuning
