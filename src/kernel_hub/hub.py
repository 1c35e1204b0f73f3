"""The Hub source: kernel repos on the Hugging Face Hub (or `kernel-hub serve`), through huggingface_hub only.

A published commit holds one bundle per variant, `build/<variant>.tar` (the variant folder: metadata.json
and the package), beside the exploded `build/<torch-variant>/` folders that HF `kernels` loads. Loading
a version costs: the refs (1 request), the listing of `build/` at the resolved commit (1), and the one
bundle through hf_hub_download (HEAD + GET), into the Hub cache. The bundle is unpacked beside the
cache's repo folder (`kernels--ORG--NAME/kernel-hub/builds/<commit>/<variant>`), digests checked, and
renamed into place in one step, so a cut-off or concurrent download never leaves a half entry. The refs
and listings are kept there too, so with HF_HUB_OFFLINE=1 a warm cache resolves and loads with no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import IntegrityError, KernelHubError, KernelNotFoundError, MetadataError, VersionSpecError
from .integrity import verify_tree
from .sources import Build
from .variants import Variant
from .versions import Ref

REPO_TYPE = "kernel"
BUILD_DIR = "build"
BUNDLE_SUFFIX = ".tar"
VARIANT_METADATA = "metadata.json"
KH_KEY = "kernel-hub"          # our section inside the HF-format metadata.json
FRAMEWORKS = ("jax", "torch")
TIMEOUT_ENV = "KERNEL_HUB_HTTP_TIMEOUT"

T = TypeVar("T")


def bundle_path(variant_name: str) -> str:
    return f"{BUILD_DIR}/{variant_name}{BUNDLE_SUFFIX}"


def variant_from_name(name: str) -> Variant | None:
    """`jax-tpu` -> Variant(framework jax, backend tpu); names outside the convention -> None."""
    framework, _, backend = name.partition("-")
    if framework not in FRAMEWORKS or not backend or "-" in backend:
        return None
    return Variant(name=name, framework=framework, backend=backend)


def variant_to_json(v: Variant) -> dict[str, Any]:
    return {"name": v.name, "framework": v.framework, "backend": v.backend, "entry": v.entry,
            "tpu_generations": list(v.tpu_generations), "requires": dict(v.requires)}


def variant_from_json(d: dict[str, Any]) -> Variant:
    return Variant(name=d["name"], framework=d["framework"], backend=d["backend"],
                   entry=d.get("entry", "__init__.py"), tpu_generations=tuple(d.get("tpu_generations") or ()),
                   requires=tuple((str(k), str(v)) for k, v in (d.get("requires") or {}).items()))


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers see the old file or the new one, never a torn write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def git_blob_id(path: Path) -> str:
    """The id git (and so the Hub listing) gives a file's content."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _install_client_timeout() -> None:
    """Give huggingface_hub's shared HTTP client a timeout, unless the user configured their own.

    huggingface_hub's default client waits forever on API calls; a stalled server must become a
    one-line error instead. KERNEL_HUB_HTTP_TIMEOUT (seconds, default 30) sets it.
    """
    try:
        import httpx2
        from huggingface_hub.utils import _http
    except ImportError:  # a huggingface_hub without this hook: keep its behaviour
        return
    if getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) is not _http.default_client_factory:
        return
    seconds = float(os.environ.get(TIMEOUT_ENV) or 30)

    def factory() -> Any:
        return httpx2.Client(event_hooks={"request": [_http.hf_request_event_hook]}, follow_redirects=True,
                             timeout=httpx2.Timeout(seconds))

    _http.set_client_factory(factory)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), type(exc).__name__)
    return first[:300]


