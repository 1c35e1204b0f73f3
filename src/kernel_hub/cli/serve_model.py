"""`kernel-hub serve-model MODEL`: transformers' own OpenAI-compatible server (`transformers serve`) on the model after
`kh.kernelize`, experts included (kernelized_serving.py holds the hook). The parser is light; transformers and torch
are imported when the command runs. Walk-through: docs/serving-transformers.md."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import KernelHubError
from .common import add_trust_arg, trust_setting

if TYPE_CHECKING:
    from collections.abc import Callable

#: transformers serve's log levels (transformers.utils.logging.log_levels)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_KIND = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class CacheBounds:
    """Continuous batching's KV-cache settings (`--cb-*`); None leaves one to transformers."""

    block_size: int | None = None
    num_blocks: int | None = None
    max_batch_tokens: int | None = None


#: On CPU, transformers sizes the KV cache to 60% of free RAM unless told otherwise: these bound it (256 blocks of
#: 32 tokens: 8192 cached tokens across all requests, batches of up to 512 tokens).
CPU_CACHE_BOUNDS = CacheBounds(block_size=32, num_blocks=256, max_batch_tokens=512)


def cache_bounds(given: CacheBounds, on_cpu: bool) -> CacheBounds:
    """The `--cb-*` settings served: the ones given, and on CPU the bounded defaults for those left out."""
    if not on_cpu:
        return given
    cpu = CPU_CACHE_BOUNDS
    return CacheBounds(given.block_size or cpu.block_size, given.num_blocks or cpu.num_blocks,
                       given.max_batch_tokens or cpu.max_batch_tokens)


def runs_on_cpu(device: str, accelerator: str | None) -> bool:
    """Whether `--device` puts the model on CPU: "cpu", or "auto" on a machine whose torch sees no accelerator."""
    return device == "cpu" or (device == "auto" and accelerator is None)


def kernel_mapping(pairs: list[str], known: tuple[str, ...]) -> dict[str, str | None]:
    """`--kernel KIND=REPO` / `KIND=none` as kernelize's mapping (None leaves that kind on transformers' path)."""
    from ..names import check_repo_id

    mapping: dict[str, str | None] = {}
    for pair in pairs:
        kind, sep, repo = pair.partition("=")
        if not sep or not _KIND.match(kind) or not repo:
            raise KernelHubError(f"--kernel {pair!r}: expected KIND=ORG/NAME or KIND=none (kinds: {', '.join(known)})")
        if kind not in known:
            raise KernelHubError(f"--kernel {pair!r}: unknown layer kind {kind!r} (kinds: {', '.join(known)})")
        try:
            mapping[kind] = None if repo == "none" else check_repo_id(repo)
        except KernelHubError as exc:
            raise KernelHubError(f"--kernel {pair!r}: {exc}") from None
    return mapping


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _port(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 0 < value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction, command: Callable[[str, str], Callable[[argparse.Namespace], int]]
               ) -> None:
    p = sub.add_parser(
        "serve-model", help="serve a kernelized model (experts included) with transformers' own OpenAI server",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Load MODEL (a local folder or a Hub repo) exactly as `transformers serve` does, run "
        "kh.kernelize on it (MoE experts, attention, RMS norm on the hub's kernels, each checked against the layer "
        "it replaces), and serve it with transformers' own server: POST /v1/chat/completions (streaming too), "
        "/v1/completions, /v1/responses, GET /v1/models. Needs transformers' serving extra (fastapi, uvicorn, "
        "openai). On CPU, continuous batching's KV cache is bounded (--cb-block-size 32, --cb-num-blocks 256, "
        "--cb-max-batch-tokens 512) unless you set them.",
        epilog="Examples:\n"
        "  kernel-hub serve-model ./my-moe --port 8000 --dtype float32\n"
        "  kernel-hub serve-model ./my-moe --continuous-batching --report kernelize.json\n"
        "  kernel-hub serve-model ./my-moe --kernel attention=none   # experts and RMS norm only\n"
        "then, e.g.: curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "  -d '{\"model\": \"./my-moe\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'\n"
        "Walk-through: docs/serving-transformers.md")
    p.add_argument("model", help="model folder or Hub repo id (requests name it in their \"model\" field)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback 127.0.0.1; the "
                   "API has no authentication)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    p.add_argument("--device", default="auto", help="where the model runs: auto, cpu, cuda:0, ... (default auto)")
    p.add_argument("--dtype", default="auto", help="model dtype: auto (from the weights), float32, bfloat16, ...")
    p.add_argument("--attn-implementation", help="attention implementation the model loads with, before kernelize "
                   "(default: transformers'; kernelize then moves attention to the hub's kernel)")
    p.add_argument("--continuous-batching", action="store_true",
                   help="serve with transformers' continuous batching (paged KV cache; --cb-* tune it)")
    p.add_argument("--cb-block-size", type=_positive, help="KV cache page size in tokens (CPU default 32)")
    p.add_argument("--cb-num-blocks", type=_positive, help="KV cache pages (CPU default 256)")
    p.add_argument("--cb-max-batch-tokens", type=_positive, help="most tokens in one batch (CPU default 512)")
    p.add_argument("--max-model-len", type=_positive, help="longest request, prompt and answer, in tokens")
    p.add_argument("--default-seed", type=int, help="torch seed for sampling (greedy requests need none)")
    p.add_argument("--kernel", action="append", default=[], metavar="KIND=REPO",
                   help="the kernel repo for a layer kind (moe_experts, attention, rms_norm), or KIND=none to leave "
                   "that kind on transformers' path; repeatable (default: the registry's kernels)")
    add_trust_arg(p)
    p.add_argument("--no-validate", dest="validate", action="store_false",
                   help="swap layers without first checking each kernel against the layer it replaces")
    p.add_argument("--strict", action="store_true", help="fail instead of keeping any layer on transformers' path")
    p.add_argument("--quantize", choices=("int8", "fp8"), help="quantize the expert weights (checked per block)")
    p.add_argument("--report", metavar="FILE", help="write kernelize's report there as JSON (layers replaced, kept, "
                   "why); a one-line summary always goes to stderr")
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS, help="transformers serve's log level "
                   "(default warning)")
    p.set_defaults(func=command("serve_model", "cmd_serve_model"))


