"""How many device calls one decode step of a transformers model makes when run op by op (TorchTPU's eager mode):
the aten ops (and custom ops) a tiny Qwen3-MoE / Gemma 4 text model dispatches for one new token on CPU, counted
with torch's dispatch mode, per layer and outside the layers, scaled to the real depth; before and after
`kh.kernelize(model)`.

    python bench/decode_op_count.py [--json]

Each dispatched op is one device call on an op-by-op backend; a compiled step is one call. Views and metadata ops
(view, reshape, t, expand, detach, ...) are counted apart: on an op-by-op device they are usually free.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: Ops that only change a tensor's metadata (no device work on a lazy / op-by-op backend).
VIEWS = {"view", "_unsafe_view", "reshape", "t", "transpose", "expand", "detach", "alias", "unsqueeze", "squeeze",
         "permute", "slice", "select", "as_strided", "_reshape_alias", "unbind", "split", "split_with_sizes",
         "lift_fresh", "clone", "contiguous", "empty", "empty_like", "new_empty", "_to_copy", "lift_fresh_copy",
         "sym_size", "sym_numel", "sym_stride", "is_same_size", "result_type"}
#: Real depth: layers (Gemma: groups of 5 sliding + 1 global).
REAL = {"qwen3_30b_a3b": 48, "gemma4_26b_a4b": 30}


def tiny(name: str, layers: int):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if name == "qwen3_30b_a3b":
        cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                             num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                             num_experts=16, num_experts_per_tok=2, norm_topk_prob=True)
        model = Qwen3MoeForCausalLM(cfg)
    else:
        types = (["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6)
        cfg = Gemma4TextConfig(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=layers,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                               num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=24,
                               layer_types=types, enable_moe_block=True, num_experts=16, top_k_experts=2,
                               moe_intermediate_size=32, hidden_size_per_layer_input=0, vocab_size_per_layer_input=256,
                               final_logit_softcapping=30.0)
        model = Gemma4ForCausalLM(cfg)
    counted_sdpa()
    model.set_attn_implementation("counted_sdpa")
    return model.eval()


#: The regions `kh.kernelize` replaces with one kernel call each on a TorchTPU model (its torch-tpu builds wrap the
#: JAX kernel as one custom op): the experts block, every RMSNorm, the attention function.
REGIONS = ("experts", "rms_norm", "attention")


def _region(module) -> str | None:
    name = type(module).__name__
    return "experts" if name.endswith("Experts") else "rms_norm" if name.endswith("RMSNorm") else None


def count_step(model, batch: int = 2, prompt: int = 5) -> tuple[Counter, Counter, Counter]:
    """(ops, ops inside each replaceable region, invocations of each region) of one decode step after a prompt
    (StaticCache, greedy: the model's forward for one new token)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import StaticCache

    stack: list[str] = []

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.inside, self.calls = Counter(), Counter(), Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.ops[name] += 1
            if stack and name not in VIEWS:
                self.inside[stack[0]] += 1
            return func(*args, **(kwargs or {}))

    mode = Count()

    def enter(region):
        def hook(*_):
            if not stack:
                mode.calls[region] += 1
            stack.append(region)
        return hook

    def leave(*_):
        stack.pop()

    _HOOKS["attention"] = (enter("attention"), leave)
    for module in model.modules():
        region = _region(module)
        if region:
            module.register_forward_pre_hook(enter(region))
            module.register_forward_hook(leave)
    ids = torch.randint(0, 256, (batch, prompt))
    cache = StaticCache(config=model.config, max_cache_len=prompt + 4)
    with torch.no_grad():
        out = model(ids, cache=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        mode.calls.clear()
        with mode:
            model(nxt, cache=cache, use_cache=True, cache_position=torch.tensor([prompt]))
    return mode.ops, mode.inside, mode.calls


def counted_sdpa():
    """sdpa, tagged as the attention region (registered as "counted_sdpa" in transformers' AttentionInterface)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def forward(module, *args, **kwargs):
        enter, leave = _HOOKS["attention"]
        enter()
        try:
            return sdpa_attention_forward(module, *args, **kwargs)
        finally:
            leave()

    AttentionInterface.register("counted_sdpa", forward)


_HOOKS: dict = {}


def device_ops(ops: Counter) -> int:
    return sum(n for op, n in ops.items() if op not in VIEWS)


def per_model(name: str) -> dict:
    """Counts at two depths; their difference is the per-layer (per group) count, the rest is outside the layers.
    kernelized: each replaceable region's ops become one call."""
    unit = 6 if name == "gemma4_26b_a4b" else 1
    totals = []
    for layers in (unit, 2 * unit):
        ops, inside, calls = count_step(tiny(name, layers))
        default = device_ops(ops)
        kernelized = default - sum(inside.values()) + sum(calls.values())
        totals.append((default, kernelized, dict(inside), dict(calls)))
    units = REAL[name] // unit
    out = {"model": name, "layers": REAL[name]}
    for i, key in enumerate(("default", "kernelized_torch_tpu")):
        per = totals[1][i] - totals[0][i]
        outside = totals[0][i] - per
        out[key] = {"ops_per_layer": per / unit, "ops_outside_layers": outside,
                    "device_calls_per_step": outside + units * per}
    out["region_ops_per_layer"] = {r: (totals[1][2].get(r, 0) - totals[0][2].get(r, 0)) / unit for r in REGIONS}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [per_model(m) for m in REAL]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        for key in ("default", "kernelized_torch_tpu"):
            c = r[key]
            print(f"{r['model']:16} {key:22} ops/layer {c['ops_per_layer']:.0f}, outside the layers "
                  f"{c['ops_outside_layers']} -> {c['device_calls_per_step']} device calls per step (compiled: 1)")
        print(f"{'':16} ops per layer inside the regions kernelize replaces: {r['region_ops_per_layer']}")


if __name__ == "__main__":
    main()
