"""HF kernels' layer convention in our torch builds: PyPI `kernels` 0.19.1's `kernelize`, under a LayerRepository
mapping "RMSNorm" to kernel-hub/rms-norm-tpu published to `kernel-hub serve` (loopback), replaces the forward of a
class marked `use_kernel_forward_from_hub("RMSNorm")` with our `layers.RMSNorm`, which computes what the layer did; the
same for "MegaBlocksMoeMLP" (transformers' GptOssMLP) onto kernel-hub/ragged-dot-tpu's `layers.MegaBlocksMoeMLP`,
which refuses a module in another layout instead of computing wrong numbers."""

from __future__ import annotations

from pathlib import Path

from tests.hub_interop import KERNELS

REPO = "kernel-hub/rms-norm-tpu"
MOE_REPO = "kernel-hub/ragged-dot-tpu"
ATTENTION_REPO = "kernel-hub/flash-attention-tpu"
#: published by the interop_hub fixture (tests/conftest.py)
INTEROP_KERNELS = {REPO: KERNELS / "rms_norm", MOE_REPO: KERNELS / "ragged_dot",
                   ATTENTION_REPO: KERNELS / "flash_attention"}

SCRIPT = """
import json, torch
from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

@use_kernel_forward_from_hub("RMSNorm")
class MarkedRMSNorm(torch.nn.Module):  # Llama's RMSNorm, written out here
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(1)) * 0.5 + 1)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)

out = {}
for dtype in (torch.float32, torch.bfloat16):
    model = torch.nn.Sequential(MarkedRMSNorm(96), torch.nn.Linear(96, 8)).to(dtype)
    x = torch.randn(2, 7, 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.no_grad():
        before = model(x)
    mapping = {"RMSNorm": {"cpu": LayerRepository(repo_id=REPO, layer_name="RMSNorm", version=1)}}
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    fwd = model[0].forward
    with torch.no_grad():
        after = model(x)
    out[str(dtype)] = {"module": fwd.__func__.__module__, "file": fwd.__func__.__code__.co_filename,
                       "instance": "forward" in model[0].__dict__, "equal": bool(torch.equal(after, before)),
                       "err": (after.float() - before.float()).abs().max().item()}
print(json.dumps(out))
"""


def test_hf_kernels_kernelize_swaps_a_marked_rms_norm_onto_our_layer(interop_hub) -> None:
    assert "torch-cpu" in interop_hub.results[REPO].variants
    interop_hub.reset()
    res = interop_hub.run(SCRIPT, REPO=REPO)
    for dtype, row in res.items():
        assert row["instance"], dtype  # the instance's forward, not the class's
        assert row["module"].endswith(".layers") and "/build/torch-cpu/" in Path(row["file"]).as_posix(), row
        assert row["equal"], (dtype, row["err"])  # Llama's op order, bit for bit, in f32 and bf16
    paths = [p for _, p, _ in interop_hub.requests()]
    assert not [p for p in paths if "/build/jax-" in p]