class HubSource:
    """Kernel repos behind a Hub endpoint (HF_ENDPOINT), cached in the Hub cache (HF_HUB_CACHE)."""

    kind = "hub"

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 cache_dir: str | Path | None = None, offline: bool | None = None,
                 aliases: dict[str, str] | None = None):
        from huggingface_hub import HfApi, constants

        _install_client_timeout()
        self.api = HfApi(endpoint=endpoint or None, token=token)
        self.endpoint = self.api.endpoint.rstrip("/")
        self.cache_dir = Path(cache_dir or constants.HF_HUB_CACHE)
        self.offline = constants.HF_HUB_OFFLINE if offline is None else offline
        self.aliases = dict(aliases or {})
        self._listings: dict[tuple[str, str], dict[str, str]] = {}

    @classmethod
    def for_repo(cls, repo_id: str, registry_entry: Any = None) -> HubSource:
        hub_repo = getattr(registry_entry, "hub_repo", None)
        return cls(aliases={repo_id: hub_repo} if hub_repo else None)

    def describe(self) -> str:
        return f"Hub {self.endpoint}" + (" (offline: cache only)" if self.offline else "")

    # -- local state ------------------------------------------------------------------------------
    def hub_repo(self, repo_id: str) -> str:
        return self.aliases.get(repo_id, repo_id)

    def root(self, repo_id: str) -> Path:
        """Our state for one repo, inside the Hub cache's folder for it (deleted along with it)."""
        from huggingface_hub.file_download import repo_folder_name

        return self.cache_dir / repo_folder_name(repo_id=self.hub_repo(repo_id), repo_type=REPO_TYPE) / KH_KEY

    def build_dir(self, repo_id: str, commit: str, variant: str) -> Path:
        return self.root(repo_id) / "builds" / commit / variant

    def _offline_error(self, repo_id: str, what: str) -> KernelHubError:
        return KernelHubError(
            f"{repo_id}: HF_HUB_OFFLINE=1 and {what} is not in the cache {self.cache_dir}; "
            f"run once online (endpoint {self.endpoint}) or unset HF_HUB_OFFLINE"
        )

    def _offline_call_error(self, repo_id: str, what: str) -> KernelHubError:
        return KernelHubError(
            f"{repo_id}: HF_HUB_OFFLINE=1 and {what} needs the Hub ({self.endpoint}): nothing usable is cached "
            f"in {self.cache_dir}; run once online or unset HF_HUB_OFFLINE"
        )

    # -- Hub calls --------------------------------------------------------------------------------
    def _call(self, repo_id: str, what: str, fn: Callable[[], T]) -> T:
        """Run one huggingface_hub call; every failure becomes one line naming the endpoint."""
        from huggingface_hub import errors as hf_errors

        try:
            return fn()
        except hf_errors.RepositoryNotFoundError:
            raise KernelNotFoundError(f"{repo_id}: no such kernel repo at {self.endpoint}") from None
        except hf_errors.RevisionNotFoundError:
            raise VersionSpecError(f"{repo_id}: {what}: revision not found at {self.endpoint}") from None
        except hf_errors.RemoteEntryNotFoundError:
            raise KernelNotFoundError(f"{repo_id}: {what}: not found at {self.endpoint}") from None
        except hf_errors.OfflineModeIsEnabled:
            raise self._offline_call_error(repo_id, what) from None
        except hf_errors.LocalEntryNotFoundError as exc:
            if self.offline:
                raise self._offline_call_error(repo_id, what) from None
            cause = exc.__cause__ or exc.__context__
            detail = f"{type(cause).__name__}: {_one_line(cause)}" if cause else "not reachable"
            raise KernelHubError(f"Hub at {self.endpoint}: {what} for {repo_id} failed ({detail})") from None
        except hf_errors.HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise KernelHubError(f"Hub at {self.endpoint}: {what} for {repo_id} failed with HTTP {status}") from None
        except KernelHubError:
            raise
        except Exception as exc:  # connection refused, timeouts, cut-off downloads: all one line
            name = type(exc).__name__
            kind = "timed out" if "timeout" in name.lower() or "timed out" in str(exc).lower() else "failed"
            raise KernelHubError(
                f"Hub at {self.endpoint}: {what} for {repo_id} {kind} ({name}: {_one_line(exc)})"
            ) from None

    # -- Source protocol --------------------------------------------------------------------------
    def refs(self, repo_id: str) -> list[Ref]:
        """Tags and branches (1 request); kept in the cache so offline resolution works."""
        saved = self.root(repo_id) / "refs.json"
        if self.offline:
            data = read_json(saved)
            if data is None:
                raise self._offline_error(repo_id, "its list of versions")
            return [Ref(r["name"], r["kind"], r["commit"]) for r in data["refs"]]
        got = self._call(repo_id, "listing refs",
                         lambda: self.api.list_repo_refs(self.hub_repo(repo_id), repo_type=REPO_TYPE))
        refs = [Ref(b.name, "branch", b.target_commit) for b in got.branches]
        refs += [Ref(t.name, "tag", t.target_commit) for t in got.tags]
        write_json_atomic(saved, {"endpoint": self.endpoint,
                                  "refs": [{"name": r.name, "kind": r.kind, "commit": r.commit} for r in refs]})
        return refs

    def listing(self, repo_id: str, commit: str) -> dict[str, str]:
        """variant name -> git blob id of its bundle, at `commit` (1 request, then cached: commits are immutable)."""
        key = (repo_id, commit)
        if key in self._listings:
            return self._listings[key]
        saved = self.root(repo_id) / "listings" / f"{commit}.json"
        data = read_json(saved)
        if data is None:
            if self.offline:
                raise self._offline_error(repo_id, f"the build listing of commit {commit[:12]}")
            from huggingface_hub.hf_api import RepoFile

            entries = self._call(repo_id, f"listing builds at {commit[:12]}", lambda: list(
                self.api.list_repo_tree(self.hub_repo(repo_id), path_in_repo=BUILD_DIR, repo_type=REPO_TYPE,
                                        revision=commit)))
            data = {
                e.path[len(BUILD_DIR) + 1:-len(BUNDLE_SUFFIX)]: e.blob_id
                for e in entries
                if isinstance(e, RepoFile) and e.path.endswith(BUNDLE_SUFFIX) and e.path.count("/") == 1
            }
            write_json_atomic(saved, data)
        self._listings[key] = data
        return data

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        """The variants at `commit`, with their full metadata where a build of that commit is cached."""
        out = []
        for name in sorted(self.listing(repo_id, commit)):
            meta = read_json(self.build_dir(repo_id, commit, name) / VARIANT_METADATA)
            if meta and KH_KEY in meta:
                out.append(variant_from_json(meta[KH_KEY]["variant"]))
            elif (v := variant_from_name(name)) is not None:
                out.append(v)
        return out

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        """The variants to choose from, without a listing request where one is not cached.

        Fetching the first preferred name that exists (HEAD + GET) stands in for the listing, so a fresh
        load costs refs + HEAD + GET = 3 requests; a name not published at `commit` costs one HEAD.
        """
        listed = (repo_id, commit) in self._listings or (self.root(repo_id) / "listings" / f"{commit}.json").is_file()
        if listed:
            return self.variants(repo_id, commit)
        if self.offline:
            unpacked = sorted((self.root(repo_id) / "builds" / commit).glob(f"*/{VARIANT_METADATA}"))
            found = [m[KH_KEY]["variant"] for p in unpacked if KH_KEY in (m := read_json(p) or {})]
            if not found:
                raise self._offline_error(repo_id, f"a build of commit {commit[:12]}")
            return [variant_from_json(v) for v in found]
        for name in names:
            guess = variant_from_name(name)
            if guess is None:
                continue
            try:
                return [self.fetch(repo_id, commit, guess).variant]
            except KernelNotFoundError:
                continue  # not published at this commit
        return self.variants(repo_id, commit)  # nothing preferred exists: list, so the trace shows what does

    def fetch(self, repo_id: str, commit: str, variant: Variant,
              expected: dict[str, str] | None = None) -> Build:
        """The variant's package on local disk, every digest checked (and against `expected`, a lock's).

        Tries the unpacked build, then the bundle already in the Hub cache, then (online) a fresh
        download; a damaged step is removed before the next, so a tampered file is refetched.
        """
        final = self.build_dir(repo_id, commit, variant.name)
        label = f"{repo_id}@{commit[:12]} [{variant.name}]"
        problem: IntegrityError | None = None
        for attempt in ("unpacked", "cached bundle", "download"):
            if attempt == "unpacked" and not final.is_dir():
                continue
            if attempt == "download" and self.offline:
                break
            try:
                if attempt != "unpacked":
                    bundle = self._download_bundle(repo_id, commit, variant.name, force=attempt == "download")
                    self._unpack(bundle, final, label)
                return self._checked_build(repo_id, commit, final, expected, label)
            except IntegrityError as exc:
                problem = exc
                _remove_tree(final)
            except KernelHubError:
                if problem is None or not self.offline:
                    raise
                raise IntegrityError(f"{problem}; offline, and no clean copy is cached to restore it") from None
        assert problem is not None
        raise problem

    # -- internals --------------------------------------------------------------------------------
    def _download_bundle(self, repo_id: str, commit: str, name: str, force: bool) -> Path:
        path = Path(self._call(repo_id, f"downloading {bundle_path(name)} at {commit[:12]}", lambda: (
            self.api.hf_hub_download(self.hub_repo(repo_id), bundle_path(name), repo_type=REPO_TYPE,
                                     revision=commit, cache_dir=self.cache_dir, local_files_only=self.offline,
                                     force_download=force))))
        listed = self._listings.get((repo_id, commit), {}).get(name) or (
            read_json(self.root(repo_id) / "listings" / f"{commit}.json") or {}).get(name)
        if listed and git_blob_id(path) != listed:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {bundle_path(name)} does not match the Hub listing")
        blob = path.resolve().name  # the Hub cache stores a file under its ETag: the git blob id here
        if not listed and len(blob) == 40 and git_blob_id(path) != blob:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {bundle_path(name)} does not match its ETag")
        return path

    def _unpack(self, bundle: Path, final: Path, label: str) -> None:
        """Unpack into a private folder, check it, then rename it into place in one step."""
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.partial")
        try:
            with tarfile.open(bundle) as tar:
                for member in tar.getmembers():
                    if not (member.isfile() or member.isdir()) or member.name.startswith(("/", "..")):
                        raise IntegrityError(f"{label}: bundle entry {member.name!r} is not a plain file")
                tar.extractall(tmp, filter="data")
            _check_unpacked(tmp, label)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # not a lost race with another process: a real failure
                    raise
        except (tarfile.TarError, EOFError) as exc:
            raise IntegrityError(f"{label}: bundle is damaged ({_one_line(exc)})") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _checked_build(self, repo_id: str, commit: str, folder: Path, expected: dict[str, str] | None,
                       label: str) -> Build:
        meta = _check_unpacked(folder, label)
        kh = meta[KH_KEY]
        variant = variant_from_json(kh["variant"])
        python_name = kh["python_name"]
        prefix = f"{python_name}/"
        digests = {k[len(prefix):]: v for k, v in kh["sha256"].items() if k.startswith(prefix)}
        if expected is not None and expected != digests:
            changed = sorted(set(expected) ^ set(digests)) or sorted(
                k for k in expected if expected[k] != digests.get(k))
            raise IntegrityError(f"{label}: file {changed[0]} differs from the lock")
        return Build(repo_id=repo_id, version=kh.get("version"), commit=commit, variant=variant,
                     package_dir=folder / python_name, source=self.endpoint, digests=digests, metadata=None)


def _check_unpacked(folder: Path, label: str) -> dict[str, Any]:
    """Every file of an unpacked variant against the sha256 its metadata.json records; nothing extra."""
    meta = read_json(folder / VARIANT_METADATA)
    if not isinstance(meta, dict) or not isinstance(meta.get(KH_KEY), dict) or "sha256" not in meta[KH_KEY]:
        raise IntegrityError(f"{label}: {VARIANT_METADATA} is missing or not a kernel-hub build")
    verify_tree(folder, meta[KH_KEY]["sha256"], label, ignore=frozenset({VARIANT_METADATA}))
    for key in ("variant", "python_name"):
        if key not in meta[KH_KEY]:
            raise MetadataError(f"{label}: {VARIANT_METADATA} has no {KH_KEY}.{key}")
    return meta


def _remove_tree(path: Path) -> None:
    """Move aside, then delete: readers never see a half-deleted build."""
    trash = path.with_name(f".{path.name}.{uuid.uuid4().hex}.trash")
    with contextlib.suppress(OSError):
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
