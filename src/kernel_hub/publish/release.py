"""`kernel-hub publish`: kernel folder -> checks -> validate -> TPU compile gate -> HF kernels-compatible repo
layout (with the compile matrix in each TPU variant's metadata.json) -> upload -> tag.

The folder is read once (folder.read_kernel_folder: kernel.yaml, every file the package ships and its sha256) into a
KernelFolder that every later stage takes: validation loads it, the TPU gate compiles it, the layout copies it
and checks each copy against the digest read at the start, so what was validated is what is uploaded. The Hub
is reached through HubClient (sources/hub/client.py) only. The layout (bundles, metadata.json) is
buildfmt.py's. A kernel folder is untrusted input too: every name
kernel.yaml gives is checked before it is joined into a path, everything is written under the build's own
temporary folder, and a link leading out of the kernel folder is refused, all before any network call.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from packaging.version import Version

from ..decide.system import detect
from ..decide.variants import judge
from ..decide.versions import tag_version
from ..errors import (
    IntegrityError,
    KernelHubError,
    KernelNotFoundError,
    RefMovedError,
    ValidationFailedError,
)
from ..json_types import JsonDict
from ..load.pipeline import load_local
from ..names import check_repo_id, safe_join, safe_rmtree
from ..package import buildfmt as fmt
from ..package.integrity import sha256_file
from ..package.metadata import METADATA_FILE, KernelMetadata
from ..package.symbols import SYMBOLS_FILE, build_symbols
from ..sources.hub.client import HubClient
from ..sources.hub.source import published_metadata
from ..ui.progress import Progress
from ..verify.validation import validate
from .folder import CARD, KernelFolder, read_kernel_folder
from .identity import identical_release, record_paths
from .tpu_gate import gate_environment, run_gate


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
    repaired: bool = False  # the release was there, its branch was not (a killed publish): the branch was moved

    def summary(self) -> str:
        if self.repaired:
            return (f"{self.repo_id} {self.tag} was already published at {self.commit[:12]}; branch {self.branch} "
                    f"did not hold it and now does")
        if self.unchanged:
            return (f"{self.repo_id} {self.tag} is already published with this content at {self.commit[:12]}: "
                    "nothing to do")
        branch = (f"branch {self.branch} -> {self.commit[:12]}" if self.branch_moved
                  else f"branch {self.branch} kept (it holds a newer release)")
        return (f"published {self.repo_id} {self.tag} at {self.commit[:12]} "
                f"(variants: {', '.join(self.variants)}); tag {self.tag}; {branch}")


def build_layout(kernel_dir: Path, out: Path, tpu_compile: Mapping[str, JsonDict] | None = None) -> Layout:
    """Read `kernel_dir` (read_kernel_folder) and write its repo layout under `out` (write_layout)."""
    return write_layout(read_kernel_folder(kernel_dir), out, tpu_compile)


def write_layout(folder: KernelFolder, out: Path, tpu_compile: Mapping[str, JsonDict] | None = None) -> Layout:
    """Write the repo layout of a kernel folder read once under `out` (see buildfmt). Every path is built with
    safe_join under `out`, every delete is safe_rmtree inside `out`, and every copy must hash to the digest read
    at the start (a file changed since is refused). `tpu_compile`: variant name -> the TPU compile record its
    metadata.json carries (publish's gate)."""
    meta, sources = folder.metadata, folder.files
    layout = Layout(out, meta)
    for variant in meta.variants:
        entry = sources[variant.entry]
        vdir = safe_join(out, fmt.BUILD_DIR, variant.name)
        pdir = safe_join(vdir, meta.python_name)
        for rel, src in sources.items():
            dest = safe_join(pdir, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            if sha256_file(dest) != folder.digests[rel]:
                raise IntegrityError(f"{src} changed while publishing {meta.repo_id}; publish again")
        shutil.copyfile(entry, safe_join(pdir, "__init__.py"))  # the entry is the package root
        if sha256_file(safe_join(pdir, "__init__.py")) != folder.digests[variant.entry]:
            raise IntegrityError(f"{entry} changed while publishing {meta.repo_id}; publish again")
        if variant.framework == "torch":
            write_symbols(folder, variant.entry, vdir)
        data = fmt.build_metadata(repo_id=meta.repo_id, version=meta.version, python_name=meta.python_name,
                                  license=meta.license, variant=variant, variant_dir=vdir,
                                  tpu_compile=(tpu_compile or {}).get(variant.name))
        safe_join(vdir, fmt.VARIANT_METADATA).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        fmt.write_bundle(vdir, safe_join(out, fmt.bundle_path(variant.name)), exclude=frozenset({SYMBOLS_FILE}))
        layout.files.append(fmt.bundle_path(variant.name))
        if variant.framework == "torch":
            layout.files += sorted(p.relative_to(out).as_posix() for p in vdir.rglob("*") if p.is_file())
        else:
            safe_rmtree(out, vdir)
    shutil.copyfile(folder.path / METADATA_FILE, safe_join(out, METADATA_FILE))
    if sha256_file(safe_join(out, METADATA_FILE)) != folder.source.metadata_digest:
        raise IntegrityError(f"{folder.path / METADATA_FILE} changed while publishing {meta.repo_id}; publish again")
    layout.files.append(METADATA_FILE)
    card = folder.card
    safe_join(out, CARD).write_text(card.read_text() if card is not None else _card(meta))
    layout.files.append(CARD)
    return layout


def write_symbols(folder: KernelFolder, entry: str, variant_dir: Path) -> None:
    """symbols.json beside a torch variant's package (HF kernels' `describe-api` reads it; its digest is listed in
    metadata.json), from the source read at the start, nothing imported."""
    data = build_symbols(folder.files, entry)
    safe_join(variant_dir, SYMBOLS_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


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


def check_access(hub: HubClient, repo_id: str) -> None:
    """The endpoint answers and accepts the token (one whoami request), or one line saying which is wrong."""
    from huggingface_hub import get_token

    if not (hub.api.token or get_token()):
        raise KernelHubError(f"publishing {repo_id} to {hub.endpoint} needs a write token: pass --token or set "
                             "HF_TOKEN")
    hub.whoami(repo_id)


def validate_local(folder: KernelFolder, log: Callable[[str], None], live: Progress | None = None) -> list[str]:
    """Validate every variant that runs on this machine, loaded from what was read; raise when one fails or none
    can run. `live` shows each case as it finishes."""
    live = live or Progress()
    meta = folder.metadata
    ran = []
    for framework in sorted({v.framework for v in meta.variants}):
        facts = detect(framework)
        fitting = [v for v in meta.variants if v.framework == framework and judge(v, facts, framework).accepted]
        if not fitting:
            continue
        live.phase(f"loading {fitting[0].name} to validate it", announce=False)
        module = load_local(folder.source, framework=framework, backend=facts.backend)
        report = validate(module, backend=facts.backend,
                          on_start=lambda n, name=fitting[0].name: live.phase(f"validating {name}", n),
                          on_case=lambda i, n, result: live.advance())
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


def early_unchanged(hub: HubClient, folder: KernelFolder, repo_id: str, tag: str, branch: str,
                    version: Version) -> PublishResult | None:
    """Before any validating or compiling: the "nothing to do" result when `tag` already holds this content and
    its branch needs nothing; KernelHubError (bump the version) when `tag` holds other content; None otherwise
    (a new release, or a branch a killed publish left behind: the full path repairs it)."""
    try:
        tags, branches = hub.ref_targets(repo_id)
    except KernelNotFoundError:  # a new repo
        return None
    if tag not in tags:
        return None
    commit = tags[tag]
    with tempfile.TemporaryDirectory(prefix="kernel-hub-publish-") as tmp:
        local = write_layout(folder, Path(tmp)).blob_ids(f"{fmt.BUILD_DIR}/")
    same, reason = identical_release(local, hub.build_blob_ids(repo_id, commit), record_paths(folder.metadata.variants))
    if same is None:  # cannot tell before the gate: the full path decides
        return None
    if not same:
        raise KernelHubError(f"{repo_id} {tag} is already published with different content ({reason}); bump the "
                             f"version in {folder.path / METADATA_FILE}")
    current = branches.get(branch)
    held = _held_version(hub, repo_id, current, tags) if current not in (None, commit) else None
    if current != commit and (held is None or held <= version):
        return None
    variants = [v.name for v in folder.metadata.variants]
    return PublishResult(repo_id, str(version), commit, tag, branch, current == commit, variants, True, False)


def publish(kernel_dir: str | Path, *, repo_id: str | None = None, endpoint: str | None = None,
            token: str | None = None, skip_validation: bool = False, skip_tpu_compile: bool = False,
            tpu_jobs: int | None = None, log: Callable[[str], None] = print,
            progress: Progress | None = None) -> PublishResult:
    """Release a kernel folder: validate it, compile every TPU variant for its generations, build, upload, tag
    `v<version>` and move branch `v<major>` (never backwards), so nothing unvalidated or uncompiled is published.
    A release already published with the same content is left as it is.

    Args:
        kernel_dir: the kernel folder (its kernel.yaml names the repo and version).
        repo_id: publish under this repo instead of kernel.yaml's.
        endpoint: an http(s) Hub or kernel-hub server URL; default: the configured Hub.
        token: a write token (default: huggingface_hub's, e.g. HF_TOKEN).
        skip_validation: publish without running the validation cases.
        skip_tpu_compile: publish TPU variants marked "not compiled" instead of compiling them.
        tpu_jobs: compiler processes at once (default: one per generation, at most one per CPU).
        log: where each line of progress goes.
        progress: a live display told each stage as it starts and each case as it ends.

    Returns:
        The PublishResult: commit, tag, branch, variants, and whether anything changed.

    Raises:
        KernelHubError: a bad folder, a failing validation or compile, or a refused upload, with what to fix.
    """
    live = progress or Progress()
    kernel_dir = Path(kernel_dir)
    if not kernel_dir.is_dir():
        raise KernelHubError(f"{kernel_dir} is not a kernel folder (a folder holding {METADATA_FILE})")
    # links, bytecode, entries: refused before any of the kernel's code runs; the folder is not read again
    folder = read_kernel_folder(kernel_dir)
    meta = folder.metadata
    repo_id = check_repo_id(repo_id or meta.repo_id, "--repo")
    check_endpoint(endpoint)
    version, tag = Version(meta.version), f"v{meta.version}"
    branch = f"v{version.major}"
    # Fail fast: everything that takes a second to check is checked before the minutes of validating and compiling.
    hub = HubClient(endpoint=endpoint, token=token)
    live.phase(f"checking {repo_id} at {hub.endpoint}", announce=False)
    check_access(hub, repo_id)
    done = early_unchanged(hub, folder, repo_id, tag, branch, version)  # needs no TPU environment
    if done is not None:
        log(f"{repo_id} {tag} is already published with this content: not validating or compiling again")
        return done
    tpu = gate_environment(folder, skip=skip_tpu_compile)
    if skip_validation:
        log("skipping validation (--skip-validation): publishing without checking the numbers")
    else:
        validate_local(folder, log, live)
    records = run_gate(folder, skip=skip_tpu_compile, log=log, env=tpu, jobs=tpu_jobs, live=live)
    live.phase(f"uploading {repo_id} {tag}")
    with tempfile.TemporaryDirectory(prefix="kernel-hub-publish-") as tmp:
        layout = write_layout(folder, Path(tmp), records)  # every file checked against what was read
        variants = [v.name for v in meta.variants]
        hub.create_repo(repo_id)
        tags, _ = hub.ref_targets(repo_id)
        unchanged = tag in tags
        if unchanged:
            commit = _same_release(hub, repo_id, tags[tag], layout, tag, folder.path)
        else:
            commit = _commit_release(hub, repo_id, layout, version, f"Publish {meta.name} {meta.version}", folder.path)
            unchanged = not _tag(hub, repo_id, tag, commit, layout, folder.path, f"{meta.name} {meta.version}")
        # A re-run repairs a branch a killed publish left behind (or missing); never moves one backwards.
        moved = _move_branch(hub, repo_id, branch, commit, version, layout)
    return PublishResult(repo_id, meta.version, commit, tag, branch, moved is not False, variants,
                         unchanged and moved is None, not skip_validation, repaired=unchanged and moved is True)


_CAS_TRIES = 20  # compare-and-swap rounds against concurrent publishes before giving up


def _held_version(hub: HubClient, repo_id: str, commit: str, tags: dict[str, str]) -> Version | None:
    """The release a branch's commit holds: its newest `vX.Y.Z` tag, else the kernel.yaml it publishes (a branch
    committed onto by a Hub without compare-and-swap, or a release committed but not yet tagged); None for a
    commit that holds no release (a new repo's first commit)."""
    held = [v for name, c in tags.items() if c == commit and (v := tag_version(name)) is not None]
    if held:
        return max(held)
    published = published_metadata(hub, repo_id, commit)
    try:
        return Version(published.version) if published is not None else None
    except ValueError:
        return None


def _stale(hub: HubClient, repo_id: str, revision: str, layout: Layout) -> list[str]:
    """Files under build/ at `revision` that this release does not have (deleted by a commit of it)."""
    local = set(layout.files)
    return [p for p in hub.build_blob_ids(repo_id, revision) if p not in local]


def _same_release(hub: HubClient, repo_id: str, commit: str, layout: Layout, tag: str, folder: Path) -> str:
    """`commit` when it holds this very release (its build/ files are ours); else the refusal: a version is
    immutable, and a second publish of it with other content moves nothing."""
    remote, local = hub.build_blob_ids(repo_id, commit), layout.blob_ids(f"{fmt.BUILD_DIR}/")
    if remote != local:
        changed = sorted(set(remote) ^ set(local)) or sorted(p for p in local if remote[p] != local[p])
        raise KernelHubError(f"{repo_id} {tag} is already published with different content ({changed[0]} differs); "
                             f"bump the version in {folder / METADATA_FILE}")
    return commit


def _tag(hub: HubClient, repo_id: str, tag: str, commit: str, layout: Layout, folder: Path, message: str) -> bool:
    """Tag the release -> True; False when a concurrent publish of the same content tagged it first (the tag is
    create-only on the Hub); a tag made meanwhile on other content refuses this publish."""
    try:
        hub.create_tag(repo_id, tag, commit, message=message)
        return True
    except KernelHubError:
        tags, _ = hub.ref_targets(repo_id)
        if tag not in tags:
            raise
        if _same_release(hub, repo_id, tags[tag], layout, tag, folder) != commit:
            raise KernelHubError(f"{repo_id} {tag} was published by another publish meanwhile at "
                                 f"{tags[tag][:12]}; this one's commit {commit[:12]} is left untagged") from None
        return False


def _commit_release(hub: HubClient, repo_id: str, layout: Layout, version: Version, message: str,
                    folder: Path) -> str:
    """Commit the release -> its commit id. Onto main, by compare-and-swap on main's head, unless main holds a
    newer release (a concurrent or earlier publish): then onto a short-lived branch made from main and deleted
    once the commit exists (the tag keeps it), so main never goes back to an older release. A tag or main already
    holding this version is the release itself when its content is ours, and a refusal when it is not (decided
    again after every lost compare-and-swap, so two racing publishes of one version never both commit)."""
    tag = f"v{version}"
    for _ in range(_CAS_TRIES):
        tags, branches = hub.ref_targets(repo_id)
        if tag in tags:
            return _same_release(hub, repo_id, tags[tag], layout, tag, folder)
        head = branches["main"]
        held = _held_version(hub, repo_id, head, tags)
        if held == version:  # committed by a publish that has not tagged it yet
            return _same_release(hub, repo_id, head, layout, tag, folder)
        if held is None or held < version:
            try:
                return hub.upload(repo_id, layout.root, layout.files, _stale(hub, repo_id, head, layout), message,
                                  parent=head)
            except RefMovedError:
                continue  # another publish committed first: decide again
        staging = f"kernel-hub-publish-v{version}-{uuid.uuid4().hex[:8]}"
        hub.create_branch(repo_id, staging, head)
        try:
            return hub.upload(repo_id, layout.root, layout.files, _stale(hub, repo_id, head, layout), message,
                              revision=staging)
        finally:
            hub.delete_branch(repo_id, staging)
    raise KernelHubError(f"{repo_id}: main kept moving while publishing {version}; publish again")


def _move_branch(hub: HubClient, repo_id: str, branch: str, commit: str, version: Version,
                 layout: Layout) -> bool | None:
    """Point the major branch at the release `commit` unless it holds a newer release of that major -> True when
    it moved, False when it was kept, None when it already held this release.

    In one step: a compare-and-swap from the head just read (`kernel-hub serve`), so the branch never disappears
    and a concurrent publish's newer move is never overwritten (the loser reads again and decides again). On a
    Hub without it, the release is committed onto the branch (the same files, parent checked), which also moves
    it in one step."""
    for _ in range(_CAS_TRIES):
        tags, branches = hub.ref_targets(repo_id)
        current = branches.get(branch)
        if current == commit:
            return None
        if current is not None:
            held = _held_version(hub, repo_id, current, tags)
            if held is not None and held > version:
                return False
            if held == version and hub.build_blob_ids(repo_id, current) == layout.blob_ids(f"{fmt.BUILD_DIR}/"):
                return None  # committed onto by an earlier run on a Hub without compare-and-swap
        try:
            if hub.move_branch(repo_id, branch, commit, current):
                return True
            assert current is not None  # a Hub creates a missing branch; only an existing one is refused
            hub.upload(repo_id, layout.root, layout.files, _stale(hub, repo_id, current, layout),
                       f"Move {branch} to v{version}", revision=branch, parent=current)
            return True
        except RefMovedError:
            continue
    raise KernelHubError(f"{repo_id}: branch {branch} kept moving while publishing {version}; publish again")