MOE_SCRIPT = """
import json, torch
from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping
from transformers import GptOssConfig, Qwen3MoeConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

@use_kernel_forward_from_hub("MegaBlocksMoeMLP")
class MarkedGptOssMLP(GptOssMLP):  # transformers' own block; its eager experts loop is the reference
    pass

@use_kernel_forward_from_hub("MegaBlocksMoeMLP")
class MarkedQwen3MoeBlock(Qwen3MoeSparseMoeBlock):  # another layout (`gate`, no `router`): must be refused
    pass

MAPPING = {"MegaBlocksMoeMLP": {"cpu": LayerRepository(repo_id=REPO, layer_name="MegaBlocksMoeMLP", version=1)}}

def fresh(cls, cfg, seed, skew=False):
    cfg._experts_implementation = "eager"
    block = cls(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        if skew:  # every token picks experts 3 and 5: two groups hold all rows, six are empty
            block.router.bias.zero_()
            block.router.bias[3], block.router.bias[5] = 100.0, 50.0
    return block

def kernelized(block):
    with use_kernel_mapping(MAPPING):
        kernelize(block, mode=Mode.INFERENCE, device="cpu")
    return block

gpt = GptOssConfig(hidden_size=48, intermediate_size=40, num_local_experts=8, num_experts_per_tok=2)
out = {}
for name, dtype, tokens, skew in (("f32", torch.float32, 7, False), ("bf16", torch.bfloat16, 13, False),
                                  ("f32-skewed", torch.float32, 9, True)):
    block = fresh(MarkedGptOssMLP, gpt, seed=len(name), skew=skew).to(dtype)
    x = torch.randn(2, tokens, 48, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    ref, ref_scores = block(x)
    ref.float().square().sum().backward()
    ref_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    _, _, idx = block.router(x.reshape(-1, 48))
    kernelized(block)
    fwd = block.forward
    got, scores = block(x)
    got.float().square().sum().backward()
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    out[name] = {"module": fwd.__func__.__module__, "file": fwd.__func__.__code__.co_filename,
                 "qualname": fwd.__func__.__qualname__, "instance": "forward" in block.__dict__,
                 "dtype": str(got.dtype), "scores_equal": bool(torch.equal(scores, ref_scores)),
                 "rel": rel(got, ref), "nan": bool(got.isnan().any()),
                 "grad_rel": max(rel(p.grad, r) for p, r in zip(block.parameters(), ref_grads)),
                 "empty_experts": 8 - len(set(idx.flatten().tolist()))}

refusals = {}
qwen = Qwen3MoeConfig(hidden_size=48, moe_intermediate_size=40, num_experts=8, num_experts_per_tok=2)
quantized = fresh(MarkedGptOssMLP, gpt, seed=3)
del quantized.experts.gate_up_proj  # as if quantized: no dense gate_up_proj
quantized.experts.gate_up_proj_blocks = torch.nn.Parameter(torch.zeros(8, 80, 3, 16), requires_grad=False)
for name, block in (("qwen3_moe", fresh(MarkedQwen3MoeBlock, qwen, seed=4)), ("quantized", quantized)):
    kernelized(block)
    try:
        block(torch.randn(1, 3, 48))
        refusals[name] = None
    except Exception as e:
        refusals[name] = [type(e).__name__, str(e)]
print(json.dumps({"numbers": out, "refusals": refusals}))
"""


def test_hf_kernels_kernelize_swaps_gpt_oss_moe_mlp_onto_our_ragged_dot_layer(interop_hub) -> None:
    assert "torch-cpu" in interop_hub.results[MOE_REPO].variants
    interop_hub.reset()
    res = interop_hub.run(MOE_SCRIPT, REPO=MOE_REPO)
    numbers, refusals = res["numbers"], res["refusals"]
    assert numbers["f32-skewed"]["empty_experts"] == 6  # the edge the skewed case is for
    for case, row in numbers.items():
        assert row["instance"] and row["qualname"] == "MegaBlocksMoeMLP.forward", (case, row)
        assert row["module"].endswith(".layers") and "/build/torch-cpu/" in Path(row["file"]).as_posix(), row
        assert row["scores_equal"] and not row["nan"], (case, row)  # the module's own router, untouched
        limit = 2e-2 if case == "bf16" else 1e-5  # grouped sums in another order than the per-expert loop
        assert row["rel"] <= limit and row["grad_rel"] <= 10 * limit, (case, row)
        assert row["dtype"] == ("torch.bfloat16" if case == "bf16" else "torch.float32")
    kind, message = refusals["qwen3_moe"]
    assert kind == "UnsupportedLayout" and "MarkedQwen3MoeBlock" in message and "`router`" in message
    kind, message = refusals["quantized"]
    assert kind == "UnsupportedLayout" and "experts.gate_up_proj" in message
    paths = [p for _, p, _ in interop_hub.requests()]
    assert not [p for p in paths if "/build/jax-" in p]


