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
    return model.eval()


def count_step(model, batch: int = 2, prompt: int = 5) -> Counter:
    """The ops one decode step dispatches after a prompt (StaticCache, greedy: the model's forward for one token)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import StaticCache

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, 256, (batch, prompt))
    cache = StaticCache(config=model.config, max_cache_len=prompt + 4)
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        pos = torch.tensor([prompt])
        mode = Count()
        with mode:
            model(nxt, past_key_values=out.past_key_values, use_cache=True, cache_position=pos)
    return mode.ops


def split(ops: Counter) -> tuple[int, int]:
    """(device ops, view/metadata ops)."""
    views = sum(n for op, n in ops.items() if op in VIEWS)
    return sum(ops.values()) - views, views


def per_model(name: str, kernelized: bool) -> dict:
    """Counts at two depths; their difference is the per-layer (per group) count, the rest is outside the layers."""
    unit = 6 if name == "gemma4_26b_a4b" else 1
    counts = []
    for layers in (unit, 2 * unit):
        model = tiny(name, layers)
        if kernelized:
            import kernel_hub as kh

            model = kh.kernelize(model, validate=False)
        counts.append(split(count_step(model)))
    per_unit = [b - a for a, b in zip(*counts, strict=True)]
    outside = [a - p for a, p in zip(counts[0], per_unit, strict=True)]
    units = REAL[name] // unit
    device = outside[0] + units * per_unit[0]
    return {"model": name, "kernelized": kernelized, "ops_per_layer": per_unit[0] / unit,
            "ops_outside_layers": outside[0], "views_per_layer": per_unit[1] / unit,
            "device_calls_per_step": device, "layers": REAL[name]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [per_model(m, k) for m in REAL for k in (False, True)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['model']:16} {'kernelized' if r['kernelized'] else 'default':10} ops/layer "
              f"{r['ops_per_layer']:.0f} (+{r['views_per_layer']:.0f} views) outside {r['ops_outside_layers']} "
              f"-> {r['device_calls_per_step']} device calls per step (compiled: 1)")


if __name__ == "__main__":
    main()
