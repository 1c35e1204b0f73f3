"""The report's family table has one "replaced / kept" column per layer kind, RMSNorm included, titled as each kind
declares."""

from __future__ import annotations

import subprocess
import sys

from kernel_hub.report.html import families_section, family_kinds
from kernel_hub.report.schema import FamilyRow


def _row(**counts) -> FamilyRow:
    return FamilyRow(family="qwen3_moe", library="transformers", kind="moe", status="partial",
                     replaced={"moe_experts": 2, "attention": 2, "rms_norm": 9}, kept=counts,
                     reasons=["rms_norm: Gemma4RMSNorm has no 1-D weight"], max_layer_error=1e-6,
                     output_error=1e-6, restored=True, seconds=1.0)


def test_family_table_has_an_rms_norm_column_with_its_counts():
    html = families_section([_row(rms_norm=4)])
    assert "<th>RMSNorm replaced / kept</th>" in html
    assert "9 / 4" in html and "2 / 0" in html
    assert family_kinds([_row()]) == ["moe_experts", "attention", "rms_norm"]


def test_a_kind_the_table_does_not_know_gets_its_own_column():
    assert family_kinds([_row(rotary=3)])[-1] == "rotary"
    assert "<th>rotary replaced / kept</th>" in families_section([_row(rotary=3)])


def test_the_titles_are_the_kinds_own_and_reading_them_imports_no_framework():
    code = ("import sys; from kernel_hub.report.html import families_section; "
            "from kernel_hub.layers.kinds import BUILTIN_KINDS; "
            "print([k.title for k in BUILTIN_KINDS], sorted(m for m in ('torch', 'jax', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['experts', 'attention', 'RMSNorm'] []"
