"""One rank of tests/layers/test_moe_distributed.py: a tiny MoE model saved to MODEL_DIR, loaded with transformers' own
expert-parallel and tensor-parallel plans (DistributedConfig, torch.distributed with gloo on CPU), kernelized, run,
restored; the logits of each step beside the unsharded model's. Prints one JSON line; the test owns the verdicts.

Environment: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's), MODEL_DIR, PLANS (JSON list of
[label, DistributedConfig kwargs]).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

#: Token ids of the check (two sequences of six).
IDS = torch.tensor([[1, 5, 9, 17, 33, 65], [2, 3, 7, 11, 13, 99]])


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


def count_kernel_calls(model: Any) -> list[int]:
    """Wrap every kernelized expert block's kernel call with a counter (one list cell per block)."""
    from kernel_hub.layers.kinds.experts.transformers import HOOK_ATTR

    counts: list[int] = []
    for module in model.modules():
        hook = module.__dict__.get(HOOK_ATTR)
        if hook is None or hook.call is None:
            continue
        counts.append(0)
        original, cell = hook.call, len(counts) - 1

        def counted(*args: Any, original=original, cell=cell) -> Any:
            counts[cell] += 1
            return original(*args)

        hook.call = counted
    return counts


def main() -> dict[str, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    import kernel_hub as kh

    path = os.environ["MODEL_DIR"]
    reference = logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    out: dict[str, Any] = {"rank": int(os.environ["RANK"]), "plans": {}}
    for label, kwargs in json.loads(os.environ["PLANS"]):
        model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(**kwargs),
                                                     dtype=torch.float32).eval()
        experts = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
        weight = experts[0].gate_up_proj
        q_proj = next(m for name, m in model.named_modules() if name.endswith("self_attn.q_proj")).weight
        q_rows = q_proj.to_local().shape[0] if hasattr(q_proj, "to_local") else q_proj.shape[0]
        sharded = logits(model)
        report = kh.kernelize_report(
            kh.kernelize(model, mapping={"attention": None, "rms_norm": None}))  # pins the MoE path
        calls = count_kernel_calls(model)
        kernelized = logits(model)
        restored = kh.restore(model)
        after = logits(model)
        quantized = kh.kernelize_report(
            kh.kernelize(model, mapping={"attention": None, "rms_norm": None}, quantize="int8"))
        int8_logits = logits(model)
        kh.restore(model)
        after_int8 = logits(model)
        out["plans"][label] = {
            "weight_type": type(weight).__name__,
            "global_shape": list(weight.shape),
            "local_shape": list(weight.to_local().shape) if hasattr(weight, "to_local") else list(weight.shape),
            "num_experts_attr": getattr(experts[0], "num_experts", None),
            "q_proj_local_rows": q_rows,  # attention's q projection on this rank: sharded under tensor parallelism
            "q_proj_rows": model.config.num_attention_heads * model.config.head_dim,
            "replaced": [r.layer for r in report.replaced],
            "kept": [[k.layer, k.reason] for k in report.kept],
            "validation_errors": [r.max_error for r in report.replaced],
            "kernel_calls": calls,
            "sharded_vs_unsharded": (sharded - reference).abs().max().item(),
            "kernelized_vs_unsharded": (kernelized - reference).abs().max().item(),
            "kernelized_vs_sharded": (kernelized - sharded).abs().max().item(),
            "restored": restored,
            "restored_vs_sharded": (after - sharded).abs().max().item(),
            "scale": reference.abs().max().item(),
            "int8": [[r.quantized, r.max_error, r.tolerance, r.why] for r in quantized.replaced],
            "int8_kept": [[k.layer, k.reason] for k in quantized.kept],
            "int8_vs_unsharded": (int8_logits - reference).abs().max().item(),
            "restored_after_int8_vs_sharded": (after_int8 - sharded).abs().max().item(),
        }
    return out


def shut_down() -> None:
    """Leave the process group on every rank together: gloo's threads left running at interpreter exit abort it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    result = main()
    shut_down()
    print("RESULT " + json.dumps(result), flush=True)
