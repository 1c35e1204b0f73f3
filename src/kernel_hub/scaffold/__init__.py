"""`kernel-hub init`: a new kernel folder from a template, standalone (it needs nothing beside it).

Templates are package data (templates/<name>/ over templates/_shared/; `*.tmpl` files are rendered and lose the
suffix, `__pkg__` becomes the package name). `plan_init` decides (pure, returns the refusal's reason); `init`
writes the whole folder aside and renames it into place, so a refusal or a failure leaves nothing behind.
"""

from __future__ import annotations

import keyword
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import KernelHubError
from ..names import check_python_name, check_repo_id

TEMPLATES = ("elementwise", "matmul", "attention")
DEFAULT_TEMPLATE = "elementwise"
#: What each template's op is called and what it computes (the card and kernel.yaml's description).
OPS = {"elementwise": ("axpy", "alpha * x + y, elementwise."),
       "matmul": ("matmul", "A tiled matmul (a @ b) with float32 accumulation."),
       "attention": ("attention", "Scaled dot-product attention (optionally causal), one softmax pass per query "
                     "block.")}
#: Names a kernel package must not take: they would shadow what it imports or what kernel-hub vendors into it.
RESERVED = frozenset({"jax", "jaxlib", "torch", "numpy", "kernels", "kernel_hub", "tests", "test", "build"})


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
    if template not in TEMPLATES:
        raise InitError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")
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
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-init-", dir=plan.target.parent))
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
            shutil.rmtree(staging)
    return plan.target
