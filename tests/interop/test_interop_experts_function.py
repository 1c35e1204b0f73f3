"""Hugging Face's recipe for a hub experts kernel, with ours: PyPI `kernels` 0.19.1 loads kernel-hub/ragged-dot-tpu
from `kernel-hub serve` (loopback), `ALL_EXPERTS_FUNCTIONS.register("kernel_hub", k.experts_forward)`, and
`from_pretrained(..., experts_implementation="kernel_hub")` runs every expert block of a tiny model on it, with
logits within tolerance of the same checkpoint under transformers' default experts implementation."""

from __future__ import annotations

from pathlib import Path

from tests.hub_interop import KERNELS

REPO = "kernel-hub/ragged-dot-tpu"
INTEROP_KERNELS = {REPO: KERNELS / "ragged_dot"}  # published by the interop_hub fixture (tests/conftest.py)

SCRIPT = """
import json, tempfile, torch, kernels
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from kernel_hub.report import models

k = kernels.get_kernel(REPO, version=1)
ALL_EXPERTS_FUNCTIONS.register("kernel_hub", k.experts_forward)
out = {"file": k.__file__, "families": {}}
for fam in ("qwen3_moe", "gpt_oss", "gemma4"):
    for dtype in (torch.float32, torch.bfloat16):
        folder = tempfile.mkdtemp()
        tiny = models.tiny_model(fam, dtype=dtype)
        tiny.save_pretrained(folder)
        cls = type(tiny)
        default = cls.from_pretrained(folder, dtype=dtype).eval()
        ours = cls.from_pretrained(folder, dtype=dtype, experts_implementation="kernel_hub").eval()
        ids = torch.randint(3, tiny.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
        k.hf_experts.DISPATCH._dispatch._last.set((None, None))  # forget earlier calls (the trace is a ContextVar)
        with torch.no_grad():
            ref = default(input_ids=ids).logits.float()
            before = k.hf_experts.DISPATCH.last_implementation()[0]
            got = ours(input_ids=ids).logits.float()
        out["families"][f"{fam}-{str(dtype).removeprefix('torch.')}"] = {
            "default": default.config._experts_implementation, "impl": ours.config._experts_implementation,
            "ran_before": before, "ran": k.hf_experts.DISPATCH.last_implementation()[0],
            "err": ((got - ref).abs().max() / ref.abs().max()).item(), "nan": bool(got.isnan().any()),
            "same": bool(torch.equal(got, ref))}
print(json.dumps(out))
"""


def test_hf_recipe_registers_our_experts_forward_and_from_pretrained_runs_it(interop_hub) -> None:
    res = interop_hub.run(SCRIPT, REPO=REPO)
    assert "/build/torch-cpu/" in Path(res["file"]).as_posix()  # HF kernels loaded our torch-cpu build
    rows = res["families"]
    assert len(rows) == 6
    for case, row in rows.items():
        assert row["impl"] == "kernel_hub" and row["default"] != "kernel_hub", (case, row)
        assert row["ran_before"] is None and row["ran"] == "torch", (case, row)  # our experts_forward served it
        assert not row["nan"], (case, row)
        if case.endswith("float32"):  # grouped sums in another order (bit-equal on some CPUs): within f32 rounding
            assert row["err"] <= 1e-4, (case, row)
        else:  # bf16: each op rounds to bf16 as transformers' does; the logits may agree bit for bit
            assert row["err"] <= 1e-2, (case, row)
    print({case: f"{row['err']:.2e}" for case, row in rows.items()})
