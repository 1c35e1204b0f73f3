"""The Hub source: kernel repos on the Hugging Face Hub (or `kernel-hub serve`), through huggingface_hub only.

A published commit holds one bundle per variant (the layout is buildfmt.py's). Loading a version costs: the
refs (1 request), the listing of `build/` at the resolved commit (1), and the one bundle through
hf_hub_download (HEAD + GET), into the Hub cache. The bundle is unpacked beside the cache's repo folder
(`kernels--ORG--NAME/kernel-hub/builds/<commit>/<variant>`), digests checked, and renamed into place in one
step, so a cut-off or concurrent download never leaves a half entry. The refs and listings are kept there too,
so with HF_HUB_OFFLINE=1 a warm cache resolves and loads with no network.

The server, the bundles and the cache are all untrusted: every ref, commit, variant and file name is checked
with kernel_hub.names before it names a path, and every write and delete stays inside the repo's own folder
of the cache (names.safe_join / names.safe_rmtree).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..decide.builder_names import parse_builder_name
from ..decide.hf_conventions import kernels_cache
from ..decide.variants import KERNEL_BUILDER, Variant
from ..decide.versions import Ref
from ..errors import (
    IntegrityError,
    KernelHubError,
    KernelNotFoundError,
    MetadataError,
    RefMovedError,
    UnsafeNameError,
    VersionSpecError,
)
from ..names import (
    check_commit,
    check_ref_name,
    check_relative_path,
    check_repo_id,
    check_variant_name,
    safe_join,
    safe_rmtree,
)
from ..package import buildfmt as fmt
from ..package.integrity import sha256_bytes, verify_tree
from ..package.metadata import KernelMetadata
from ..ui.display import one_line
from . import hub_builder as builder
from .base import Build, Origin
from .http_limits import (
    MAX_DOWNLOAD_ENV,
    HubAnswerError,
    bounded_transport,
    build_byte_cap,
    check_limits,
    operation,
    request_timeout,
)
from .http_limits import TIMEOUT_ENV as TIMEOUT_ENV

REPO_TYPE = fmt.REPO_TYPE
#: A cache file (refs.json, a listing) larger than this is neither written nor read.
MAX_CACHED_JSON = 4 << 20
#: Entries of one listing (refs, a build/ folder) the client reads; a server listing more is refused.
MAX_LISTING_ENTRIES = 50_000
#: A leftover .partial/.trash folder older than this is no unpack in progress (an unpack takes seconds).
STALE_SECONDS = 3600.0
_MAX_PUBLISHED_METADATA = 1 << 20  # bytes of a published kernel.yaml that `info` will parse
_DAMAGED = (IntegrityError, MetadataError, UnsafeNameError)  # a cached copy that is not a clean build

T = TypeVar("T")


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers see the old file or the new one, never a torn write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def note_json(path: Path, data: Any) -> bool:
    """Cache bookkeeping (refs, listings): written where it fits under MAX_CACHED_JSON and the cache is writable,
    else skipped. A read-only cache (a pre-baked image) loads what it holds; the next run asks the Hub again.
    Returns whether it was written."""
    if len(json.dumps(data)) > MAX_CACHED_JSON:
        return False
    try:
        write_json_atomic(path, data)
    except OSError:
        return False
    return True


def read_json(path: Path) -> Any | None:
    """A cache file's JSON, or None where it is missing, unreadable, not JSON or over MAX_CACHED_JSON."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CACHED_JSON + 1)
        return json.loads(raw) if len(raw) <= MAX_CACHED_JSON else None
    except (OSError, ValueError):
        return None


def _install_client_timeout() -> None:
    """Give huggingface_hub's shared HTTP client our bounds, unless the user configured their own client.

    huggingface_hub's default client waits forever and reads answers of any size; a stalled, trickling or endless
    server must become a one-line error instead. http_limits.bounded_transport: an overall deadline per request
    (KERNEL_HUB_HTTP_TIMEOUT, default 30 s, for API answers; KERNEL_HUB_DOWNLOAD_TIMEOUT for files) and a size cap
    on every answer.
    """
    try:
        import httpx2
        from huggingface_hub.utils import _http
    except ImportError:  # a huggingface_hub without this hook: keep its behaviour
        return
    if getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) is not _http.default_client_factory:
        return
    seconds = request_timeout()

    def factory() -> Any:
        return httpx2.Client(event_hooks={"request": [_http.hf_request_event_hook]}, follow_redirects=True,
                             timeout=httpx2.Timeout(seconds), transport=bounded_transport())

    _http.set_client_factory(factory)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return one_line(lines[0]) if lines else type(exc).__name__


def auth_hint(status: Any, token_sent: bool) -> str:
    """What to do about a refused request: a 401 with no token sent means the server wants one, whatever its
    message says about credentials."""
    if status == 401 and not token_sent:
        return " (no token was sent, and this endpoint wants one: set HF_TOKEN)"
    if status in (401, 403):
        return " (the token sent was refused: check HF_TOKEN or --token for this endpoint)"
    return ""


def server_message(exc: Any) -> str | None:
    """The error text the server sent with a failed response (X-Error-Message, or the JSON "error")."""
    message = getattr(exc, "server_message", None)
    response = getattr(exc, "response", None)
    if not message and response is not None:
        message = response.headers.get("X-Error-Message")
        if not message:
            with contextlib.suppress(Exception):
                body = response.json()
                message = body.get("error") if isinstance(body, dict) else None
    if isinstance(message, list):
        message = "; ".join(str(m) for m in message)
    return one_line(message, 200) if message else None


