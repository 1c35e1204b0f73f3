"""Every command's parser, in one light module: `kernel-hub --help` and a usage error import no command (nor jax,
numpy, huggingface_hub or the server). Each parser names its command as a Command (module, function) in the
command group's module: catalog (list, info, resolve), loading (validate, download, lock), authoring (init,
publish), tools (bench, demo, report), serve; that module is imported when the command runs."""

from __future__ import annotations

import argparse
import importlib
import os
from dataclasses import dataclass

from .. import __version__
from ..scaffold import DEFAULT_TEMPLATE, TEMPLATES
from . import cache, serve_model, setup_tpu
from .common import (
    Parser,
    add_json_arg,
    add_trust_arg,
    add_version_args,
    byte_size,
    seconds_arg,
    tpu_generations,
)


@dataclass(frozen=True)
class Command:
    """A command by name: `module` (a command group under kernel_hub.cli) is imported when it runs."""

    module: str
    name: str

    def __call__(self, args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.name)(args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kernel-hub",
        description="Load, verify, validate and publish accelerator kernels (Pallas first) on the Hugging Face Hub.",
        epilog="Examples:\n  kernel-hub list\n  kernel-hub resolve kernel-hub/ragged-dot-tpu --backend tpu "
        "--tpu-generation v5e\n  kernel-hub validate kernel-hub/ragged-dot-tpu\n  kernel-hub demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--registry", help="registry.yaml to use (default: the embedded one, or $KERNEL_HUB_REGISTRY)")
    parser.add_argument("-V", "--version", action="version", version=f"kernel-hub {__version__}",
                        help="print kernel-hub's version and exit (after a command, --version is a kernel's version "
                        "spec)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("list", help="kernels in the registry", description="List the kernels the registry knows.")
    p.add_argument("--hub", metavar="ORG", help="list the repos an endpoint holds for this organisation instead")
    p.add_argument("--endpoint", help="Hub endpoint for --hub (default: $HF_ENDPOINT or huggingface.co)")
    add_json_arg(p, "the registry")
    p.set_defaults(func=Command("catalog", "cmd_list"))

    p = sub.add_parser("init", help="start a new kernel folder from a template",
                       description="Write DIR/NAME/: kernel.yaml, the package (a small working Pallas kernel with "
                       "its reference, a CPU path and interpret support, the contract hooks), validation cases, "
                       "TPU compile cases, a torch entry, tests and a card with the commands to run next. The "
                       "folder needs nothing beside it. Refuses a bad name or an existing folder, writing nothing.")
    p.add_argument("name", help="kernel and package name (a Python name, e.g. my_kernel)")
    p.add_argument("--dir", default=".", help="where to create NAME/ (default: the current folder)")
    p.add_argument("--op", "--template", dest="template", default=DEFAULT_TEMPLATE, metavar="|".join(TEMPLATES),
                   help="which op to start from: unary (silu(x)), binary (axpy(x, y, alpha)), matmul, attention "
                        f"(default: {DEFAULT_TEMPLATE})")
    p.add_argument("--repo", help="repo id written to kernel.yaml (default: my-org/NAME)")
    p.set_defaults(func=Command("authoring", "cmd_init"))

    p = sub.add_parser("info", help="one kernel: metadata, refs, variants, TPU compile record",
                       description="Show a kernel's metadata, its refs (tags, branches) and build variants, and for "
                       "each TPU variant of a release the compile matrix publish recorded (generations, jax and "
                       "libtpu versions, cases compiled per generation), or 'not compiled for TPU'.")
    p.add_argument("repo", help="repo id, e.g. kernel-hub/ragged-dot-tpu")
    add_json_arg(p)
    p.set_defaults(func=Command("catalog", "cmd_info"))

    p = sub.add_parser("resolve", help="print the version and variant decisions (the trace)",
                       description="Resolve a version spec to a commit and choose the build variant for this "
                       "system (or a simulated one), printing every variant accepted or rejected and why.")
    p.add_argument("repo", help="repo id")
    add_version_args(p)
    p.add_argument("--tpu-generation", help="simulate a TPU generation (v4, v5e, v5p, v6e, v7x); implies --backend tpu")
    p.add_argument("--jax-version", help="simulate an installed jax version")
    p.add_argument("--torch-version", help="simulate an installed torch version")
    add_json_arg(p, "the decisions")
    p.set_defaults(func=Command("catalog", "cmd_resolve"))

    p = sub.add_parser("validate", help="check a kernel's numbers against its reference here",
                       description="Run the kernel's validation cases on this backend against its reference "
                       "(tolerance by dtype; NaN never passes). Exit 1 if any case fails.")
    p.add_argument("repo", nargs="?", default="kernel-hub/ragged-dot-tpu", help="repo id (default: the ragged dot)")
    p.add_argument("--path", help="validate a local kernel folder instead of a repo")
    add_version_args(p)
    p.add_argument("--lockfile", help="load exactly what this lock file records (see kernel-hub lock)")
    add_trust_arg(p)
    p.add_argument("--tag", action="append", default=[], help="only cases with this tag (decode, prefill, edge, ...)")
    p.add_argument("--seed", type=int, help="random seed for the inputs (default: fresh; printed, and recorded in "
                   "the JSON, so a run can be repeated)")
    p.add_argument("--tpu", metavar="GENS", type=tpu_generations,
                   help="also compile every TPU case with the real TPU compiler for these generations, e.g. "
                   "v5e,v6e (also v4, v5p, v7x); needs the TPU environment (kernel-hub setup-tpu)")
    add_json_arg(p, "the report")
    p.set_defaults(func=Command("loading", "cmd_validate"))

    p = sub.add_parser("download", help="fetch and verify the build that fits, without importing it",
                       description="Resolve, choose the variant and fetch only its files into the cache, "
                       "checking every sha256. Prints where the package is. Imports nothing.")
    p.add_argument("repo", help="repo id")
    add_version_args(p)
    p.add_argument("--lockfile", help="fetch exactly what this lock file records")
    add_json_arg(p)
    p.set_defaults(func=Command("loading", "cmd_download"))

    p = sub.add_parser("lock", help="pin kernels to a commit and variant with every file's sha256",
                       description="Resolve each kernel as get_kernel would (trust check included) and write a "
                       "lock file (repo, spec, version, commit, variant, where it came from, sha256 of every file). "
                       "kernel_hub.get_locked_kernel loads exactly that.")
    p.add_argument("repos", nargs="*", help="ORG/NAME repo ids (default: every kernel in the registry)")
    add_version_args(p)
    p.add_argument("--output", "-o", default=os.environ.get("KERNEL_HUB_LOCK") or "kernel-hub.lock",
                   help="lock file (default kernel-hub.lock, or $KERNEL_HUB_LOCK)")
    add_trust_arg(p)
    add_json_arg(p, "what was locked")
    p.set_defaults(func=Command("loading", "cmd_lock"))

    p = sub.add_parser("publish", help="build, validate and upload a kernel folder to the Hub",
                       description="Build the HF kernels-compatible layout of a kernel folder (build/<variant>/ ...), "
                       "validate it on this machine, compile every TPU case for each generation its TPU variants "
                       "declare (the real TPU compiler in the TPU environment, kernel-hub setup-tpu; the matrix is "
                       "recorded in the release), upload it through huggingface_hub, tag v<version> and move "
                       "branch v<major>. An existing version with different content is refused; the same content "
                       "is a no-op.")
    p.add_argument("path", help="kernel folder holding kernel.yaml (e.g. kernels/pallas/ragged_dot)")
    p.add_argument("--repo", help="ORG/NAME on the Hub (default: repo_id in kernel.yaml)")
    p.add_argument("--endpoint", help="Hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token", help="write token (default: $HF_TOKEN or the saved login)")
    p.add_argument("--skip-validation", action="store_true", help="publish without validating (says so)")
    p.add_argument("--skip-tpu-compile", action="store_true",
                   help="publish TPU variants without the TPU compile gate (says so; recorded as 'not compiled')")
    add_json_arg(p)
    p.set_defaults(func=Command("authoring", "cmd_publish"))

    p = sub.add_parser("bench", help="run a kernel's benchmark against its alternatives",
                       description="Run the benchmark script the registry names for a kernel (medians of "
                       "interleaved runs, ratio table, JSON out). Arguments after the repo go to the script, "
                       "e.g. kernel-hub bench kernel-hub/ragged-dot-tpu --quick.")
    p.add_argument("repo", help="repo id")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the script (try --help)")
    p.set_defaults(func=Command("tools", "cmd_bench"))

    p = sub.add_parser("demo", help="load, validate and race the ragged dot (offline)",
                       description="Load the ragged-dot kernel from the embedded registry, validate it here, run "
                       "a decode-shaped MoE ragged dot through it and through jax.lax.ragged_dot, check they agree "
                       "and print timings and the ratio. Needs no network and no token.")
    p.add_argument("--quick", action="store_true",
                   help="one validation case per mode and dtype (of the ~40), fewer timing repetitions")
    p.set_defaults(func=Command("tools", "cmd_demo"))

    p = sub.add_parser("report", help="validation dashboard: report.json and a static index.html",
                       description="Validate every registry kernel on every mode this machine offers (CPU paths, "
                       "Pallas interpreted, the TPU simulator with race detection, torch entries), compile TPU cases "
                       "per generation when the TPU environment is there (kernel-hub setup-tpu), kernelize a tiny "
                       "model of every covered family (transformers MoE and attention, Diffusers), run the benches, "
                       "and write OUT/report.json (schema: docs/report-schema.json) and OUT/index.html (open it in "
                       "a browser; no server). A full report takes several minutes, --quick about one.")
    p.add_argument("--out", default="report", help="output folder (default: ./report)")
    p.add_argument("--quick", action="store_true",
                   help="one case per mode and dtype, TPU smoke cases for v5e, three families, one bench")
    p.add_argument("--seed", type=int, help="random seed for the validation inputs (default: fresh; recorded)")
    p.add_argument("--tpu", metavar="GENS", type=tpu_generations,
                   help="TPU generations to compile for (default: all known; --quick: v5e)")
    p.add_argument("--tpu-cases", choices=("smoke", "all"), default="smoke",
                   help="which TPU cases to compile: smoke (each kernel's first forward and backward case; default) "
                   "or all (~60 a kernel: ~10 min a kernel for five generations on 2 cores, then cached)")
    p.add_argument("--families", metavar="NAMES", help="only these families (comma list, e.g. qwen3_moe,llama,flux)")
    p.add_argument("--benches", metavar="NAMES", help="only these benches (comma list, e.g. ragged_dot,attention)")
    p.add_argument("--skip", metavar="SECTIONS", help="leave out sections: validation, compile, families, benches")
    add_json_arg(p, "where the files went and the headline")
    p.set_defaults(func=Command("tools", "cmd_report"))

    _add_serve(sub)
    serve_model.add_parser(sub, Command)
    setup_tpu.add_parser(sub, Command)
    cache.add_parser(sub, Command)
    parser.commands = tuple(sub.choices)
    return parser


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a local store of kernel repos over the Hub HTTP API",
        description="Serve bare git repositories under --store over the subset of the Hugging Face Hub HTTP "
                    "API that huggingface_hub and HF `kernels` use. Point HF_ENDPOINT at it. Writes need "
                    "--token; reads are open unless --read-token-required.",
    )
    p.add_argument("--store", required=True, help="folder holding the repositories (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0: any free port, printed)")
    p.add_argument("--token", default=os.environ.get("KERNEL_HUB_SERVE_TOKEN"),
                   help="token that writes must present (default: $KERNEL_HUB_SERVE_TOKEN; none: read-only)")
    p.add_argument("--read-token-required", action="store_true", help="reads need the token too")
    p.add_argument("--trusted-org", action="append", default=None, metavar="ORG",
                   help="report ORG as a trusted kernel publisher to HF kernels (repeatable; default: the orgs "
                        "$KERNEL_HUB_TRUSTED_ORGS names, none if unset; docs/trust.md)")
    p.add_argument("--max-commit-size", type=byte_size, default=512 << 20, metavar="SIZE",
                   help="largest commit body (default 512M; K/M/G suffixes)")
    p.add_argument("--max-json-size", type=byte_size, default=2 << 20, metavar="SIZE",
                   help="largest body of every other request (default 2M)")
    p.add_argument("--header-timeout", type=seconds_arg, default=10.0, metavar="SECONDS",
                   help="close a connection whose request headers take longer (default 10)")
    p.add_argument("--body-timeout", type=seconds_arg, default=30.0, metavar="SECONDS",
                   help="refuse a body that stalls this long, or averages under 64 KiB/s past it (default 30)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=Command("serve", "cmd_serve"))
