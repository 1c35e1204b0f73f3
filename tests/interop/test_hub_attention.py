"""transformers' hub attention by repo id on our flash-attention build: `from_pretrained(path,
attn_implementation="kernel-hub/flash-attention-tpu")` and `model.set_attn_implementation(...)`, with transformers 5.25
and PyPI `kernels` 0.19.1 fetching the build from `kernel-hub serve` (loopback). transformers reads our build's
`flash_attn_varlen_func` / `flash_attn_func` (flash-attn's signatures) and unpads left-padded batches into packed
sequences; the logits are held to the contract's tolerance against sdpa and against a float64 masked softmax attention
written here (with its own causal / sliding-window / padding masks and GPT-OSS's sinks), and greedy generation must
match sdpa's token for token (eager's for GPT-OSS, which has no sdpa path). GPT-OSS lists its own flash kernels
(`_compatible_flash_implementations`) and transformers swaps any other flash-named repo for the first of them: the test
pins down that swap and the two ways ours still wins (our repo listed on the model, or on the class while it loads)."""

from __future__ import annotations

from pathlib import Path

from kernel_hub.verify.numerics import TOLERANCE as TOL
from tests.hub_interop import KERNELS

REPO = "kernel-hub/flash-attention-tpu"
#: published by the interop_hub fixture (tests/conftest.py)
INTEROP_KERNELS = {REPO: KERNELS / "flash_attention"}
FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")

SCRIPT = r"""
import json, tempfile, torch
import transformers
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from kernel_hub.report import models

transformers.logging.set_verbosity_error()


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                        **kwargs):
    # float64 softmax attention from first principles: the 2-D padding mask (1 = real token), causal from absolute
    # key positions (the queries are the last Sq of the Skv keys), the layer's sliding window, GPT-OSS's sinks.
    b, hq, sq, d = query.shape
    hkv, skv = key.shape[1], key.shape[2]
    q = query.double()
    k, v = (t.double().repeat_interleave(hq // hkv, 1) for t in (key, value))
    logits = (q @ k.transpose(-1, -2)) * (d ** -0.5 if scaling is None else scaling)
    i = torch.arange(sq)[:, None] + (skv - sq)
    j = torch.arange(skv)[None, :]
    keep = j <= i
    if sliding_window is not None:
        keep = keep & (j > i - sliding_window)
    keep = keep[None, None] & (attention_mask.bool()[:, None, None, :] if attention_mask is not None else True)
    logits = logits.masked_fill(~keep, float("-inf"))
    sinks = getattr(module, "sinks", None)
    if sinks is not None:
        logits = torch.cat([logits, sinks.double().reshape(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)[..., :skv]
    return (probs @ v).to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register("reference-f64", reference_attention)
AttentionMaskInterface.register("reference-f64", ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])  # the 2-D mask


import transformers.modeling_flash_attention_utils as fa_utils

CALLS = {"flash_attn_func": 0, "flash_attn_varlen_func": 0}
FILES = {}


def counted():
    # count calls of the functions transformers loaded from our build (wrapped once, after the first load)
    for attr, name in (("_flash_fn", "flash_attn_func"), ("_flash_varlen_fn", "flash_attn_varlen_func")):
        fn = getattr(fa_utils, attr)
        if fn is not None and not getattr(fn, "counted", False):
            FILES[name] = fn.__code__.co_filename

            def wrapper(*a, _fn=fn, _name=name, **kw):
                CALLS[_name] += 1
                return _fn(*a, **kw)

            wrapper.counted = True
            setattr(fa_utils, attr, wrapper)


def load(path, impl):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl, dtype=torch.float32).eval()
    counted()
    return model


def run(model, ids, mask):
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    return logits, gen


def error(got, ref, real):
    return ((got - ref)[real].abs().max() / ref[real].abs().max()).item()


def attempt(fn):
    try:
        return fn(), None
    except Exception as e:
        return None, [type(e).__name__, str(e)[:400]]


def ours_listed(path):
    # from_pretrained builds GptOssForCausalLM and its inner GptOssModel, and each re-checks the implementation
    # against its class's list: the list they share (GptOssPreTrainedModel's) names ours first while they are built
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel

    listed = GptOssPreTrainedModel._compatible_flash_implementations
    GptOssPreTrainedModel._compatible_flash_implementations = [REPO, *listed]
    try:
        return load(path, REPO)
    finally:
        GptOssPreTrainedModel._compatible_flash_implementations = listed


out = {"families": {}, "gpt_oss_swap": {}}
tmp = tempfile.mkdtemp()
for fam in FAMILIES:
    path = f"{tmp}/{fam}"
    models.tiny_model(fam).save_pretrained(path)
    base = "eager" if fam == "gpt_oss" else "sdpa"  # transformers 5.25's GPT-OSS has no sdpa path
    ids = torch.randint(3, 100, (3, 20), generator=torch.Generator().manual_seed(0))
    for padding in ("none", "left"):
        mask = torch.ones_like(ids)
        if padding == "left":  # as generate pads; GPT-OSS's 16-token window is shorter than row 0
            mask[1, :6] = 0
            mask[2, :13] = 0
        real = mask.bool()
        ref, gen_ref = run(load(path, base), ids, mask)
        exact, gen_exact = run(load(path, "reference-f64"), ids, mask)
        row = {"base": base, "base_vs_f64": error(ref, exact, real)}
        routes = {"from_pretrained": ours_listed(path) if fam == "gpt_oss" else load(path, REPO)}
        if padding == "left":  # one route is enough for the unpadded call (flash_attn_func)
            switched = load(path, base)
            if fam == "gpt_oss":  # the model's own list, read by set_attn_implementation on the top model
                switched._compatible_flash_implementations = [REPO, *switched._compatible_flash_implementations]
            switched.set_attn_implementation(REPO)
            routes["set_attn_implementation"] = switched
        for route, model in routes.items():
            before = dict(CALLS)
            logits, gen = run(model, ids, mask)
            row[route] = {"impl": model.config._attn_implementation, "error": error(logits, ref, real),
                          "error_f64": error(logits, exact, real), "nan": bool(logits.isnan().any()),
                          "generate_equal": bool(torch.equal(gen, gen_ref)),
                          "f64_generate_equal": bool(torch.equal(gen_exact, gen_ref)),
                          "calls": {k: CALLS[k] - before[k] for k in CALLS}}
        out["families"][f"{fam}/{padding}"] = row
    if fam == "gpt_oss":  # what transformers does with the repo id alone, and the warning that says so
        import logging

        said = []
        handler = logging.Handler()
        handler.emit = lambda record: said.append(record.getMessage())
        transformers.logging.set_verbosity_warning()
        transformers.logging.add_handler(handler)
        _, out["gpt_oss_swap"]["from_pretrained"] = attempt(lambda: load(path, REPO))
        transformers.logging.remove_handler(handler)
        transformers.logging.set_verbosity_error()
        out["gpt_oss_swap"]["warning"] = [m for m in said if "falling back" in m]
        model = load(path, "eager")
        _, out["gpt_oss_swap"]["set_attn_implementation"] = attempt(lambda: model.set_attn_implementation(REPO))
        out["gpt_oss_swap"]["impl_after"] = model.config._attn_implementation
out["files"] = FILES
print(json.dumps(out))
"""


