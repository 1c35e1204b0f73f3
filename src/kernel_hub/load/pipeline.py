"""The load pipeline: a plan (source, resolution, variant) -> the trust check -> fetch and verify -> its
kernel-depends loaded the same way -> import -> (validate). get_kernel, lock and publish all load through here."""

from __future__ import annotations

import logging
from types import ModuleType

from ..decide.variants import choose_variant
from ..decide.versions import Resolution
from ..sources.base import LocalSource
from ..verify.validation import require_valid
from .depends import Graph, hf_kernel_deps, load_dependency, walk
from .loader import import_build, survive_prune
from .planning import Plan, plan_load, system_for
from .trust import NOTHING_EXTRA

_log = logging.getLogger("kernel_hub")


def load_plan(plan: Plan, *, validate: bool = False) -> ModuleType:
    """Fetch, verify and import the planned build (Plan.fetch: only a plan whose origin passed a trust policy);
    optionally validate it here.

    A kernel-builder build's `kernel-depends` load first, each through this same path (plan under the same policy,
    trust, fetch, verify, import) on the same source, each once per graph and at most depends.MAX_DEPENDS_DEPTH
    levels deep; the kernel finds them as `__kernel_deps__` and, where HF `kernels` is installed, through its
    `get_kernel_dep` while it imports."""
    build = survive_prune(plan.fetch, plan.fetch, plan.repo_id)
    with walk(plan.repo_id) as graph:
        deps = _load_kernel_depends(graph, plan, build.kernel_depends)
    with hf_kernel_deps(deps):
        module = survive_prune(lambda: import_build(build), lambda: import_build(plan.fetch()), plan.repo_id)
    if deps:
        module.__kernel_deps__ = deps  # type: ignore[attr-defined]
    origin = plan.origin
    served = f"{origin.kind} {origin.location}"  # e.g. "hub http://127.0.0.1:8080", "local /…/kernels/pallas/x"
    module.__kernel_hub_source__ = served  # type: ignore[attr-defined]
    _log.info("kernel-hub: %s %s [%s] served by %s (%s)", plan.repo_id, build.version or build.commit[:12],
              build.variant.name, served, plan.source.describe())
    if validate:
        require_valid(module, backend=plan.system.backend)
    return module


def _load_kernel_depends(graph: Graph, plan: Plan, depends: tuple[tuple[str, str, str], ...]
                         ) -> dict[str, ModuleType]:
    """Every kernel a build depends on, loaded as get_kernel loads it, from the same source, once per graph."""
    out: dict[str, ModuleType] = {}
    hub_like = plan.origin.kind == "hub"
    for repo_id, kind, value in depends:
        def load(repo_id: str = repo_id, kind: str = kind, value: str = value) -> ModuleType:
            dep_plan = plan_load(repo_id, version=int(value) if kind == "version" else None,
                                 revision=value if kind == "revision" else None, framework=plan.framework,
                                 system=plan.system, source=plan.source if hub_like else None,
                                 trust=plan.trust)
            return load_plan(dep_plan)

        key = (repo_id, kind, str(value), plan.framework)
        out[repo_id] = load_dependency(graph, repo_id, key, f"{kind} {value}", load)
    return out


def load_local(source: LocalSource, *, backend: str | None = None, framework: str = "jax",
               validate: bool = False) -> ModuleType:
    """Load a kernel folder already read (publish reads its folder once and loads what it read)."""
    meta = source.metadata
    system = system_for(None, framework, backend)
    resolution = Resolution(source.commit, f"v{meta.version}", meta.version, f"local folder {source.kernel_dir}")
    choice = choose_variant(list(meta.variants), system, framework)
    plan = Plan(meta.repo_id, source, resolution, choice, system, framework)
    return load_plan(plan.trusted(NOTHING_EXTRA), validate=validate)  # a local folder: trusted as the user's own