def checked_refs(raw: list[tuple[str, str, str]]) -> list[Ref]:
    """Refs from a server or a cache, keeping only names no tool reads as an option or a commit id and
    targets that are real commit ids: nothing else can steer resolution."""
    out = []
    for name, kind, commit in raw:
        try:
            out.append(Ref(check_ref_name(name), kind, check_commit(commit)))
        except UnsafeNameError:
            continue
    return out


class HubSource:
    """Kernel repos behind a Hub endpoint (HF_ENDPOINT), cached in KERNELS_CACHE (HF kernels' cache root) or else
    the Hub cache (HF_HUB_CACHE)."""

    kind = "hub"

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 cache_dir: str | Path | None = None, offline: bool | None = None,
                 aliases: dict[str, str] | None = None):
        from huggingface_hub import HfApi, constants

        check_limits()  # a bad limit variable fails here, naming it, before any request
        _install_client_timeout()
        self.api = HfApi(endpoint=endpoint or None, token=token)
        self.endpoint = self.api.endpoint.rstrip("/")
        self.cache_dir = Path(cache_dir or kernels_cache() or constants.HF_HUB_CACHE)
        self.offline = constants.HF_HUB_OFFLINE if offline is None else offline
        self.aliases = {check_repo_id(k): check_repo_id(v, "registry 'hub' repo") for k, v in (aliases or {}).items()}
        self._listings: dict[tuple[str, str], dict[str, str]] = {}
        self._cleaned: set[str] = set()

    @classmethod
    def for_repo(cls, repo_id: str, registry_entry: Any = None) -> HubSource:
        hub_repo = registry_entry.hub_repo if registry_entry is not None else None
        return cls(aliases={repo_id: hub_repo} if hub_repo else None)

    def describe(self) -> str:
        return f"Hub {self.endpoint}" + (" (offline: cache only)" if self.offline else "")

    def token_sent(self) -> bool:
        """Whether huggingface_hub sends a token with this source's requests (given, or HF_TOKEN / the login)."""
        from huggingface_hub import get_token

        token = self.api.token
        return bool(token) if token is not None else bool(get_token())

    def origin(self, repo_id: str) -> Origin:
        return Origin("hub", self.hub_repo(repo_id), self.endpoint)

    # -- local state ------------------------------------------------------------------------------
    def hub_repo(self, repo_id: str) -> str:
        """The repo actually fetched for `repo_id` (a registry entry's `hub:` alias, else itself)."""
        return check_repo_id(self.aliases.get(repo_id, repo_id))

    def repo_dir(self, repo_id: str) -> Path:
        """The Hub cache's folder for this repo: every write and delete of ours stays inside it."""
        from huggingface_hub.file_download import repo_folder_name

        return self.cache_dir / repo_folder_name(repo_id=self.hub_repo(repo_id), repo_type=REPO_TYPE)

    def root(self, repo_id: str) -> Path:
        """Our state for one repo, inside the Hub cache's folder for it (deleted along with it)."""
        return self.repo_dir(repo_id) / fmt.KH_KEY

    def builds_root(self, repo_id: str) -> Path:
        return self.root(repo_id) / "builds"

    def build_dir(self, repo_id: str, commit: str, variant: str) -> Path:
        return safe_join(self.builds_root(repo_id), check_commit(commit), check_variant_name(variant))

    def _listing_file(self, repo_id: str, commit: str) -> Path:
        return safe_join(self.root(repo_id), "listings", f"{check_commit(commit)}.json")

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
    def _call(self, repo_id: str, what: str, fn: Callable[[], T], *, bounded: str | None = None,
              max_bytes: int | None = None) -> T:
        """Run one huggingface_hub call; every failure becomes one line naming the endpoint (and what the
        server said). bounded: "api" or "download" runs it as one http_limits.operation (one deadline through its
        retries, redirects and pages; `max_bytes`: what its downloads may bring together); None: each request on
        its own bounds (publishing's calls)."""
        from huggingface_hub import errors as hf_errors

        try:
            if bounded is None:
                return fn()
            with operation(f"{what} for {repo_id}", download=bounded == "download", max_bytes=max_bytes):
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
            detail = f"{type(cause).__name__}: {_first_line(cause)}" if cause else "not reachable"
            raise KernelHubError(f"Hub at {self.endpoint}: {what} for {repo_id} failed ({detail})") from None
        except hf_errors.HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            said = server_message(exc)
            if status == 412:
                raise RefMovedError(f"Hub at {self.endpoint}: {what} for {repo_id}: the branch moved meanwhile"
                                    + (f" ({said})" if said else "")) from None
            raise KernelHubError(f"Hub at {self.endpoint}: {what} for {repo_id} failed with HTTP {status}"
                                 + (f": {said}" if said else "") + auth_hint(status, self.token_sent())) from None
        except HubAnswerError as exc:  # over a size cap or past the deadline (http_limits)
            raise HubAnswerError(f"Hub at {self.endpoint}: {what} for {repo_id} failed: {exc}") from None
        except KernelHubError:
            raise
        except Exception as exc:  # connection refused, timeouts, cut-off downloads: all one line
            name = type(exc).__name__
            kind = "timed out" if "timeout" in name.lower() or "timed out" in str(exc).lower() else "failed"
            raise KernelHubError(
                f"Hub at {self.endpoint}: {what} for {repo_id} {kind} ({name}: {_first_line(exc)})"
            ) from None

    # -- listing (kernel-hub list --hub) ---------------------------------------------------------------
    def list_kernel_repos(self, org: str) -> list[Any]:
        """GET /api/kernels?author=ORG through huggingface_hub's session and headers: the answer as the server
        gave it (a list; untrusted, the caller checks every entry). Failures are raised as they come."""
        from huggingface_hub.utils import get_session, hf_raise_for_status

        with operation(f"listing the kernel repos of {org}"):
            response = get_session().get(f"{self.endpoint}/api/kernels", params={"author": org},
                                         headers=self.api._build_hf_headers())
        hf_raise_for_status(response)
        found = response.json()
        if not isinstance(found, list):
            raise ValueError("the answer is not a list of repos")
        return found

    # -- publishing (kernel-hub publish): the repo named as given, each call one line on failure -------
    def whoami(self, repo_id: str) -> None:
        """The endpoint answers and accepts the token (one request); `repo_id` only names the error."""
        self._call(repo_id, "checking the endpoint and token (whoami)", self.api.whoami)

    def create_repo(self, repo_id: str) -> None:
        """The kernel repo, created unless it exists."""
        self._call(repo_id, "creating the repo",
                   lambda: self.api.create_repo(repo_id, repo_type=REPO_TYPE, exist_ok=True))

    def ref_targets(self, repo_id: str) -> tuple[dict[str, str], dict[str, str]]:
        """(tag -> commit, branch -> commit) as the server lists them (1 request, nothing cached)."""
        refs = self._call(repo_id, "listing refs", lambda: self.api.list_repo_refs(repo_id, repo_type=REPO_TYPE),
                          bounded="api")
        return ({t.name: t.target_commit for t in refs.tags}, {b.name: b.target_commit for b in refs.branches})

    def build_blob_ids(self, repo_id: str, revision: str) -> dict[str, str]:
        """Path -> git blob id of every file under build/ at `revision` (none yet on a fresh repo: {})."""
        from huggingface_hub.errors import RemoteEntryNotFoundError
        from huggingface_hub.hf_api import RepoFile

        def listing() -> list:
            try:
                return list(self.api.list_repo_tree(repo_id, path_in_repo=fmt.BUILD_DIR, recursive=True,
                                                    repo_type=REPO_TYPE, revision=revision))
            except RemoteEntryNotFoundError:  # no build/ folder yet on a fresh repo
                return []

        entries = self._call(repo_id, f"listing {fmt.BUILD_DIR}/ at {revision[:12]}", listing, bounded="api")
        return {e.path: e.blob_id for e in entries if isinstance(e, RepoFile)}

    def upload(self, repo_id: str, root: Path, add: list[str], delete: list[str], message: str,
               revision: str = "main", parent: str | None = None) -> str:
        """One commit on `revision` adding `add` (paths under `root`, as in the repo) and deleting `delete`; its
        id. parent: the commit the branch must still be at (RefMovedError where it moved)."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        ops: list = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(root / p)) for p in add]
        ops += [CommitOperationDelete(path_in_repo=p) for p in delete]
        info = self._call(repo_id, "uploading", lambda: self.api.create_commit(
            repo_id, ops, commit_message=message, repo_type=REPO_TYPE, revision=revision, parent_commit=parent))
        return info.oid

    def move_branch(self, repo_id: str, branch: str, commit: str, expected: str | None) -> bool:
        """Point `branch` at `commit` in one compare-and-swap where it is at `expected` (None: absent), through
        `kernel-hub serve`'s extension of the branch route. True when it moved; RefMovedError when it was not at
        `expected`; False when the server has no such move (the Hub answers 409: the branch exists), so the
        caller commits onto the branch instead."""
        from urllib.parse import quote

        from huggingface_hub.utils import get_session, hf_raise_for_status

        url = f"{self.endpoint}/api/{REPO_TYPE}s/{check_repo_id(repo_id)}/branch/{quote(branch, safe='')}"
        body = {"startingPoint": commit, "move": True, "expectedCommit": expected}

        def post() -> bool:
            response = get_session().post(url, json=body, headers=self.api._build_hf_headers())
            if response.status_code == 409:
                return False
            hf_raise_for_status(response)
            return True

        return self._call(repo_id, f"moving branch {branch}", post)

    def create_tag(self, repo_id: str, tag: str, commit: str, message: str) -> None:
        self._call(repo_id, f"tagging {tag}", lambda: self.api.create_tag(
            repo_id, tag=tag, revision=commit, repo_type=REPO_TYPE, tag_message=message))

    def delete_branch(self, repo_id: str, branch: str) -> None:
        self._call(repo_id, f"moving branch {branch}",
                   lambda: self.api.delete_branch(repo_id, branch=branch, repo_type=REPO_TYPE))

    def create_branch(self, repo_id: str, branch: str, commit: str) -> None:
        self._call(repo_id, f"creating branch {branch}",
                   lambda: self.api.create_branch(repo_id, branch=branch, revision=commit, repo_type=REPO_TYPE))

    # -- Source protocol --------------------------------------------------------------------------
    def refs(self, repo_id: str) -> list[Ref]:
        """Tags and branches (1 request); kept in the cache so offline resolution works. Refs whose name or
        target is not safe are dropped (see checked_refs)."""
        saved = self.root(repo_id) / "refs.json"
        if self.offline:
            data = read_json(saved)
            if not isinstance(data, dict) or not isinstance(data.get("refs"), list):
                raise self._offline_error(repo_id, "its list of versions")
            return checked_refs([(r.get("name"), r.get("kind"), r.get("commit")) for r in data["refs"]
                                 if isinstance(r, dict) and r.get("kind") in ("tag", "branch")])
        got = self._call(repo_id, "listing refs",
                         lambda: self.api.list_repo_refs(self.hub_repo(repo_id), repo_type=REPO_TYPE), bounded="api")
        if len(got.branches) + len(got.tags) > MAX_LISTING_ENTRIES:
            raise KernelHubError(f"Hub at {self.endpoint}: {repo_id} lists more than {MAX_LISTING_ENTRIES} refs; "
                                 "refused")
        refs = checked_refs([(b.name, "branch", b.target_commit) for b in got.branches]
                            + [(t.name, "tag", t.target_commit) for t in got.tags])
        note_json(saved, {"endpoint": self.endpoint,
                          "refs": [{"name": r.name, "kind": r.kind, "commit": r.commit} for r in refs]})
        return refs

    def listing(self, repo_id: str, commit: str) -> dict[str, Any]:
        """What `commit` publishes under build/, from ONE recursive tree listing (then cached: commits are
        immutable): {"bundles": {variant: blob id of build/<variant>.tar}, "trees": {variant: {path in the
        variant: blob id}}} (kernel-builder's `build/<variant>/` trees). Unsafe names are left out."""
        key = (repo_id, check_commit(commit))
        if key in self._listings:
            return self._listings[key]
        saved = self._listing_file(repo_id, commit)
        data = _checked_listing(read_json(saved))
        if data is None:
            if self.offline:
                raise self._offline_error(repo_id, f"the build listing of commit {commit[:12]}")
            data = self._list_builds(repo_id, commit)
            note_json(saved, data)
        self._listings[key] = data
        return data

    def _list_builds(self, repo_id: str, commit: str) -> dict[str, Any]:
        """The listing (see `listing`) from the Hub: ONE recursive tree listing of build/. A listing that names one
        path twice (which of two ids would it be?) or lists more than MAX_LISTING_ENTRIES entries is refused
        whole, and nothing of it is cached."""
        from huggingface_hub.errors import RemoteEntryNotFoundError
        from huggingface_hub.hf_api import RepoFile

        def tree() -> list:
            try:
                found = self.api.list_repo_tree(self.hub_repo(repo_id), path_in_repo=fmt.BUILD_DIR,
                                                repo_type=REPO_TYPE, revision=commit, recursive=True)
                return list(itertools.islice(found, MAX_LISTING_ENTRIES + 1))
            except RemoteEntryNotFoundError:  # no build/ at all: nothing published
                return []

        entries = self._call(repo_id, f"listing builds at {commit[:12]}", tree, bounded="api")
        if len(entries) > MAX_LISTING_ENTRIES:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: the Hub lists more than {MAX_LISTING_ENTRIES} entries "
                                 f"under {fmt.BUILD_DIR}/; refused")
        paths = [e.path for e in entries if isinstance(getattr(e, "path", None), str)]
        if len(set(paths)) != len(paths):
            twice = sorted(p for p in set(paths) if paths.count(p) > 1)
            raise IntegrityError(f"{repo_id}@{commit[:12]}: the Hub's listing names {twice[0]} twice; refused")
        raw: dict[str, Any] = {"bundles": {}, "trees": {}, "sizes": {}}
        for e in entries:
            if isinstance(e, RepoFile) and isinstance(e.path, str):
                rel = e.path[len(fmt.BUILD_DIR) + 1:] if e.path.startswith(f"{fmt.BUILD_DIR}/") else ""
                name, _, inner = rel.partition("/")
                size = e.lfs.size if e.lfs is not None else e.size
                if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                    raw["sizes"][rel] = size
                if inner:
                    raw["trees"].setdefault(name, {})[inner] = e.blob_id
                elif name.endswith(fmt.BUNDLE_SUFFIX):
                    raw["bundles"][name[:-len(fmt.BUNDLE_SUFFIX)]] = e.blob_id
        return _checked_listing(raw) or {"bundles": {}, "trees": {}, "sizes": {}}

    def _forget_listing(self, repo_id: str, commit: str) -> None:
        """Drop a listing (memory and cache): the next use lists again."""
        self._listings.pop((repo_id, commit), None)
        with contextlib.suppress(OSError):
            self._listing_file(repo_id, commit).unlink(missing_ok=True)

    def _cached_variant(self, repo_id: str, commit: str, name: str) -> Variant | None:
        folder = self.build_dir(repo_id, commit, name)
        if not folder.is_dir():
            return None
        try:
            return fmt.read_build_info(folder, f"{repo_id}@{commit[:12]} [{name}]", name).variant
        except KernelHubError:
            return None

    def published_metadata(self, repo_id: str, commit: str) -> KernelMetadata | None:
        """The kernel.yaml a release publishes at its root (requirements and generations of every variant), with
        one small download and nothing unpacked or imported: what `info` shows before a build is cached. None
        where it is missing, too large or not a valid kernel.yaml (the caller keeps what the names say)."""
        from ..package.metadata import METADATA_FILE, parse_metadata, read_yaml

        try:
            repo, revision = self.hub_repo(repo_id), check_commit(commit)
            if not self.offline:  # the size first: an oversized kernel.yaml is never downloaded at all
                from huggingface_hub import hf_hub_url

                url = hf_hub_url(repo, METADATA_FILE, repo_type=REPO_TYPE, revision=revision, endpoint=self.endpoint)
                head = self._call(repo_id, f"checking {METADATA_FILE} at {commit[:12]}",
                                  lambda: self.api.get_hf_file_metadata(url=url), bounded="api")
                if head.size is None or head.size > _MAX_PUBLISHED_METADATA:
                    return None
            path = Path(self._call(repo_id, f"downloading {METADATA_FILE} at {commit[:12]}", lambda: (
                self.api.hf_hub_download(repo, METADATA_FILE, repo_type=REPO_TYPE, revision=revision,
                                         cache_dir=self.cache_dir, local_files_only=self.offline)),
                bounded="download", max_bytes=_MAX_PUBLISHED_METADATA))
            if path.stat().st_size > _MAX_PUBLISHED_METADATA:  # a cached copy (offline) is checked as well
                return None
            return parse_metadata(read_yaml(path), f"{repo_id}@{commit[:12]} {METADATA_FILE}")
        except (KernelHubError, OSError, ValueError):
            return None

    def variants(self, repo_id: str, commit: str) -> list[Variant]:
        """The variants at `commit`, with their full metadata where a build of that commit is cached: our bundles,
        and kernel-builder trees (a tree beside a bundle of the same name is the bundle's HF-kernels copy)."""
        listed = self.listing(repo_id, commit)
        out = []
        for name in sorted(listed["bundles"]):
            v = self._cached_variant(repo_id, commit, name) or fmt.variant_from_name(name)
            if v is not None:
                out.append(v)
        for name in sorted(set(listed["trees"]) - set(listed["bundles"])):
            out.append(self._cached_variant(repo_id, commit, name) or builder_variant(name))
        return out

    def candidate_variants(self, repo_id: str, commit: str, names: list[str]) -> list[Variant]:
        """The variants to choose from, without a listing request where one is not cached.

        Fetching the first preferred name that exists (HEAD + GET) stands in for the listing, so a fresh
        load costs refs + HEAD + GET = 3 requests; a name not published at `commit` costs one HEAD.
        """
        listed = (repo_id, commit) in self._listings or _checked_listing(
            read_json(self._listing_file(repo_id, commit))) is not None  # a listing of an older client's: not one
        if listed:
            return self.variants(repo_id, commit)
        if self.offline:
            commit_dir = safe_join(self.builds_root(repo_id), check_commit(commit))
            names_here = sorted(p.name for p in commit_dir.iterdir()) if commit_dir.is_dir() else []
            found = [v for n in names_here if _is_variant_name(n)
                     and (v := self._cached_variant(repo_id, commit, n)) is not None]
            if not found:
                raise self._offline_error(repo_id, f"a build of commit {commit[:12]}")
            return found
        for name in names:
            guess = fmt.variant_from_name(name)
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

        Trust anchor: the unpacked build is checked against its own metadata.json, not against the Hub again, so
        whoever can write the cache can rewrite both consistently; only `expected` (a lock's digests) pins the
        files from outside the cache (docs/trust.md: "What anchors a cached build").
        """
        final = self.build_dir(repo_id, commit, variant.name)
        self.clean_stale(repo_id)
        label = f"{repo_id}@{commit[:12]} [{variant.name}]"
        problem: KernelHubError | None = None
        tree = variant.dialect == KERNEL_BUILDER
        for attempt in ("unpacked", "cached bundle", "download"):
            if attempt == "unpacked" and not (final.exists() or final.is_symlink()):
                continue
            if attempt == "download" and self.offline:
                break
            try:
                cached = self._cached_variant(repo_id, commit, variant.name) if attempt == "unpacked" else None
                if cached is not None and cached.dialect == KERNEL_BUILDER:
                    tree, variant = True, cached  # unpacked from the tree at this commit (HF kernels' choice)
                if attempt == "unpacked" and not tree and self._bundle_superseded(
                        repo_id, commit, variant.name, _file_blob(final / fmt.VARIANT_METADATA), listed_only=True):
                    raise IntegrityError(f"{label}: the cached build is the bundle, but build/{variant.name}/ at this "
                                         "commit (what HF kernels loads) is another build")
                if attempt != "unpacked" and not tree:
                    bundle = self._download_bundle(repo_id, commit, variant.name, force=attempt == "download")
                    if self._bundle_superseded(repo_id, commit, variant.name, fmt.bundle_metadata_blob(bundle)):
                        tree, variant = True, builder_variant(variant.name)  # HF kernels' choice: the tree
                    else:
                        self._unpack(repo_id, bundle, final, label)
                if attempt != "unpacked" and tree:
                    self._assemble_tree(repo_id, commit, variant, final, label, force=attempt == "download")
                return self._checked_build(repo_id, commit, final, variant.name, expected, label)
            except _DAMAGED as exc:
                problem = exc
                self._discard(repo_id, final)
            except KernelHubError:
                if problem is None or not self.offline:
                    raise
                raise IntegrityError(f"{problem}; offline, and no clean copy is cached to restore it") from None
        assert problem is not None
        raise problem

    def _bundle_superseded(self, repo_id: str, commit: str, name: str, bundle_metadata: str | None,
                           listed_only: bool = False) -> bool:
        """One rule for a commit that holds both `build/<name>.tar` and a `build/<name>/` tree: where HF kernels reads
        that tree (a torch variant name it parses), kernel-hub loads what HF kernels loads. The bundle stands only
        when it is the same build: its metadata.json is the tree's (git blob id `bundle_metadata`), as our publish
        writes them; otherwise the tree wins. listed_only: decide from a listing already at hand (no request)."""
        if parse_builder_name(name) is None:
            return False
        known = self._listings.get((repo_id, commit)) or _checked_listing(read_json(self._listing_file(repo_id,
                                                                                                      commit)))
        if known is None:
            if listed_only or self.offline:
                return False
            known = self.listing(repo_id, commit)
        tree_metadata = known["trees"].get(name, {}).get(fmt.VARIANT_METADATA)
        return tree_metadata is not None and tree_metadata != bundle_metadata

    def verification(self, repo_id: str, commit: str, variant: Variant) -> str:
        """How a fetch of `variant` checks its bytes, for `resolve` and `info`: a kernel-builder tree's metadata.json
        is read (one small download, nothing imported) to say whether it records a digest."""
        if variant.dialect != KERNEL_BUILDER:
            cached = self._cached_variant(repo_id, commit, variant.name)
            if cached is None or cached.dialect != KERNEL_BUILDER:
                return "sha256 of every file (the bundle's metadata.json), bundle against the Hub listing"
            variant = cached  # the bundle was another build than the tree beside it: the tree was fetched
        folder = self.build_dir(repo_id, commit, variant.name)
        if folder.is_dir():
            with contextlib.suppress(KernelHubError):
                return fmt.read_build_info(folder, repo_id, variant.name).verified + " (cached)"
        files = self.listing(repo_id, commit)["trees"].get(variant.name) or {}
        if fmt.VARIANT_METADATA not in files:
            return f"unverifiable: no {fmt.VARIANT_METADATA} in build/{variant.name}/"
        label = f"{repo_id}@{commit[:12]} [{variant.name}]"
        try:
            data = self._download_file(repo_id, commit, f"{fmt.BUILD_DIR}/{variant.name}/{fmt.VARIANT_METADATA}",
                                       files[fmt.VARIANT_METADATA], force=False, max_bytes=builder.MAX_METADATA_BYTES)
            meta = builder.parse_builder_metadata(data, label)
        except KernelHubError as exc:
            return f"unverifiable: {one_line(str(exc), 200)}"
        return builder.WITH_DIGEST if meta.digest is not None else builder.NO_DIGEST

    # -- internals --------------------------------------------------------------------------------
    def _download_bundle(self, repo_id: str, commit: str, name: str, force: bool) -> Path:
        path_in_repo = fmt.bundle_path(name)
        cap = build_byte_cap()
        listed_size = self._listed_sizes(repo_id, commit).get(f"{name}{fmt.BUNDLE_SUFFIX}")
        if listed_size is not None and listed_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is {listed_size} bytes, over the "
                                 f"{cap}-byte cap on one build ({MAX_DOWNLOAD_ENV} sets it); not downloaded")
        path = Path(self._call(repo_id, f"downloading {path_in_repo} at {commit[:12]}", lambda: (
            self.api.hf_hub_download(self.hub_repo(repo_id), path_in_repo, repo_type=REPO_TYPE,
                                     revision=commit, cache_dir=self.cache_dir, local_files_only=self.offline,
                                     force_download=force)), bounded="download", max_bytes=cap))
        if path.stat().st_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is over the {cap}-byte cap on one build "
                                 f"({MAX_DOWNLOAD_ENV} sets it)")
        listed = self._listed_bundles(repo_id, commit).get(name)
        if listed and fmt.git_blob_id(path) != listed and not self.offline:
            # The listing may be the wrong one (a cached listing from a hostile answer): drop it, list again.
            self._forget_listing(repo_id, commit)
            listed = self.listing(repo_id, commit)["bundles"].get(name)
        if listed and fmt.git_blob_id(path) != listed:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} does not match the Hub listing")
        blob = path.resolve().name  # the Hub cache stores a file under its ETag: the git blob id here
        if not listed and len(blob) == 40 and fmt.git_blob_id(path) != blob:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} does not match its ETag")
        return path

    def _listed_sizes(self, repo_id: str, commit: str) -> dict[str, int]:
        """Sizes (path under build/ -> bytes) a listing already fetched (or cached) gives; {} where none is known."""
        known = self._listings.get((repo_id, commit)) or _checked_listing(
            read_json(self._listing_file(repo_id, commit)))
        return known.get("sizes", {}) if known else {}

    def _listed_bundles(self, repo_id: str, commit: str) -> dict[str, str]:
        """The bundles a listing already fetched (or cached) names; {} where none is known yet (no request)."""
        known = self._listings.get((repo_id, commit)) or _checked_listing(
            read_json(self._listing_file(repo_id, commit)))
        return known["bundles"] if known else {}

    def _download_file(self, repo_id: str, commit: str, path_in_repo: str, blob: str, force: bool,
                       max_bytes: int | None = None) -> bytes:
        """One file of a tree at `commit`, its bytes checked against the git blob id the listing gave. At most
        `max_bytes` (default: the build cap): refused from the listing's size before any request, cut while it
        streams, and never read past the bound from the cache."""
        cap = build_byte_cap() if max_bytes is None else max_bytes
        listed_size = self._listed_sizes(repo_id, commit).get(path_in_repo[len(fmt.BUILD_DIR) + 1:])
        if listed_size is not None and listed_size > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is {listed_size} bytes, over its "
                                 f"{cap}-byte bound; not downloaded")
        path = Path(self._call(repo_id, f"downloading {path_in_repo} at {commit[:12]}", lambda: (
            self.api.hf_hub_download(self.hub_repo(repo_id), path_in_repo, repo_type=REPO_TYPE, revision=commit,
                                     cache_dir=self.cache_dir, local_files_only=self.offline,
                                     force_download=force)), bounded="download", max_bytes=max_bytes))
        with open(path, "rb") as handle:
            data = handle.read(cap + 1)
        if len(data) > cap:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: {path_in_repo} is larger than its {cap}-byte bound")
        if fmt.git_blob_id_bytes(data) != blob:
            raise IntegrityError(f"{repo_id}@{commit[:12]}: file {path_in_repo} does not match the Hub listing")
        return data

    def _assemble_tree(self, repo_id: str, commit: str, variant: Variant, final: Path, label: str,
                       force: bool) -> None:
        """A kernel-builder variant: its metadata.json, then every file, each checked against the metadata's
        sha256 digest (or, with none, the listing's blob id) before anything is written where the loader looks;
        then the import folder is renamed into place in one step."""
        files = self.listing(repo_id, commit)["trees"].get(variant.name)
        if not files or fmt.VARIANT_METADATA not in files:
            raise KernelNotFoundError(f"{label}: the variant has no {fmt.VARIANT_METADATA} at this commit")
        base = f"{fmt.BUILD_DIR}/{variant.name}"
        meta = builder.parse_builder_metadata(self._download_file(
            repo_id, commit, f"{base}/{fmt.VARIANT_METADATA}", files[fmt.VARIANT_METADATA], force,
            max_bytes=builder.MAX_METADATA_BYTES), label)
        builder.check_python_depends(meta.python_depends, label)
        expected = builder.expected_files(meta, files, label)
        kind, where = builder.package_files(meta, sorted(expected), label)
        cap = build_byte_cap()
        sizes = self._listed_sizes(repo_id, commit)
        listed = sum(sizes.get(f"{variant.name}/{rel}", 0) for rel in expected)
        if listed > cap:
            raise IntegrityError(f"{label}: the build's files are {listed} bytes in the Hub listing, over the "
                                 f"{cap}-byte cap on one build ({MAX_DOWNLOAD_ENV} sets it); nothing downloaded")
        verified = builder.WITH_DIGEST if meta.digest is not None else builder.NO_DIGEST
        tmp = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.partial")
        try:
            writer = builder.BuildWriter(tmp, meta, label)
            fetched = written = 0
            with operation(f"fetching {label}", download=True, max_bytes=cap):
                for rel, (algorithm, value) in sorted(expected.items()):
                    data = self._download_file(repo_id, commit, f"{base}/{rel}", files[rel], force,
                                               max_bytes=cap - fetched)
                    fetched += len(data)
                    if algorithm == "sha256" and sha256_bytes(data) != value:
                        raise IntegrityError(f"{label}: file {rel} does not match metadata.json's digest (tampered "
                                             "or corrupt); refused before any import")
                    if kind == "zip" and rel == where:
                        written += builder.unzip_to(data, writer.add, label, cap - written)
                    elif (kind == "package" and rel.startswith(where)) or kind == "root":
                        written += len(data)
                        if written > cap:
                            raise IntegrityError(f"{label}: the build is over the {cap}-byte cap on one build "
                                                 f"({MAX_DOWNLOAD_ENV} sets it)")
                        writer.add(rel[len(where):] if kind == "package" else rel, [data])
                    del data  # memory: one file at a time
            writer.finish(variant, verified, repo_id)
            _check_unpacked(tmp, label, final.name)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
        finally:
            if tmp.exists():
                safe_rmtree(final.parent, tmp)

    def _unpack(self, repo_id: str, bundle: Path, final: Path, label: str) -> None:
        """Unpack into a private folder beside `final`, check it, then rename it into place in one step."""
        tmp = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.partial")
        try:
            fmt.unpack_bundle(bundle, tmp, label, build_byte_cap())
            _check_unpacked(tmp, label, final.name)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # not a lost race with another process: a real failure
                    raise
        finally:
            if tmp.exists():
                safe_rmtree(final.parent, tmp)

    def _discard(self, repo_id: str, final: Path) -> None:
        """Move a damaged build aside, then delete it: readers never see a half-deleted build. Only ever inside
        this repo's builds folder."""
        builds = self.builds_root(repo_id)
        if not (final.exists() or final.is_symlink()):
            return
        trash = safe_join(final.parent, f"{final.name}.{uuid.uuid4().hex}.trash")
        with contextlib.suppress(OSError):
            os.rename(final, trash)
            safe_rmtree(builds, trash)

    def clean_stale(self, repo_id: str) -> list[Path]:
        """Remove what killed processes left in this repo's cache folder, once per source: our .partial/.trash
        folders and .tmp files older than STALE_SECONDS, and huggingface_hub's `*.incomplete` blobs that no
        download holds the lock of. Returns what was removed."""
        if repo_id in self._cleaned:
            return []
        self._cleaned.add(repo_id)
        removed = []
        builds = self.builds_root(repo_id)
        now = time.time()
        root = self.root(repo_id)
        ours = [*builds.glob("*/*"), *root.glob(".*.tmp"), *root.glob("listings/.*.tmp")] if root.is_dir() else []
        for path in ours:
            if path.name.endswith((".partial", ".trash", ".tmp")):
                with contextlib.suppress(OSError):
                    if now - path.lstat().st_mtime > STALE_SECONDS:
                        safe_rmtree(root, path)
                        removed.append(path)
        blobs = self.repo_dir(repo_id) / "blobs"
        for path in blobs.glob("*.incomplete") if blobs.is_dir() else []:
            if self._download_dead(repo_id, path, now):
                with contextlib.suppress(OSError, KernelHubError):
                    safe_rmtree(blobs, path)
                    removed.append(path)
        return removed

    def _download_dead(self, repo_id: str, incomplete: Path, now: float) -> bool:
        """True when no process is downloading into `incomplete`: huggingface_hub holds the blob's lock
        (`.locks/<repo folder>/<etag>.lock`) for the whole download, so a lock we can take proves it dead."""
        etag = incomplete.name.split(".", 1)[0]
        if not fmt.is_blob_id(etag) and not re.fullmatch(r"[0-9a-f]{64}", etag):
            return False
        lock_path = self.cache_dir / ".locks" / self.repo_dir(repo_id).name / f"{etag}.lock"
        try:
            from filelock import FileLock, Timeout

            lock = FileLock(str(lock_path), timeout=0)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                return False
            lock.release()
            return True
        except Exception:  # no usable lock here: fall back to age
            try:
                return now - incomplete.lstat().st_mtime > STALE_SECONDS
            except OSError:
                return False

    def _checked_build(self, repo_id: str, commit: str, folder: Path, name: str, expected: dict[str, str] | None,
                       label: str) -> Build:
        info = _check_unpacked(folder, label, name)
        digests = info.package_digests()
        if expected is not None and expected != digests:
            changed = sorted(set(expected) ^ set(digests)) or sorted(
                k for k in expected if expected[k] != digests.get(k))
            raise IntegrityError(f"{label}: file {changed[0]} differs from the lock")
        if info.python_depends:  # what is installed can change between loads of a cached build
            builder.check_python_depends(info.python_depends, label)
        return Build(repo_id=repo_id, version=info.version, commit=commit, variant=info.variant,
                     package_dir=safe_join(folder, info.python_name), source=self.endpoint, digests=digests,
                     metadata=None, verified=info.verified, kernel_depends=info.kernel_depends,
                     kernels_minver=info.kernels_minver)


def builder_variant(name: str) -> Variant:
    """A kernel-builder tree as a variant: its name says framework and backend (builder_names.py); a name it
    cannot read stays in the trace, rejected with that reason."""
    named = parse_builder_name(name)
    return Variant(name=name, framework="torch", backend=named.backend if named else "unknown",
                   dialect=KERNEL_BUILDER)


def _checked_listing(data: object) -> dict[str, Any] | None:
    """A build listing from the server or the cache with only safe names and real blob ids kept (None: not a
    listing of this format, e.g. an older cache entry)."""
    if not isinstance(data, dict) or not isinstance(data.get("bundles"), dict) or not isinstance(
            data.get("trees"), dict):
        return None
    bundles = {k: v for k, v in data["bundles"].items() if _is_variant_name(k) and fmt.is_blob_id(v)}
    trees: dict[str, dict[str, str]] = {}
    for name, files in data["trees"].items():
        if not _is_variant_name(name) or not isinstance(files, dict) or len(files) > fmt.MAX_BUNDLE_FILES:
            continue
        kept = {}
        for rel, blob in files.items():
            try:
                check_relative_path(rel)
            except UnsafeNameError:
                continue
            if fmt.is_blob_id(blob):
                kept[rel] = blob
        if kept:
            trees[name] = kept
    raw_sizes = data.get("sizes")
    sizes = {k: v for k, v in raw_sizes.items() if isinstance(k, str) and isinstance(v, int)
             and not isinstance(v, bool) and v >= 0} if isinstance(raw_sizes, dict) else {}
    return {"bundles": bundles, "trees": trees, "sizes": sizes}


def _is_variant_name(name: str) -> bool:
    try:
        check_variant_name(name)
    except UnsafeNameError:
        return False
    return True


def _file_blob(path: Path) -> str | None:
    """The git blob id of a file, or None where it cannot be read."""
    try:
        return fmt.git_blob_id(path)
    except OSError:
        return None


def _check_unpacked(folder: Path, label: str, name: str) -> fmt.BuildInfo:
    """An unpacked variant: a plain folder whose metadata.json describes `name`, every file against the sha256
    it records, nothing extra (no bytecode, no links, nothing outside the package)."""
    if folder.is_symlink() or not folder.is_dir():
        raise IntegrityError(f"{label}: the cached build is not a plain folder")
    info = fmt.read_build_info(folder, label, name)
    verify_tree(folder, info.sha256, label, ignore=frozenset({fmt.VARIANT_METADATA}), strict=True)
    return info
