"""`kernel-hub list`, `info`, `resolve`: what the registry and a Hub hold, and the decisions a load would make
(nothing is imported)."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decide.system import SystemFacts, detect, installed_version
from ..decide.variants import KERNEL_BUILDER
from ..decide.versions import resolve
from ..errors import KernelHubError
from ..load.planning import plan_load, source_for
from ..load.registry import load_registry, registry_location
from ..names import check_repo_id
from ..package import buildfmt as fmt
from ..package.metadata import load_metadata
from ..package.signing import MAX_SIGNATURE_BYTES, SIGNATURE_FILE, SignatureStatus, signature_status, sigstore_verifier
from ..sources.base import LocalSource
from ..sources.hub.client import HubClient
from ..sources.hub.source import HubSource
from ..ui.display import clean, clean_data, clean_lines, one_line
from .common import print_json, simulated_backend, table, version_of, version_spec

if TYPE_CHECKING:
    from ..decide.variants import Variant
    from ..sources.base import Source

_TPU_GENERATION = re.compile(r"^v\d+[a-z]?$")


def cmd_list(args: argparse.Namespace) -> int:
    if args.hub:
        return _list_hub(args)
    registry = load_registry()
    kernels = [{"repo_id": e.repo_id, "default_spec": e.version,
                "source_version": load_metadata(e.source).version if e.source and e.source.is_dir() else None,
                "backends": list(e.backends), "layers": list(e.layers), "bench": str(e.bench) if e.bench else None}
               for e in registry.entries]
    location = registry_location()
    if args.json:
        print_json({"registry": str(location.path), "registry_origin": location.origin, "kernels": kernels})
        return 0
    rows = [("repo", "default spec", "source version", "backends", "layers")]
    rows += [(k["repo_id"], k["default_spec"] or "-", k["source_version"] or "-", ",".join(k["backends"]) or "-",
              ",".join(k["layers"]) or "-") for k in kernels]
    print(clean(location.describe()))
    print(table(rows))
    return 0


def _list_hub(args: argparse.Namespace) -> int:
    """`list --hub ORG`: the kernel repos an endpoint holds for an organisation (GET /api/kernels?author=ORG,
    through huggingface_hub's HTTP session and headers)."""
    if "/" in args.hub:
        raise KernelHubError(f"--hub takes an organisation (ORG, e.g. acme), got {args.hub!r}")
    org = check_repo_id(f"{args.hub}/x", "--hub organisation").split("/")[0]
    hub = HubClient(args.endpoint)
    try:
        repos = [{"repo_id": check_repo_id(str(r.get("id")), "a listed repo id"), "sha": r.get("sha"),
                  "last_modified": r.get("lastModified")} for r in hub.list_kernel_repos(org)]
    except Exception as exc:  # the endpoint's refusal, an unreachable host, a malformed answer: one line
        raise KernelHubError(f"listing {org} at {hub.endpoint} failed: {one_line(exc, limit=None)[:200]}") from None
    if args.json:
        print_json({"org": org, "endpoint": hub.endpoint, "repos": repos})
        return 0
    if not repos:
        print(f"{org}: no kernel repos at {hub.endpoint}")
        return 0
    print(table([("repo", "commit", "last modified"),
                  *((r["repo_id"], str(r["sha"] or "-")[:12], str(r["last_modified"] or "-")) for r in repos)]))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    data = _info_data(args.repo)
    if args.json:
        print_json(data)  # json.dumps escapes every control character, and (ensure_ascii) every non-ASCII one
        return 0
    data = clean_data(data)  # names, descriptions and compile records come from a server or metadata
    print(f"repo      {data['repo_id']}")
    print(f"source    {data['source']}")
    m = data["metadata"]
    if m is not None:
        print(f"name      {m['name']}  version {m['version']}  license {m['license'] or '-'}")
        print(f"about     {m['description']}")
        print(f"package   {m['python_name']} ({m['files']} files, commit {m['commit'][:12]})")
        print(f"replaces  {', '.join(m['replaces']) or '-'}")
    print("refs      " + (", ".join(f"{r['name']} ({r['kind']}) {r['commit'][:12]}" for r in data["refs"]) or "none"))
    if data["variants_commit"] is not None:
        note = f" ({data['variants_note']})" if data.get("variants_note") else ""
        print("variants  at " + data["variants_commit"][:12] + note + ":")
        for v in data["variants"]:
            gens = f" tpu {','.join(v['tpu_generations'])}" if v["tpu_generations"] else ""
            reqs = " ".join(f"{d}{s}" for d, s in v["requires"])
            dialect = f"  [{v['dialect']}: {v['verification']}]" if v.get("dialect") == KERNEL_BUILDER else ""
            print(f"  {v['name']:<12} {v['framework']:<6} {v['backend']:<5} entry {v['entry']}{gens}  {reqs}{dialect}")
        signed = [(v["name"], v["signature"]) for v in data["variants"] if v.get("signature")]
        if signed:
            print("signed    " + "; ".join(f"{name} {sig['state']}" for name, sig in signed))
            for reason in sorted({sig["reason"] for _, sig in signed}):
                print(f"  {reason}")
        tpu = [v for v in data["variants"] if "tpu_compile" in v]
        if tpu:
            print("tpu compile (recorded in the release):")
            for v in tpu:
                first, *rest = v["tpu_compile"]
                print(f"  {v['name']:<12} {first}")
                for line in rest:
                    print(f"  {'':<12} {line}")
    return 0


def _info_data(repo_id: str) -> dict[str, Any]:
    """What `kernel-hub info` shows, as data: the --json document and the text's one source."""
    registry = load_registry()
    source = source_for(repo_id, registry)
    refs = source.refs(repo_id)
    metadata = None
    if isinstance(source, LocalSource):
        m = source.metadata
        metadata = {"name": m.name, "version": m.version, "license": m.license, "description": m.description,
                    "python_name": m.python_name, "files": len(source.digests), "commit": source.commit,
                    "replaces": list(m.replaces)}
    entry = registry.get(repo_id)
    spec = entry.version if entry else None
    variants: list[dict[str, Any]] = []
    commit, from_cache = None, False
    if spec or refs:
        res = resolve(refs, version=version_spec(spec) if spec else None, revision=None if spec else refs[0].name)
        commit = res.commit
        found, from_cache = _variants_here(source, repo_id, res.commit)
        published = getattr(getattr(source, "active", None) or source, "published_metadata", None)
        declared = published(repo_id, res.commit) if published is not None else None
        if declared is not None:  # a Hub release, cached or not: its kernel.yaml says what each variant requires
            by_name = {v.name: v for v in declared.variants}
            found = [by_name.get(v.name, v) for v in found]
        variants = [{"name": v.name, "framework": v.framework, "backend": v.backend, "entry": v.entry,
                     "tpu_generations": list(v.tpu_generations), "requires": [list(r) for r in v.requires]}
                    for v in found]
        for d, v in zip(variants, found, strict=True):
            if v.dialect == KERNEL_BUILDER:  # a tree of the Hub's build tool: say how its bytes are checked
                d["dialect"] = v.dialect
                d["verification"] = source.verification(repo_id, res.commit, v)
            elif v.backend == "tpu":
                d["tpu_compile"] = _tpu_compile_lines(source, repo_id, res.commit, v)
        for d, status in zip(variants, _signatures(source, repo_id, res.commit, found), strict=True):
            d["signature"] = status.to_dict()
    data = {"repo_id": repo_id, "source": source.describe(), "metadata": metadata,
            "refs": [{"name": r.name, "kind": r.kind, "commit": r.commit} for r in refs],
            "variants_commit": commit, "variants": variants}
    if commit is not None and from_cache:
        data["variants_note"] = "offline: only the builds in the cache; the release's listing was never fetched"
    return data


def _variants_here(source: Source, repo_id: str, commit: str) -> tuple[list[Variant], bool]:
    """(the variants at `commit`, whether they are only the cached builds): offline with no cached listing, the
    builds a download left in the cache (what an offline download uses) stand in for the release's listing."""
    hub = getattr(source, "active", None) or source
    try:
        return source.variants(repo_id, commit), False
    except KernelHubError:
        if not (isinstance(hub, HubSource) and hub.offline):
            raise
    return hub.candidate_variants(repo_id, commit, []), True


def _tpu_compile_lines(source: Source, repo_id: str, commit: str, variant: Variant) -> list[str]:
    """What a published TPU variant's metadata.json records about the compile gate (its bundle is fetched and
    verified; nothing is imported). A source folder is not a release: it records nothing."""
    if isinstance(getattr(source, "active", None) or source, LocalSource):
        return ["not compiled for TPU (a source folder, not a release: `kernel-hub validate --path DIR --tpu "
                "v5e,v6e` compiles it)"]
    try:
        build = source.fetch(repo_id, commit, variant)
        info = fmt.read_build_info(Path(build.package_dir).parent, f"{repo_id}@{commit[:12]}", variant.name)
    except KernelHubError as exc:  # a build that cannot be fetched or verified: say so, show the rest
        return [f"compile record unreadable: {one_line(exc, limit=None)[:200]}"]
    if info.tpu_compile is None:
        return ["not compiled for TPU (the release records no compile matrix)"]
    return info.tpu_compile.lines()


def _signatures(source: Source, repo_id: str, commit: str, variants: list[Variant]) -> list[SignatureStatus]:
    """Each variant's signing status (signing.py): a Hub release's `build/<variant>/metadata.json.sigstore`, fetched
    with its metadata.json where the listing has it and checked offline; a source folder is not a release."""
    hub = getattr(source, "active", None) or source
    if not isinstance(hub, HubSource):
        return [SignatureStatus("not signed", "a source folder, not a release") for _ in variants]
    if hub.offline:
        return [SignatureStatus("unverifiable", "offline (HF_HUB_OFFLINE=1): signatures are checked online")
                for _ in variants]
    try:
        listed = hub.client.build_blob_ids(hub.hub_repo(repo_id), commit)
    except KernelHubError as exc:
        return [SignatureStatus("unverifiable", f"the build listing is unreadable: {one_line(exc, limit=None)[:200]}")
                for _ in variants]
    verifier = sigstore_verifier()
    out = []
    for v in variants:
        base = f"{fmt.BUILD_DIR}/{v.name}"
        if f"{base}/{SIGNATURE_FILE}" not in listed:
            out.append(signature_status(None, None, verifier))
            continue
        try:
            bundle, meta = (_small_file(hub, repo_id, commit, f"{base}/{name}")
                            for name in (SIGNATURE_FILE, fmt.VARIANT_METADATA))
        except Exception as exc:  # the server's refusal or a broken cache: one line, the other variants still shown
            out.append(SignatureStatus("unverifiable", f"{SIGNATURE_FILE} is listed but unreadable: "
                                                       f"{one_line(exc, limit=None)[:200]}"))
            continue
        out.append(signature_status(bundle, meta, verifier))
    return out


def _small_file(hub: HubSource, repo_id: str, commit: str, path: str) -> bytes | None:
    """One file of a release at `commit` (None where it is not there), read up to MAX_SIGNATURE_BYTES + 1."""
    return hub.client.read_small_file(hub.hub_repo(repo_id), path, commit, MAX_SIGNATURE_BYTES + 1)


def cmd_resolve(args: argparse.Namespace) -> int:


    if args.tpu_generation is not None and not _TPU_GENERATION.match(args.tpu_generation):
        raise KernelHubError(f"--tpu-generation {args.tpu_generation!r} is not a TPU generation like v5e or v6e")
    args.backend, implied = simulated_backend(args.backend, args.tpu_generation)
    if implied:
        print(implied, file=sys.stderr)
    jax_version = version_of("--jax-version", args.jax_version)
    torch_version = version_of("--torch-version", args.torch_version)
    system: SystemFacts | None = None
    if args.backend or args.tpu_generation or jax_version or torch_version:
        base = detect(args.framework) if not args.backend else SystemFacts(backend=args.backend)
        system = replace(base, backend=args.backend or base.backend, tpu_generation=args.tpu_generation,
                         jax_version=jax_version or installed_version("jax"),
                         torch_version=torch_version or installed_version("torch"))
    plan = plan_load(args.repo, version=version_spec(args.spec), revision=args.revision, framework=args.framework,
                     system=system)
    if args.json:
        r = plan.resolution
        print_json({"repo_id": plan.repo_id, "source": plan.source.describe(), "version": r.version,
                     "commit": r.commit, "ref": r.ref, "reason": r.reason, "framework": plan.framework,
                     "system": plan.system.to_dict(),
                     "variants": [{"variant": d.variant, "accepted": d.accepted, "reason": d.reason}
                                  for d in plan.choice.trace],
                     "chosen": plan.choice.variant.name if plan.choice.variant else None})
    else:
        print(clean_lines(plan.describe()))
    return 0 if plan.choice.variant is not None else 1
