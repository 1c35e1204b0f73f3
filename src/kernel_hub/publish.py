"""`kernel-hub publish`: kernel folder -> checks -> validate -> TPU compile gate -> HF kernels-compatible repo
layout (with the compile matrix in each TPU variant's metadata.json) -> upload -> tag.

The layout (bundles, metadata.json) is buildfmt.py's. A kernel folder is untrusted input too: every name
kernel.yaml gives is checked before it is joined into a path, everything is written under the build's own
temporary folder, and a link leading out of the kernel folder is refused, all before any network call.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.version import Version

from . import buildfmt as fmt
from .errors import IntegrityError, KernelHubError, MetadataError, ValidationFailedError
from .integrity import not_source_reason
from .metadata import METADATA_FILE, KernelMetadata, load_metadata
from .names import check_repo_id, safe_join, safe_rmtree
from .vendoring import assembled_files

CARD = "README.md"


@dataclass
class Layout:
    root: Path
    metadata: KernelMetadata
    files: list[str] = field(default_factory=list)   # repo paths, POSIX

    def blob_ids(self, prefix: str = "") -> dict[str, str]:
        return {p: fmt.git_blob_id(self.root / p) for p in self.files if p.startswith(prefix)}


@dataclass
class PublishResult:
    repo_id: str
    version: str
    commit: str
    tag: str
    branch: str
    branch_moved: bool
    variants: list[str]
    unchanged: bool
    validated: bool

    def summary(self) -> str:
        if self.unchanged:
            return (f"{self.repo_id} {self.tag} is already published with this content at {self.commit[:12]}: "
                    "nothing to do")
        branch = (f"branch {self.branch} -> {self.commit[:12]}" if self.branch_moved
                  else f"branch {self.branch} kept (it holds a newer release)")
        return (f"published {self.repo_id} {self.tag} at {self.commit[:12]} "
                f"(variants: {', '.join(self.variants)}); tag {self.tag}; {branch}")


def kernel_file(kernel_dir: Path, name: str) -> Path | None:
    """A file of the kernel folder publish reads (kernel.yaml, the card), refused where it is a link that leads
    out of the folder: nothing outside it may be uploaded."""
    path = kernel_dir / name
    if not path.is_file():
        return None
    target = path.resolve()
    if kernel_dir not in target.parents:
        raise IntegrityError(f"{kernel_dir}: {name} is a link to {target}, outside the kernel folder")
    return path


def checked_metadata(kernel_dir: Path) -> KernelMetadata:
    """kernel.yaml, a plain file inside the kernel folder; every name publish later joins into a path (repo_id,
    python_name, variant names and entries, each variant once) is checked by its schema (metadata.KernelSchema, the
    rules in names.py) as it loads."""
    kernel_file(kernel_dir, METADATA_FILE)
    return load_metadata(kernel_dir)


def package_sources(kernel_dir: Path, meta: KernelMetadata) -> dict[str, Path]:
    """What the package ships: relative path -> the file to copy (vendoring.assembled_files: the package as a local
    load assembles it, links out of the kernel folder refused), nothing that runs without its source (bytecode,
    native code, .pth)."""
    out = assembled_files(kernel_dir, meta)
    for rel in out:
        reason = not_source_reason(rel)
        if reason is not None:
            raise IntegrityError(f"{kernel_dir / meta.python_name}: {rel} is {reason}; a build ships Python source "
                                 "only")
    return out


def checked_sources(kernel_dir: Path, meta: KernelMetadata) -> dict[str, Path]:
    """package_sources, with every variant's entry among them: all a build needs, checked before any of the
    kernel's code runs (validation, the TPU compile gate) and before any network call."""
    kernel_file(kernel_dir, CARD)
    sources = package_sources(kernel_dir, meta)
    for variant in meta.variants:
        if variant.entry not in sources:
            raise MetadataError(f"variant {variant.name}: entry {variant.entry} not found in {meta.python_name}/")
    return sources


