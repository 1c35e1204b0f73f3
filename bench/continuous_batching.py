"""Continuous batching on this machine's CPU: transformers' `generate_batch` on a tiny MoE model without kernel-hub
against the same model after `kh.kernelize` (all kinds, and attention only), then the paged attention kernel alone
against gather-then-attend, then the peak memory of each.

1. Throughput: generated tokens per second of one `generate_batch` over the same requests (greedy, f32), the three
   models timed round-robin (interleaved_samples), medians with their spread and the ratio to transformers' own run
   (>1: faster). The tokens of every method must equal transformers' before any time counts.
2. Kernel alone, one decode step of a batch of sequences whose KV lives in shuffled pages: ours
   (`ragged_paged_attention`, torch-native: walks the pages a chunk at a time, new rows written in place) against
   gather-then-attend (write the rows, copy each sequence's pages into one contiguous padded tensor, then torch's
   scaled_dot_product_attention with the length mask), checked against each other first.
3. Memory: each of the two in a fresh process, the peak resident size (ru_maxrss) above what the process held with the
   cache built: the gather baseline holds a contiguous copy of every live sequence's KV, ours one chunk of pages.

  python bench/continuous_batching.py [--quick] [--repeats N] [--out bench/out/continuous_batching.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch
from json_out import write_result

import kernel_hub as kh
from kernel_hub.report.environment import environment
from kernel_hub.report.models import tiny_model
from kernel_hub.verify.timing import bench_records, format_ratio, interleaved_samples

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "transformers"
GATHER = "gather_then_sdpa"


def _fa():
    """The flash-attention torch-cpu build as it is in this checkout."""
    return kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention", framework="torch", backend="cpu")


# --- 1. generate_batch throughput ------------------------------------------------------------------------------------

def throughput(quick: bool, repeats: int) -> tuple[list[dict], dict]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    size = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_hidden_layers=2,
                max_position_embeddings=512)
    requests, new_tokens = (8, 16) if quick else (16, 32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 120, (int(n),), generator=g).tolist()
               for n in torch.randint(8, 96, (requests,), generator=g)]
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    models = {BASELINE: tiny_model("qwen3_moe", **size),
              "kh.kernelize": kh.kernelize(tiny_model("qwen3_moe", **size)),
              "kh.kernelize attention only": kh.kernelize(tiny_model("qwen3_moe", **size),
                                                          mapping={"moe_experts": None, "rms_norm": None})}

    def run(model):
        cfg = ContinuousBatchingConfig(page_size=16, num_blocks=256, max_batch_tokens=256)
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
        return [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.rsplit("_", 1)[-1]))]

    want = run(models[BASELINE])
    for name, model in models.items():
        if run(model) != want:
            raise SystemExit(f"{name}: generate_batch tokens differ from transformers' own")
    with torch.no_grad():
        samples = interleaved_samples({k: (lambda m=m: run(m)) for k, m in models.items()}, repeats=repeats)
    tokens = requests * new_tokens
    records = bench_records(samples, group="generate_batch", baseline=BASELINE, requests=requests,
                            new_tokens=new_tokens)
    for r in records:
        r["tokens_per_s"] = tokens / (r["median_ms"] / 1e3)
    return records, {"model": "qwen3_moe tiny", **size, "requests": requests, "new_tokens": new_tokens}


# --- 2. the kernel alone ----------------------------------------------------------------------------------------------

def decode_case(seqs: int, max_len: int, hq: int = 8, hkv: int = 2, d: int = 64, page: int = 16, seed: int = 0):
    """One decode step: `seqs` sequences of random lengths up to max_len in shuffled pages of a cache."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max_len // 4, max_len + 1, (seqs,), generator=g, dtype=torch.int32)
    per = -(-max_len // page)
    pages = seqs * per
    table = torch.randperm(pages, generator=g)[: seqs * per].reshape(seqs, per).to(torch.int32)
    k_cache = torch.empty(pages, page, hkv, d).normal_(generator=g)
    v_cache = torch.empty(pages, page, hkv, d).normal_(generator=g)
    q = torch.randn(seqs, hq, d, generator=g)
    k, v = torch.randn(seqs, hkv, d, generator=g), torch.randn(seqs, hkv, d, generator=g)
    cu = torch.arange(seqs + 1, dtype=torch.int32)
    return dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, lens=lens, table=table, cu=cu)


def ours(fa, c):
    return fa.ragged_paged_attention(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], c["lens"], c["table"],
                                     c["cu"], implementation="torch")[0]


