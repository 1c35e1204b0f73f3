"""`kernel-hub publish`: kernel folder -> HF kernels-compatible repo layout -> validate -> upload -> tag.

Layout of one published commit:
  kernel.yaml, README.md                      the source metadata and card
  build/<variant>.tar                         every variant, one file: what kernel-hub downloads
  build/<torch-variant>/metadata.json         torch-facing variants exploded, for HF `kernels`
  build/<torch-variant>/<python_name>/...     (entry file as the package __init__)
JAX-facing variants exist only as bundles, where HF `kernels` does not look (it parses folders only).
metadata.json is HF's format (name, id, version, backend, python-depends, digest) plus a `kernel-hub`
section: release version, the variant's full description and the sha256 of every file.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from .errors import KernelHubError, MetadataError, ValidationFailedError
from .hub import BUILD_DIR, KH_KEY, REPO_TYPE, VARIANT_METADATA, bundle_path, git_blob_id, variant_to_json
from .integrity import combined_digest, sha256_file
from .metadata import METADATA_FILE, KernelMetadata, load_metadata
from .variants import Variant
from .vendoring import assembled_files

HF_BACKENDS = {"cpu": "cpu", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu", "xpu": "xpu"}
CARD = "README.md"


@dataclass
class Layout:
    root: Path
    metadata: KernelMetadata
    files: list[str] = field(default_factory=list)   # repo paths, POSIX

    def blob_ids(self, prefix: str = "") -> dict[str, str]:
        return {p: git_blob_id(self.root / p) for p in self.files if p.startswith(prefix)}


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


def hf_name(python_name: str) -> str:
    """HF `kernels` names kernels in kebab case and imports `name.replace('-', '_')`."""
    name = python_name.replace("_", "-")
    if not name[:1].isalpha() or not name.replace("-", "").isalnum() or name != name.lower():
        raise MetadataError(f"python_name {python_name!r} cannot be an HF kernel name (lowercase, digits, _)")
    return name


def _tar_bundle(variant_dir: Path, dest: Path) -> None:
    """A byte-for-byte reproducible tar of the variant folder (same files -> same bundle -> no-op upload)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in variant_dir.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(variant_dir).as_posix())
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    dest.write_bytes(buf.getvalue())


def _variant_metadata(meta: KernelMetadata, variant: Variant, variant_dir: Path) -> dict:
    files = {p.relative_to(variant_dir).as_posix(): p for p in sorted(variant_dir.rglob("*")) if p.is_file()}
    sha = {rel: sha256_file(p) for rel, p in files.items()}
    hf_digest = {rel: base64.b64encode(bytes.fromhex(h)).decode() for rel, h in sha.items()}
    backend = HF_BACKENDS.get(variant.backend)
    if backend is None:
        raise MetadataError(f"variant {variant.name}: backend {variant.backend!r} has no HF kernels equivalent")
    built = Variant(name=variant.name, framework=variant.framework, backend=variant.backend, entry="__init__.py",
                    tpu_generations=variant.tpu_generations, requires=variant.requires)
    return {
        "name": hf_name(meta.python_name),
        "id": f"_{meta.python_name}_{variant.name.replace('-', '_')}_{combined_digest(sha)[:10]}",
        "version": Version(meta.version).major,
        "license": meta.license or "unknown",
        "backend": {"type": backend},
        "python-depends": [],
        "digest": {"algorithm": "sha256", "files": hf_digest},
        KH_KEY: {
            "repo_id": meta.repo_id,
            "version": meta.version,
            "python_name": meta.python_name,
            "variant": variant_to_json(built),
            "sha256": sha,
        },
    }


def build_layout(kernel_dir: Path, out: Path) -> Layout:
    """Write the repo layout of `kernel_dir` under `out` (see the module docstring)."""
    meta = load_metadata(kernel_dir)
    package = Path(kernel_dir) / meta.python_name
    sources = assembled_files(kernel_dir, meta)  # the package's files and the shared ones it vendors
    layout = Layout(out, meta)
    for variant in meta.variants:
        if not (package / variant.entry).is_file():
            raise MetadataError(f"variant {variant.name}: entry {variant.entry} not found in {package}")
        vdir = out / BUILD_DIR / variant.name
        pdir = vdir / meta.python_name
        for rel, src in sources.items():
            dest = pdir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        shutil.copyfile(package / variant.entry, pdir / "__init__.py")  # the entry is the package root
        (vdir / VARIANT_METADATA).write_text(json.dumps(_variant_metadata(meta, variant, vdir), indent=1,
                                                        sort_keys=True) + "\n")
        _tar_bundle(vdir, out / bundle_path(variant.name))
        layout.files.append(bundle_path(variant.name))
        if variant.framework == "torch":
            layout.files += sorted(p.relative_to(out).as_posix() for p in vdir.rglob("*") if p.is_file())
        else:
            shutil.rmtree(vdir)
    shutil.copyfile(Path(kernel_dir) / METADATA_FILE, out / METADATA_FILE)
    layout.files.append(METADATA_FILE)
    card = Path(kernel_dir) / CARD
    (out / CARD).write_text(card.read_text() if card.is_file() else _card(meta))
    layout.files.append(CARD)
    return layout