def build_layout(kernel_dir: Path, out: Path, tpu_compile: Mapping[str, dict[str, Any]] | None = None) -> Layout:
    """Write the repo layout of `kernel_dir` under `out` (see buildfmt). Every path is built with safe_join
    under `out`, every delete is safe_rmtree inside `out`, and links out of the kernel folder are refused.
    `tpu_compile`: variant name -> the TPU compile record its metadata.json carries (publish's gate)."""
    kernel_dir = Path(kernel_dir).resolve()
    meta = checked_metadata(kernel_dir)
    card = kernel_file(kernel_dir, CARD)
    sources = checked_sources(kernel_dir, meta)
    layout = Layout(out, meta)
    for variant in meta.variants:
        entry = sources[variant.entry]
        vdir = safe_join(out, fmt.BUILD_DIR, variant.name)
        pdir = safe_join(vdir, meta.python_name)
        for rel, src in sources.items():
            dest = safe_join(pdir, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        shutil.copyfile(entry, safe_join(pdir, "__init__.py"))  # the entry is the package root
        data = fmt.build_metadata(repo_id=meta.repo_id, version=meta.version, python_name=meta.python_name,
                                  license=meta.license, variant=variant, variant_dir=vdir,
                                  tpu_compile=(tpu_compile or {}).get(variant.name))
        safe_join(vdir, fmt.VARIANT_METADATA).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        fmt.write_bundle(vdir, safe_join(out, fmt.bundle_path(variant.name)))
        layout.files.append(fmt.bundle_path(variant.name))
        if variant.framework == "torch":
            layout.files += sorted(p.relative_to(out).as_posix() for p in vdir.rglob("*") if p.is_file())
        else:
            safe_rmtree(out, vdir)
    shutil.copyfile(kernel_dir / METADATA_FILE, safe_join(out, METADATA_FILE))
    layout.files.append(METADATA_FILE)
    safe_join(out, CARD).write_text(card.read_text() if card is not None else _card(meta))
    layout.files.append(CARD)
    return layout


def _card(meta: KernelMetadata) -> str:
    variants = "\n".join(f"- `{v.name}` ({v.framework} on {v.backend})" for v in meta.variants)
    return (f"---\nlicense: {meta.license or 'unknown'}\ntags:\n- kernel\n- kernel-hub\n---\n\n# {meta.name}\n\n"
            f"{meta.description}\n\nVersion {meta.version}. Variants:\n\n{variants}\n\n"
            f"```python\nimport kernel_hub as kh\nk = kh.get_kernel({meta.repo_id!r}, "
            f"version={Version(meta.version).major})\n```\n")


def check_endpoint(endpoint: str | None) -> None:
    """An endpoint is an http(s) URL with a host."""
    if endpoint is None:
        return
    url = urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise KernelHubError(f"--endpoint must be an http(s) URL like http://127.0.0.1:8080, got {endpoint!r}")


def check_access(hub: Any, repo_id: str) -> None:
    """The endpoint answers and accepts the token (one whoami request), or one line saying which is wrong."""
    from huggingface_hub import get_token

    if not (hub.api.token or get_token()):
        raise KernelHubError(f"publishing {repo_id} to {hub.endpoint} needs a write token: pass --token or set "
                             "HF_TOKEN")
    hub._call(repo_id, "checking the endpoint and token (whoami)", hub.api.whoami)


def validate_local(kernel_dir: Path, log: Callable[[str], None]) -> list[str]:
    """Validate every variant that runs on this machine; raise when one fails or none can run."""
    from .api import get_local_kernel
    from .system import detect
    from .validation import validate
    from .variants import judge

    meta = load_metadata(kernel_dir)
    ran = []
    for framework in sorted({v.framework for v in meta.variants}):
        facts = detect(framework)
        fitting = [v for v in meta.variants if v.framework == framework and judge(v, facts, framework).accepted]
        if not fitting:
            continue
        module = get_local_kernel(kernel_dir, framework=framework, backend=facts.backend)
        report = validate(module, backend=facts.backend)
        failed = [c.name for c in report.cases if not c.passed]
        if failed:
            raise ValidationFailedError(
                f"{meta.repo_id} {meta.version} [{fitting[0].name}] fails validation on {facts.backend} "
                f"({', '.join(failed[:5])}); not publishing (--skip-validation overrides)"
            )
        log(f"validated {fitting[0].name}: {len(report.cases)} cases passed on {facts.backend}")
        ran.append(fitting[0].name)
    if not ran:
        raise ValidationFailedError(
            f"{meta.repo_id}: no variant can run on this machine to validate it; pass --skip-validation"
        )
    return ran


def publish(kernel_dir: str | Path, *, repo_id: str | None = None, endpoint: str | None = None,
            token: str | None = None, skip_validation: bool = False, skip_tpu_compile: bool = False,
            tpu_jobs: int | None = None, log: Callable[[str], None] = print) -> PublishResult:
    """Validate, compile every TPU variant for its generations (tpu/release_gate.py), build, upload, tag
    `v<version>` and move branch `v<major>` (never backwards). The TPU compile matrix goes into each TPU
    variant's metadata.json; `skip_tpu_compile` publishes them marked "not compiled" instead."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    from .hub import HubSource
    from .tpu.release_gate import gate_environment, run_gate

    kernel_dir = Path(kernel_dir)
    if not kernel_dir.is_dir():
        raise KernelHubError(f"{kernel_dir} is not a kernel folder (a folder holding {METADATA_FILE})")
    kernel_dir = kernel_dir.resolve()
    meta = checked_metadata(kernel_dir)
    repo_id = check_repo_id(repo_id or meta.repo_id, "--repo")
    check_endpoint(endpoint)
    version, tag = Version(meta.version), f"v{meta.version}"
    branch = f"v{version.major}"
    checked_sources(kernel_dir, meta)  # links, bytecode, entries: refused before any of the kernel's code runs
    # Fail fast: everything that takes a second to check is checked before the minutes of validating and compiling.
    tpu = gate_environment(kernel_dir, meta, skip=skip_tpu_compile)
    hub = HubSource(endpoint=endpoint, token=token)
    check_access(hub, repo_id)
    if skip_validation:
        log("skipping validation (--skip-validation): publishing without checking the numbers")
    else:
        validate_local(kernel_dir, log)
    records = run_gate(kernel_dir, meta, skip=skip_tpu_compile, log=log, env=tpu, jobs=tpu_jobs)
    with tempfile.TemporaryDirectory(prefix="kernel-hub-publish-") as tmp:
        layout = build_layout(kernel_dir, Path(tmp), records)  # every name and file checked before any network call
        variants = [v.name for v in meta.variants]
        api = hub.api
        hub._call(repo_id, "creating the repo",
                  lambda: api.create_repo(repo_id, repo_type=fmt.REPO_TYPE, exist_ok=True))
        refs = hub._call(repo_id, "listing refs", lambda: api.list_repo_refs(repo_id, repo_type=fmt.REPO_TYPE))
        tags = {t.name: t.target_commit for t in refs.tags}
        branches = {b.name: b.target_commit for b in refs.branches}
        local = layout.blob_ids(f"{fmt.BUILD_DIR}/")
        if tag in tags:
            remote = _remote_blob_ids(hub, repo_id, tags[tag])
            if remote != local:
                changed = sorted(set(remote) ^ set(local)) or sorted(p for p in local if remote[p] != local[p])
                raise KernelHubError(
                    f"{repo_id} {tag} is already published with different content ({changed[0]} differs); "
                    f"bump the version in {kernel_dir / METADATA_FILE}"
                )
            return PublishResult(repo_id, meta.version, tags[tag], tag, branch, False, variants, True,
                                 not skip_validation)
        stale = [p for p in _remote_blob_ids(hub, repo_id, branches.get("main", "main")) if p not in local]
        ops: list = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(layout.root / p)) for p in layout.files]
        ops += [CommitOperationDelete(path_in_repo=p) for p in stale]
        info = hub._call(repo_id, "uploading", lambda: api.create_commit(
            repo_id, ops, commit_message=f"Publish {meta.name} {meta.version}", repo_type=fmt.REPO_TYPE,
            revision="main"))
        commit = info.oid
    hub._call(repo_id, f"tagging {tag}", lambda: api.create_tag(
        repo_id, tag=tag, revision=commit, repo_type=fmt.REPO_TYPE, tag_message=f"{meta.name} {meta.version}"))
    moved = _move_branch(hub, repo_id, branch, commit, version, branches.get(branch), tags)
    return PublishResult(repo_id, meta.version, commit, tag, branch, moved, variants, False, not skip_validation)


def _remote_blob_ids(hub, repo_id: str, revision: str) -> dict[str, str]:
    from huggingface_hub.hf_api import RepoFile

    def listing() -> list:
        try:
            return list(hub.api.list_repo_tree(repo_id, path_in_repo=fmt.BUILD_DIR, recursive=True,
                                               repo_type=fmt.REPO_TYPE, revision=revision))
        except Exception as exc:  # no build/ folder yet on a fresh repo
            from huggingface_hub.errors import RemoteEntryNotFoundError

            if isinstance(exc, RemoteEntryNotFoundError):
                return []
            raise

    entries = hub._call(repo_id, f"listing {fmt.BUILD_DIR}/ at {revision[:12]}", listing)
    return {e.path: e.blob_id for e in entries if isinstance(e, RepoFile)}


def _move_branch(hub, repo_id: str, branch: str, commit: str, version: Version, current: str | None,
                 tags: dict[str, str]) -> bool:
    """Point the major branch at `commit` unless it holds a newer release of that major."""
    from .versions import tag_version

    if current is not None:
        held = [v for name, c in tags.items() if c == current and (v := tag_version(name)) is not None]
        if held and max(held) > version:
            return False
        if current == commit:
            return True
        hub._call(repo_id, f"moving branch {branch}",
                  lambda: hub.api.delete_branch(repo_id, branch=branch, repo_type=fmt.REPO_TYPE))
    hub._call(repo_id, f"creating branch {branch}",
              lambda: hub.api.create_branch(repo_id, branch=branch, revision=commit, repo_type=fmt.REPO_TYPE))
    return True
