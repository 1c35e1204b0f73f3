"""Demo: a small Qwen3-MoE model from its config, kernelized, one decode step at batch 64.

Prints the kernelize report, how far the logits moved, and the decode-step time against transformers'
eager and grouped_mm experts (an untouched copy of the model runs those, interleaved with the kernelized one: an
inference model's expert weights are packed by kernelize, which those implementations cannot read). Sized for
~20-40 s on 2 CPU cores; no downloads.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEMO_CONFIG: dict[str, Any] = dict(
    vocab_size=1024, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=384, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
    decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=256, norm_topk_prob=True,
)


def run(
    print_fn: Callable[[str], object] = print, *, quick: bool = False, batch: int = 64, reps: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Build, kernelize, compare and time; returns the numbers it printed (`ok`: all checks held)."""
    reps = reps or (3 if quick else 5)
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from kernel_hub import kernelize, kernelize_report, restore
    from kernel_hub.verify.timing import RATIO_CONVENTION, Ratio, format_ratio, interleaved_samples

    t0 = time.perf_counter()
    config = Qwen3MoeConfig(**DEMO_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config).eval().requires_grad_(False)  # inference: frozen weights
        with torch.no_grad():  # expert weights at a realistic scale (init leaves them tiny)
            for name, p in model.named_parameters():
                if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    p.normal_(0.0, 0.02)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, config.vocab_size, (batch, 8), generator=g)
    step = torch.randint(3, config.vocab_size, (batch, 1), generator=g)
    print_fn(f"Qwen3-MoE from config: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
             f"{config.num_experts} experts (top-{config.num_experts_per_tok}, width {config.moe_intermediate_size}), "
             f"random weights; decode batch {batch}")

    def decode_step(m: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return m(step).logits

    with torch.no_grad():
        reference = model(prompt).logits
    default = copy.deepcopy(model)  # transformers' own implementations run on this copy
    report = kernelize_report(kernelize(model))
    print_fn(str(report))
    with torch.no_grad():
        after = model(prompt).logits
    diff = ((after - reference).abs().max() / reference.abs().max()).item()
    print_fn(f"logits vs transformers' default experts: max relative difference {diff:.2e} (f32 tolerance 1e-4)")

    def timed(name: str) -> Callable[[], Any]:
        def fn() -> Any:
            default.set_experts_implementation(name)
            return decode_step(default)
        return fn

    runners = {"eager": timed("eager"), "grouped_mm": timed("grouped_mm"), "kernelized": lambda: decode_step(model)}
    samples = interleaved_samples(runners, repeats=reps)
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    print_fn(f"decode step, batch {batch} (median of {reps}, interleaved; kernelized vs each: {RATIO_CONVENTION}):")
    for name in runners:
        ratio = Ratio.of(samples[name], samples["kernelized"])
        versus = "" if name == "kernelized" else f"   (kernelized {format_ratio(ratio)})"
        print_fn(f"  {name:11s} {med[name]:8.1f} ms{versus}")
    restore(model)
    with torch.no_grad():
        restored = model(prompt).logits
    identical = bool(torch.equal(restored, reference))
    print_fn(f"restore(model): logits bit-identical to before kernelize: {identical}")
    seconds = time.perf_counter() - t0
    ok = bool(report.replaced) and not report.kept and diff <= 1e-4 and identical
    return {
        "ok": ok,
        "replaced": len(report.replaced),
        "kept": len(report.kept),
        "implementation": report.replaced[0].implementation if report.replaced else None,
        "variant": report.replaced[0].variant if report.replaced else None,
        "max_rel_logit_diff": diff,
        "decode_ms": med,
        "restored_identical": identical,
        "seconds": seconds,
        "report": report.to_dict(),
    }


if __name__ == "__main__":
    run()