def cmd_serve_model(args: argparse.Namespace) -> int:
    from ..layers.kinds import BUILTIN_KINDS

    mapping = kernel_mapping(args.kernel, tuple(k.name for k in BUILTIN_KINDS))  # before the heavy imports
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise KernelHubError("serve-model needs transformers' serving extra: pip install 'transformers[serving]'")
    import torch

    from .kernelized_serving import KernelizedServe, KernelizeSettings, KernelizingLoader

    settings = KernelizeSettings(mapping=mapping, validate=args.validate, strict=args.strict, quantize=args.quantize,
                                 trust_remote_code=trust_setting(args.trust_remote_code), report_path=args.report)
    accelerator = torch.accelerator.current_accelerator()
    bounds = cache_bounds(CacheBounds(args.cb_block_size, args.cb_num_blocks, args.cb_max_batch_tokens),
                          on_cpu=args.continuous_batching and runs_on_cpu(
                              args.device, None if accelerator is None else accelerator.type))
    loader_args = dict(device=args.device, dtype=args.dtype, attn_implementation=args.attn_implementation,
                       continuous_batching=args.continuous_batching)
    where = f"http://{args.host}:{args.port}/v1"
    try:
        loader = KernelizingLoader(settings, **loader_args)
        print(f"kernel-hub serve-model: loading {args.model} and kernelizing it, then serving it on {where}",
              flush=True)
        KernelizedServe(loader, force_model=args.model, **loader_args, max_model_len=args.max_model_len,
                        cb_block_size=bounds.block_size, cb_num_blocks=bounds.num_blocks,
                        cb_max_batch_tokens=bounds.max_batch_tokens, host=args.host, port=args.port,
                        log_level=args.log_level, default_seed=args.default_seed)
    except (OSError, ValueError, RuntimeError) as exc:  # no such model, a setting transformers refuses, or the model's
        # process failed (it logged the traceback)
        raise KernelHubError(f"{args.model}: {exc}") from None
    return 0