def gather_then_attend(c):
    """Write the new rows, copy every sequence's pages into one padded contiguous tensor, attend with a length mask."""
    page = c["k_cache"].shape[1]
    pos = c["lens"].long() - 1
    rows = torch.arange(c["q"].shape[0])
    c["k_cache"][c["table"][rows, pos // page].long(), pos % page] = c["k"]
    c["v_cache"][c["table"][rows, pos // page].long(), pos % page] = c["v"]
    k = c["k_cache"][c["table"].long()].flatten(1, 2).transpose(1, 2)  # [S, Hkv, pages*page, D]: a contiguous copy
    v = c["v_cache"][c["table"].long()].flatten(1, 2).transpose(1, 2)
    keep = torch.arange(k.shape[2])[None] < c["lens"][:, None]
    out = torch.nn.functional.scaled_dot_product_attention(c["q"][:, :, None], k, v, attn_mask=keep[:, None, None],
                                                           enable_gqa=True)
    return out[:, :, 0]


def kernel_alone(quick: bool, repeats: int) -> tuple[list[dict], list[dict]]:
    fa = _fa()
    records, shapes = [], []
    for seqs, max_len in ([(16, 512)] if quick else [(16, 512), (64, 1024)]):
        c = decode_case(seqs, max_len)
        got, want = ours(fa, c), gather_then_attend(c)
        err = float((got - want).abs().max() / want.abs().max())
        if not err <= 1e-5:
            raise SystemExit(f"ours and {GATHER} disagree ({err:.2e}) at {seqs} x {max_len}")
        with torch.no_grad():
            samples = interleaved_samples({"ours_paged": lambda c=c: ours(fa, c),
                                           GATHER: lambda c=c: gather_then_attend(c)}, repeats=repeats)
        shape = f"decode {seqs} seqs up to {max_len} keys, 8/2 heads, d64, page 16, f32"
        records += bench_records(samples, group=shape, baseline=GATHER, max_error=err)
        shapes.append({"seqs": seqs, "max_len": max_len})
    return records, shapes


# --- 3. peak memory, one fresh process per method ---------------------------------------------------------------------

def _peak_child(method: str, seqs: int, max_len: int) -> None:
    c = decode_case(seqs, max_len, hkv=8, d=128)
    fa = _fa()
    ours(fa, decode_case(2, 32, hkv=8, d=128))  # imports and first-call set-up before the baseline reading
    gather_then_attend(decode_case(2, 32, hkv=8, d=128))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if method == "ours_paged":
        ours(fa, c)
    else:
        gather_then_attend(c)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cache = 2 * c["k_cache"].numel() * c["k_cache"].element_size()
    live = int((c["lens"].long() * 2 * 8 * 128 * 4).sum())  # the live sequences' K and V bytes
    print(json.dumps({"method": method, "peak_above_cache_mib": (after - before) / 1024, "cache_mib": cache / 2**20,
                      "live_kv_mib": live / 2**20}))


def memory(quick: bool) -> list[dict]:
    seqs, max_len = (32, 1024) if quick else (64, 2048)
    out = []
    for method in ("ours_paged", GATHER):
        proc = subprocess.run([sys.executable, __file__, "--peak-child", method, str(seqs), str(max_len)],
                              capture_output=True, text=True, timeout=600, check=True)
        out.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "seqs": seqs, "max_len": max_len})
    return out


def table(report: dict) -> str:
    lines = ["generate_batch (tiny qwen3_moe, f32, CPU) | method | median ms (IQR) | tokens/s | vs transformers"]
    for r in report["throughput"]:
        lines.append(f"  {r['method']} | {r['median_ms']:.0f} ({r['q1_ms']:.0f}-{r['q3_ms']:.0f}) | "
                     f"{r['tokens_per_s']:.0f} | {format_ratio(r['vs_baseline'])}")
    lines.append("kernel alone | method | median ms (IQR) | vs gather-then-attend")
    for r in report["kernel"]:
        lines.append(f"  {r['group']} | {r['method']} | {r['median_ms']:.2f} ({r['q1_ms']:.2f}-{r['q3_ms']:.2f}) | "
                     f"{format_ratio(r['vs_baseline'])}")
    lines.append("peak memory above the cache (fresh process each) | method | MiB | cache MiB | live KV MiB")
    for r in report["memory"]:
        lines.append(f"  {r['seqs']} seqs up to {r['max_len']} keys, 8/8 heads d128 | {r['method']} | "
                     f"{r['peak_above_cache_mib']:.1f} | {r['cache_mib']:.0f} | {r['live_kv_mib']:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peak-child"]:
        _peak_child(argv[1], int(argv[2]), int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and shapes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "continuous_batching.json")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    tp, model = throughput(args.quick, args.repeats)
    kernel, shapes = kernel_alone(args.quick, args.repeats)
    report = {"benchmark": "continuous_batching", "environment": environment(with_libtpu=False).model_dump(),
              "model": model, "throughput": tp, "kernel": kernel, "shapes": shapes, "memory": memory(args.quick)}
    print(table(report))
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
