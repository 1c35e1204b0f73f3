"""One forward of a small Flux transformer (random weights, built from a config): Diffusers' default attention
(torch sdpa through the "native" backend) against the same model after kh.kernelize (the hub's flash
attention, torch-facing build), and against a model routed through kernelize's processor with torch's own
sdpa as the "kernel" (what the routing alone costs).

Three copies of one model; each is checked against the default before timing. Runs are interleaved with the
order rotated each round (kernel_hub.verify.timing.interleaved_samples); the table gives medians with their
interquartile range and the ratio to the default (>1: faster than it) with the quartiles of the per-round ratios;
the JSON has every sample and the environment.

  python bench/diffusers_attention.py [--dtype float32|bfloat16] [--repeats N] [--tokens N] [--quick]
                                      [--out bench/out/diffusers_attention.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from json_out import write_result  # noqa: E402

import kernel_hub as kh  # noqa: E402
from kernel_hub.report.environment import environment  # noqa: E402
from kernel_hub.verify.numerics import relative_error  # noqa: E402
from kernel_hub.verify.timing import bench_records, format_ratio, interleaved_samples  # noqa: E402

BASELINE = "diffusers default (sdpa)"
OURS = ("kernelized (hub flash attention)",)
REPO = "kernel-hub/flash-attention-tpu"


def build(tokens: int, text_tokens: int, dtype: torch.dtype, layers: tuple[int, int]):
    """A Flux transformer a few blocks deep at a small width (8 heads x 64), and one batch for it."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    config = dict(patch_size=1, in_channels=16, num_layers=layers[0], num_single_layers=layers[1],
                  attention_head_dim=64, num_attention_heads=8, joint_attention_dim=256, pooled_projection_dim=128,
                  axes_dims_rope=[16, 24, 24])
    model = FluxTransformer2DModel(**config).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, tokens, 16, generator=g).to(dtype),
                  encoder_hidden_states=torch.randn(1, text_tokens, 256, generator=g).to(dtype),
                  pooled_projections=torch.randn(1, 128, generator=g).to(dtype),
                  timestep=torch.tensor([0.5]).to(dtype), guidance=None,
                  img_ids=torch.randn(tokens, 3, generator=g), txt_ids=torch.zeros(text_tokens, 3))
    return model, inputs, config


def sdpa_as_kernel(kernel):
    """A stand-in kernel module whose flash_attention is torch sdpa: times the processor route alone."""
    def flash_attention(q, k, v, *, causal=False, sm_scale=None, kv_lengths=None, **_):
        mask = None if kv_lengths is None else (torch.arange(k.shape[2]) < kv_lengths[:, None])[:, None, None]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1])

    return types.SimpleNamespace(flash_attention=flash_attention, __kernel_hub__=kernel.__kernel_hub__)


def run(*, dtype_name: str = "float32", tokens: int = 1024, text_tokens: int = 128, repeats: int = 7,
        log=print) -> dict:
    """Check and time the three models; the JSON the bench writes."""
    dtype = getattr(torch, dtype_name)
    base, inputs, config = build(tokens, text_tokens, dtype, layers=(1, 2))
    fa = kh.get_kernel(REPO, framework="torch", backend="cpu")
    models = {BASELINE: base, OURS[0]: copy.deepcopy(base), "routed, torch sdpa as kernel": copy.deepcopy(base)}
    # attention only: kernelize also swaps Flux's q/k RMSNorms by default, which this bench does not measure
    routed = {"attention": sdpa_as_kernel(fa), "rms_norm": None}
    reports = {OURS[0]: kh.kernelize_report(kh.kernelize(models[OURS[0]], mapping={"rms_norm": None})),
               "routed, torch sdpa as kernel": kh.kernelize_report(
                   kh.kernelize(models["routed, torch sdpa as kernel"], mapping=routed))}
    log(str(reports[OURS[0]]))

    def forward(model):
        def call():
            with torch.no_grad():
                return model(**inputs, return_dict=False)[0]
        return call

    fns = {name: forward(m) for name, m in models.items()}
    ref = fns[BASELINE]()
    errors = {name: relative_error(fn(), ref) for name, fn in fns.items()}
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    if any(not e <= tol for e in errors.values()):
        raise SystemExit(f"a method disagrees with the default beyond {tol:.0e}: {errors}")
    samples = interleaved_samples(fns, repeats=repeats, warmup=1)
    seq = tokens + text_tokens
    group = f"flux {config['num_layers']}+{config['num_single_layers']} blocks, {seq} tokens, {dtype_name}"
    records = [{**r, "rel_error_vs_default": errors[r["method"]]}
               for r in bench_records(samples, group=group, baseline=BASELINE)]
    env = environment(with_libtpu=False).model_dump()
    env.update(torch_threads=torch.get_num_threads(), kernel=REPO, kernel_variant=fa.__kernel_hub__.variant,
               kernel_implementation=fa.describe("cpu"))
    shape = dict(config=config, dtype=dtype_name, batch=1, image_tokens=tokens, text_tokens=text_tokens,
                 repeats=repeats)
    return dict(benchmark="diffusers_attention", environment=env, baseline=BASELINE, ours=list(OURS), shape=shape,
                records=records, report=json.loads(reports[OURS[0]].to_json()))


def table(result: dict) -> str:
    rows = [("method", "median ms", "IQR ms", "min ms", "max ms", "x vs default (IQR)", "rel. error")]
    for r in result["records"]:
        rows.append((r["method"], f"{r['median_ms']:.1f}", f"{r['q1_ms']:.1f}-{r['q3_ms']:.1f}", f"{r['min_ms']:.1f}",
                     f"{r['max_ms']:.1f}", format_ratio(r["vs_baseline"]), f"{r['rel_error_vs_default']:.1e}"))
    shape = result["shape"]
    head = (f"\nFlux transformer ({shape['config']['num_layers']}+{shape['config']['num_single_layers']} blocks, "
            f"8 heads x 64), {shape['dtype']}, batch 1, {shape['image_tokens']} image + {shape['text_tokens']} text "
            f"tokens (attention over {shape['image_tokens'] + shape['text_tokens']}); {shape['repeats']} interleaved "
            "runs")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join([head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (default 1024 = 32x32 latents)")
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method (default 7, quick 3)")
    parser.add_argument("--quick", action="store_true", help="256 image tokens, 3 repeats")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "diffusers_attention.json")
    args = parser.parse_args(argv)
    result = run(dtype_name=args.dtype, tokens=256 if args.quick else args.tokens, text_tokens=args.text_tokens,
                 repeats=args.repeats or (3 if args.quick else 7))
    print(table(result))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