def _table(families: dict) -> str:
    lines = ["family | padding | route | logits max error (vs base, vs f64) | generate identical"]
    for key, row in families.items():
        fam, padding = key.split("/")
        for route in ("from_pretrained", "set_attn_implementation"):
            if route in row:
                r = row[route]
                lines.append(f"{fam} | {padding} | {route} | {r['error']:.2e} vs {row['base']}, {r['error_f64']:.2e} "
                             f"vs f64 | {r['generate_equal']}")
    return "\n".join(lines)


def test_transformers_hub_attention_by_repo_id_runs_our_flash_attn_functions(interop_hub) -> None:
    interop_hub.reset()
    res = interop_hub.run(SCRIPT, REPO=REPO, FAMILIES=FAMILIES)
    families = res["families"]
    print(_table(families))
    assert sorted(families) == sorted(f"{f}/{p}" for f in FAMILIES for p in ("none", "left"))
    for key, row in families.items():
        assert row["base_vs_f64"] <= TOL["float32"], (key, row)  # the written-out reference agrees with transformers
        routes = [r for r in ("from_pretrained", "set_attn_implementation") if r in row]
        assert routes[0] == "from_pretrained" and (key.endswith("/none") or len(routes) == 2), (key, row)
        for route in routes:
            r = row[route]
            assert r["impl"] == REPO and not r["nan"], (key, route, r)
            assert r["error"] <= TOL["float32"] and r["error_f64"] <= TOL["float32"], (key, route, r)
            assert r["generate_equal"] and r["f64_generate_equal"], (key, route, r)
            # unpadded batches take flash_attn_func; left-padded ones are unpacked into flash_attn_varlen_func
            used = "flash_attn_varlen_func" if key.endswith("/left") else "flash_attn_func"
            assert r["calls"][used] >= 2 and sum(r["calls"].values()) == r["calls"][used], (key, route, r)
    for name, file in res["files"].items():  # transformers called the functions of the build HF kernels fetched
        assert Path(file).as_posix().endswith("/build/torch-cpu/flash_attention/flash_attn_api.py"), (name, file)
    # GPT-OSS with the repo id alone: transformers swaps it for kernels-community/vllm-flash-attn3 (CUDA only),
    # which this loopback hub does not hold, and the model keeps its previous implementation
    swap = res["gpt_oss_swap"]
    for route in ("from_pretrained", "set_attn_implementation"):
        assert swap[route] is not None and "kernels-community/vllm-flash-attn3" in swap[route][1], swap
    assert swap["impl_after"] == "eager"
    assert any(f"Automatically falling back to `kernels-community/vllm-flash-attn3` instead of `{REPO}`" in m
               for m in swap["warning"]), swap["warning"]
    paths = [p for _, p, _ in interop_hub.requests()]
    assert "/api/organizations/kernels-community/overview" in paths
    assert not [p for p in paths if "/build/jax-" in p]