def _card(meta: KernelMetadata) -> str:
    variants = "\n".join(f"- `{v.name}` ({v.framework} on {v.backend})" for v in meta.variants)
    return (f"---\nlicense: {meta.license or 'unknown'}\ntags:\n- kernel\n- kernel-hub\n---\n\n# {meta.name}\n\n"
            f"{meta.description}\n\nVersion {meta.version}. Variants:\n\n{variants}\n\n"
            f"```python\nimport kernel_hub as kh\nk = kh.get_kernel({meta.repo_id!r}, "
            f"version={Version(meta.version).major})\n```\n")


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
            token: str | None = None, skip_validation: bool = False,
            log: Callable[[str], None] = print) -> PublishResult:
    """Validate, build, upload, tag `v<version>` and move branch `v<major>` (never backwards)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    from .hub import HubSource

    kernel_dir = Path(kernel_dir)
    meta = load_metadata(kernel_dir)
    repo_id = repo_id or meta.repo_id
    if repo_id.count("/") != 1:
        raise KernelHubError(f"--repo must look like ORG/NAME, got {repo_id!r}")
    version, tag = Version(meta.version), f"v{meta.version}"
    branch = f"v{version.major}"
    if skip_validation:
        log("skipping validation (--skip-validation): publishing without checking the numbers")
    else:
        validate_local(kernel_dir, log)
    hub = HubSource(endpoint=endpoint, token=token)
    api = hub.api
    with tempfile.TemporaryDirectory(prefix="kernel-hub-publish-") as tmp:
        layout = build_layout(kernel_dir, Path(tmp))
        variants = [v.name for v in meta.variants]
        hub._call(repo_id, "creating the repo", lambda: api.create_repo(repo_id, repo_type=REPO_TYPE, exist_ok=True))
        refs = hub._call(repo_id, "listing refs", lambda: api.list_repo_refs(repo_id, repo_type=REPO_TYPE))
        tags = {t.name: t.target_commit for t in refs.tags}
        branches = {b.name: b.target_commit for b in refs.branches}
        local = layout.blob_ids(f"{BUILD_DIR}/")
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
            repo_id, ops, commit_message=f"Publish {meta.name} {meta.version}", repo_type=REPO_TYPE,
            revision="main"))
        commit = info.oid
    hub._call(repo_id, f"tagging {tag}", lambda: api.create_tag(
        repo_id, tag=tag, revision=commit, repo_type=REPO_TYPE, tag_message=f"{meta.name} {meta.version}"))
    moved = _move_branch(hub, repo_id, branch, commit, version, branches.get(branch), tags)
    return PublishResult(repo_id, meta.version, commit, tag, branch, moved, variants, False, not skip_validation)


def _remote_blob_ids(hub, repo_id: str, revision: str) -> dict[str, str]:
    from huggingface_hub.hf_api import RepoFile

    def listing() -> list:
        try:
            return list(hub.api.list_repo_tree(repo_id, path_in_repo=BUILD_DIR, recursive=True,
                                               repo_type=REPO_TYPE, revision=revision))
        except Exception as exc:  # no build/ folder yet on a fresh repo
            from huggingface_hub.errors import RemoteEntryNotFoundError

            if isinstance(exc, RemoteEntryNotFoundError):
                return []
            raise

    entries = hub._call(repo_id, f"listing {BUILD_DIR}/ at {revision[:12]}", listing)
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
                  lambda: hub.api.delete_branch(repo_id, branch=branch, repo_type=REPO_TYPE))
    hub._call(repo_id, f"creating branch {branch}",
              lambda: hub.api.create_branch(repo_id, branch=branch, revision=commit, repo_type=REPO_TYPE))
    return True


def cmd_publish(args: argparse.Namespace) -> int:
    result = publish(args.path, repo_id=args.repo, endpoint=args.endpoint, token=args.token,
                     skip_validation=args.skip_validation)
    print(result.summary())
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish", help="build, validate and upload a kernel folder to the Hub",
        description="Build the HF kernels-compatible layout of a kernel folder (build/<variant>/ ...), validate "
                    "it on this machine, upload it through huggingface_hub, tag v<version> and move branch "
                    "v<major>. An existing version with different content is refused; the same content is a "
                    "no-op.",
    )
    p.add_argument("path", help="kernel folder holding kernel.yaml (e.g. kernels/pallas/ragged_dot)")
    p.add_argument("--repo", help="ORG/NAME on the Hub (default: repo_id in kernel.yaml)")
    p.add_argument("--endpoint", help="Hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token", help="write token (default: $HF_TOKEN or the saved login)")
    p.add_argument("--skip-validation", action="store_true", help="publish without validating (says so)")
    p.set_defaults(func=cmd_publish)
