"""`kernel-hub init`: a new kernel folder from a template, standalone (it needs nothing beside it).

Templates are package data (templates/<name>/ over templates/_shared/; `*.tmpl` files are rendered and lose the
suffix, `__pkg__` becomes the package name). `plan_init` decides (pure, returns the refusal's reason); `init`
writes the whole folder aside (`.NAME-init-<id>`, made with the user's umask like any folder) and renames it into
place, so a refusal or a failure leaves nothing behind; a staging folder a killed init left is removed by the next
init in that folder.
"""

from __future__ import annotations

import keyword
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import KernelHubError
from ..names import check_python_name, check_repo_id, safe_rmtree

#: The ops `init --op` writes, each a template folder: one input, two inputs, a matmul, attention.
TEMPLATES = ("unary", "binary", "matmul", "attention")
DEFAULT_TEMPLATE = "binary"
#: Older template names still accepted.
ALIASES = {"elementwise": "binary"}
#: What each template's op is called and what it computes (the card and kernel.yaml's description).
OPS = {"unary": ("silu", "x * sigmoid(x) (SiLU), elementwise."),
       "binary": ("axpy", "alpha * x + y, elementwise."),
       "matmul": ("matmul", "A tiled matmul (a @ b) with float32 accumulation."),
       "attention": ("attention", "Scaled dot-product attention (optionally causal), one softmax pass per query "
                     "block.")}
#: Longest kernel name: the rendered files keep within the 120-column lines of kernel-hub's ruff config.
MAX_NAME = 40
#: Names a kernel package must not take: they would shadow what it imports or what kernel-hub vendors into it.
RESERVED = frozenset({"jax", "jaxlib", "torch", "numpy", "kernels", "kernel_hub", "tests", "test", "build"})
#: A staging folder of init (this version's `.NAME-init-<32 hex>`, or an older mkdtemp one's 8 characters).
_STAGING = re.compile(r"\.[A-Za-z][A-Za-z0-9_]*-init-(?:[0-9a-f]{32}|[a-z0-9_]{8})")
#: A staging folder older than this is a killed init's (an init writes a few files in well under a second).
STALE_STAGING_SECONDS = 60.0


class InitError(KernelHubError):
    """`kernel-hub init` refused: a bad name, template or target folder. Nothing was written."""


@dataclass(frozen=True)
class InitPlan:
    name: str
    template: str
    target: Path
    repo_id: str


def plan_init(name: str, directory: str | Path = ".", template: str = DEFAULT_TEMPLATE,
              repo_id: str | None = None) -> InitPlan:
    """What `init` would write, or InitError naming what to fix (checks only; writes nothing)."""
    try:
        check_python_name(name, "kernel name")
    except KernelHubError as exc:
        raise InitError(f"{exc} (a kernel name is a Python package name: letters, digits, _)") from None
    if keyword.iskeyword(name) or name.startswith("_") or name.lower() in RESERVED:
        why = "a Python keyword" if keyword.iskeyword(name) else (
            "private (leading _)" if name.startswith("_") else "a name its imports use")
        raise InitError(f"kernel name {name!r} is {why}; pick another")
    if name in sys.stdlib_module_names or name.lower() in sys.stdlib_module_names:
        raise InitError(f"kernel name {name!r} is a standard-library module: the kernel would shadow it for "
                        "everything imported beside it; pick another")
    if len(name) > MAX_NAME:
        raise InitError(f"kernel name {name!r} is {len(name)} characters; keep it to {MAX_NAME}")
    template = ALIASES.get(template, template)
    if template not in TEMPLATES:
        raise InitError(f"unknown --op {template!r}; known: {', '.join(TEMPLATES)}")
    repo_id = repo_id or f"my-org/{name.replace('_', '-')}"
    try:
        check_repo_id(repo_id, "--repo")
    except KernelHubError as exc:
        raise InitError(str(exc)) from None
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InitError(f"--dir {directory} is a file; name a folder")
    target = directory / name
    if os.path.lexists(target):
        raise InitError(f"{target} already exists; pick another name or --dir (init never overwrites)")
    return InitPlan(name, template, target, repo_id)


def _template_files(template: str) -> dict[str, bytes]:
    """Relative path (with `__pkg__` and `.tmpl` still in it) -> content: _shared/ overlaid by the template."""
    root = resources.files(__package__) / "templates"
    out: dict[str, bytes] = {}
    for layer in ("_shared", template):
        stack = [(root / layer, "")]
        while stack:
            node, rel = stack.pop()
            for child in node.iterdir():
                if child.name == "__pycache__":
                    continue
                path = f"{rel}{child.name}"
                if child.is_dir():
                    stack.append((child, f"{path}/"))
                else:
                    out[path] = child.read_bytes()
    return out


def render(plan: InitPlan) -> dict[str, str]:
    """Every file of the new kernel folder: relative path -> text."""
    op, description = OPS[plan.template]
    values = {"name": plan.name, "repo_id": plan.repo_id, "template": plan.template, "op": op,
              "description": description}
    out = {}
    for rel, data in _template_files(plan.template).items():
        text = data.decode()
        for key, value in values.items():
            text = text.replace(f"@@{key}@@", value)
        out[rel.replace("__pkg__", plan.name).removesuffix(".tmpl")] = text
    return out


def init(name: str, directory: str | Path = ".", template: str = DEFAULT_TEMPLATE,
         repo_id: str | None = None) -> Path:
    """Write DIR/NAME/ from `template`; returns it. Refuses (InitError, nothing written) a bad name or template or
    an existing target."""
    plan = plan_init(name, directory, template, repo_id)
    files = render(plan)
    plan.target.parent.mkdir(parents=True, exist_ok=True)
    clean_staging(plan.target.parent)
    staging = plan.target.parent / f".{name}-init-{uuid.uuid4().hex}"
    os.mkdir(staging)  # mode 0o777 less the umask, as the user's other folders (mkdtemp would make it 0700)
    try:
        for rel, text in files.items():
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        if os.path.lexists(plan.target):  # appeared meanwhile
            raise InitError(f"{plan.target} already exists; pick another name or --dir (init never overwrites)")
        os.rename(staging, plan.target)
    finally:
        if staging.exists():
            safe_rmtree(plan.target.parent, staging)
    return plan.target


def clean_staging(directory: Path, now: float | None = None) -> list[Path]:
    """Remove the staging folders killed inits left in `directory`: only folders (never links) named as init
    names them, older than STALE_STAGING_SECONDS, only inside `directory`. Returns what was removed."""
    now = time.time() if now is None else now
    removed = []
    for entry in directory.iterdir():
        if not _STAGING.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            if now - entry.lstat().st_mtime > STALE_STAGING_SECONDS:
                safe_rmtree(directory, entry)
                removed.append(entry)
        except OSError:
            continue
    return removed