ATTENTION_SCRIPT = """
import json, torch, kernels
from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping
from kernel_hub.report import models

@use_kernel_forward_from_hub("MultiScaleDeformableAttention")
class MarkedDeformable(torch.nn.Module):  # the one attention layer transformers names: not softmax attention
    def forward(self, x):
        return x * 2

module = MarkedDeformable()
mapping = {"MultiScaleDeformableAttention": {"cpu": LayerRepository(repo_id=REPO,
                                                                    layer_name="MultiScaleDeformableAttention",
                                                                    version=1)}}
try:
    with use_kernel_mapping(mapping):
        kernelize(module, mode=Mode.INFERENCE, device="cpu")
    error = None
except Exception as e:
    error = [type(e).__name__, str(e)]
fa = kernels.get_kernel(REPO, version=1)
res = {"error": error, "swapped": "forward" in module.__dict__, "doc": fa.layers.__doc__,
       "classes": [n for n, v in vars(fa.layers).items() if isinstance(v, type)], "families": {}}

# `attention_forward` is an AttentionInterface function for registration by hand: transformers' hub attention by repo
# id (`attn_implementation="kernel-hub/flash-attention-tpu"`) loads the build's flash_attn_* functions instead and never
# reaches a function named after a colon in a flash-named repo (tests/interop/test_hub_attention.py). So it is
# registered here, with FlashAttention-2's mask function, under a name transformers does not read as flash attention.
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "kernel-hub-hook"  # a name transformers does not read as one of its flash-attention variants
AttentionInterface.register(NAME, fa.attention_forward)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
for fam in ("gpt_oss", "qwen3_moe"):  # gpt_oss: sinks and a 16-token sliding window under 20 tokens
    model = models.tiny_model(fam).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding, as generate pads
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        gen_ref = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    model.set_attn_implementation(NAME)
    fa.last_implementation()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).logits
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    real = mask.bool()
    res["families"][fam] = {"impl": model.config._attn_implementation, "ran": fa.last_implementation()[0],
                            "rel": ((out - ref)[real].abs().max() / ref[real].abs().max()).item(),
                            "nan": bool(out.isnan().any()), "generate_equal": bool(torch.equal(gen, gen_ref))}

class Layer(torch.nn.Module):
    is_causal = True

q = torch.randn(2, 4, 6, 8)
holes = torch.ones(2, 6, dtype=torch.bool)
holes[0, 2] = False
right = torch.ones(2, 6, dtype=torch.bool)
right[1, 4:] = False
refusals = {}
for name, args, kw in (("holes", (q, q, q, holes), {}), ("dropout", (q, q, q, None), {"dropout": 0.1}),
                       ("right-cached", (q[:, :, :1], q, q, right), {})):
    try:
        fa.attention_forward(Layer(), *args, **kw)
        refusals[name] = None
    except Exception as e:
        refusals[name] = [type(e).__name__, str(e)]
res["refusals"] = refusals
print(json.dumps(res))
"""


def test_flash_attention_serves_transformers_attention_hook_and_no_layer(interop_hub) -> None:
    """transformers names no softmax-attention layer for the hub, so our build's `layers` holds no class and a mapping
    onto it fails with HF kernels' "not found" (never a swap); `attention_forward`, loaded through HF kernels and
    registered by hand in transformers' AttentionInterface, computes what sdpa did on left-padded batches and in
    generation, and refuses calls it cannot express."""
    res = interop_hub.run(ATTENTION_SCRIPT, REPO=ATTENTION_REPO)
    assert res["classes"] == [] and not res["swapped"]
    assert "MultiScaleDeformableAttention" in res["doc"]
    assert res["error"][0] == "ValueError" and "`MultiScaleDeformableAttention` not found" in res["error"][1]
    for fam, row in res["families"].items():
        assert row["impl"] == "kernel-hub-hook" and row["ran"] == "torch", (fam, row)
        assert not row["nan"] and row["rel"] <= 1e-5 and row["generate_equal"], (fam, row)
    refusals = res["refusals"]
    assert all(r is not None and r[0] == "UnsupportedAttentionCall" for r in refusals.values()), refusals
    assert "contiguous run" in refusals["holes"][1] and "dropout" in refusals["dropout"][1]
    assert "right padding in a cached step" in refusals["right-cached"][1]
