"""Every request kernel-hub makes to a Hub endpoint, through huggingface_hub's public API only.

One `HubClient` per endpoint and token: the calls loading needs (refs, the tree of build/, one file), the calls
publishing and the CLI need (whoami, create a repo, commit, tag, move a branch, list an org's kernel repos), and the
one wrapper (`_call`) that turns any failure into one line naming the endpoint, what the server said and, for a
refused request, what to do about the token. Nothing here reads or writes kernel-hub's own cache state.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...decide.hf_conventions import kernels_cache
from ...errors import KernelHubError, KernelNotFoundError, RefMovedError, VersionSpecError
from ...names import check_repo_id
from ...package import buildfmt as fmt
from ...ui.display import one_line
from ..http_limits import HubAnswerError, bounded_transport, check_limits, operation, request_timeout

REPO_TYPE = fmt.REPO_TYPE
#: Entries of one listing (refs, a build/ folder) the client reads; a server listing more is refused.
MAX_LISTING_ENTRIES = 50_000

T = TypeVar("T")

def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return one_line(lines[0]) if lines else type(exc).__name__


def auth_hint(status: int | None, token_sent: bool) -> str:
    """What to do about a refused request: a 401 with no token sent means the server wants one, whatever its
    message says about credentials."""
    if status == 401 and not token_sent:
        return " (no token was sent, and this endpoint wants one: set HF_TOKEN)"
    if status in (401, 403):
        return " (the token sent was refused: check HF_TOKEN or --token for this endpoint)"
    return ""


def server_message(exc: BaseException) -> str | None:
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


def install_client_timeout() -> None:
    """Give huggingface_hub's shared HTTP client our bounds, unless the user configured their own client.

    huggingface_hub's default client waits forever and reads answers of any size; a stalled, trickling or endless
    server must become a one-line error instead. http_limits.bounded_transport: an overall deadline per request
    (KERNEL_HUB_HTTP_TIMEOUT, default 30 s, for API answers; KERNEL_HUB_DOWNLOAD_TIMEOUT for files) and a size cap
    on every answer. The shared client is huggingface_hub's default where it has no timeout at all (a client of the
    user's own, or ours once installed, has one); its request hooks (offline mode, request ids) are kept.
    """
    try:
        import httpx2
        from huggingface_hub.utils import get_session, set_client_factory
    except ImportError:  # a huggingface_hub without this hook: keep its behaviour
        return
    shared = get_session()
    if shared.timeout != httpx2.Timeout(None):
        return
    hooks = list(shared.event_hooks.get("request", []))
    seconds = request_timeout()

    def factory() -> Any:
        return httpx2.Client(event_hooks={"request": list(hooks)}, follow_redirects=True,
                             timeout=httpx2.Timeout(seconds), transport=bounded_transport())

    set_client_factory(factory)


class HubClient:
    """One Hub endpoint (HF_ENDPOINT unless given) and token, downloads cached in `cache_dir` (huggingface_hub's
    layout; default KERNELS_CACHE, HF kernels' cache root, else HF_HUB_CACHE). `offline`: only the cache answers
    (HF_HUB_OFFLINE unless given)."""

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 cache_dir: str | Path | None = None, offline: bool | None = None):
        from huggingface_hub import HfApi, constants

        check_limits()  # a bad limit variable fails here, naming it, before any request
        install_client_timeout()
        self.api = HfApi(endpoint=endpoint or None, token=token)
        self.endpoint = self.api.endpoint.rstrip("/")
        self.cache_dir = Path(cache_dir or kernels_cache() or constants.HF_HUB_CACHE)
        self.offline = constants.HF_HUB_OFFLINE if offline is None else offline

    def token_sent(self) -> bool:
        """Whether huggingface_hub sends a token with this client's requests (given, or HF_TOKEN / the login)."""
        from huggingface_hub import get_token

        token = self.api.token
        return bool(token) if token is not None else bool(get_token())

    def headers(self) -> dict[str, str]:
        """The headers HfApi sends (token, user agent) for a request it has no method for."""
        from huggingface_hub.utils import build_hf_headers

        api = self.api
        return build_hf_headers(token=api.token, library_name=api.library_name, library_version=api.library_version,
                                user_agent=api.user_agent, headers=api.headers)

    def not_cached(self, repo_id: str, what: str) -> KernelHubError:
        """The error for an offline load whose `what` the cache does not hold."""
        return KernelHubError(
            f"{repo_id}: HF_HUB_OFFLINE=1 and {what} is not in the cache {self.cache_dir}; "
            f"run once online (endpoint {self.endpoint}) or unset HF_HUB_OFFLINE"
        )

    def _offline_call_error(self, repo_id: str, what: str) -> KernelHubError:
        return KernelHubError(
            f"{repo_id}: HF_HUB_OFFLINE=1 and {what} needs the Hub ({self.endpoint}): nothing usable is cached "
            f"in {self.cache_dir}; run once online or unset HF_HUB_OFFLINE"
        )

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

    # -- loading: `repo_id` names the errors, `repo` is the repo requested (a registry alias's target) ---------
    def list_refs(self, repo_id: str, repo: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(branches, tags) as (name, target commit), unchecked (1 request). More than MAX_LISTING_ENTRIES: refused."""
        got = self._call(repo_id, "listing refs", lambda: self.api.list_repo_refs(repo, repo_type=REPO_TYPE),
                         bounded="api")
        if len(got.branches) + len(got.tags) > MAX_LISTING_ENTRIES:
            raise KernelHubError(f"Hub at {self.endpoint}: {repo_id} lists more than {MAX_LISTING_ENTRIES} refs; "
                                 "refused")
        return ([(b.name, b.target_commit) for b in got.branches], [(t.name, t.target_commit) for t in got.tags])

    def list_build_tree(self, repo_id: str, repo: str, commit: str) -> list[Any]:
        """Every entry under build/ at `commit` from ONE recursive tree listing ([] where there is no build/), at
        most MAX_LISTING_ENTRIES + 1 of them (the caller refuses more)."""
        from huggingface_hub.errors import RemoteEntryNotFoundError

        def tree() -> list:
            try:
                found = self.api.list_repo_tree(repo, path_in_repo=fmt.BUILD_DIR, repo_type=REPO_TYPE,
                                                revision=commit, recursive=True)
                return list(itertools.islice(found, MAX_LISTING_ENTRIES + 1))
            except RemoteEntryNotFoundError:  # no build/ at all: nothing published
                return []

        return self._call(repo_id, f"listing builds at {commit[:12]}", tree, bounded="api")

    def download(self, repo_id: str, repo: str, path_in_repo: str, commit: str, *, force: bool = False,
                 max_bytes: int | None = None) -> Path:
        """One file at `commit` into the cache (only from the cache when offline), as one bounded download
        operation of at most `max_bytes` (None: the per-answer cap only); its local path."""
        return Path(self._call(repo_id, f"downloading {path_in_repo} at {commit[:12]}", lambda: (
            self.api.hf_hub_download(repo, path_in_repo, repo_type=REPO_TYPE, revision=commit,
                                     cache_dir=self.cache_dir, local_files_only=self.offline,
                                     force_download=force)), bounded="download", max_bytes=max_bytes))

    def file_size(self, repo_id: str, repo: str, path_in_repo: str, commit: str) -> int | None:
        """The size the server announces for one file at `commit` (a HEAD request; None where it says none)."""
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(repo, path_in_repo, repo_type=REPO_TYPE, revision=commit, endpoint=self.endpoint)
        head = self._call(repo_id, f"checking {path_in_repo} at {commit[:12]}",
                          lambda: self.api.get_hf_file_metadata(url=url), bounded="api")
        return head.size

    def read_small_file(self, repo: str, path_in_repo: str, commit: str, max_bytes: int) -> bytes | None:
        """Up to `max_bytes` of one file at `commit` (None where the repo has no such file). Failures are raised as
        huggingface_hub raises them."""
        from huggingface_hub.errors import EntryNotFoundError

        try:
            local = self.api.hf_hub_download(repo, path_in_repo, repo_type=REPO_TYPE, revision=commit,
                                             cache_dir=self.cache_dir, local_files_only=self.offline)
        except EntryNotFoundError:
            return None
        with open(local, "rb") as f:
            return f.read(max_bytes)

    # -- listing (kernel-hub list --hub) ---------------------------------------------------------------
    def list_kernel_repos(self, org: str) -> list[Any]:
        """GET /api/kernels?author=ORG through huggingface_hub's session and headers: the answer as the server
        gave it (a list; untrusted, the caller checks every entry). Failures are raised as they come."""
        from huggingface_hub.utils import get_session, hf_raise_for_status

        with operation(f"listing the kernel repos of {org}"):
            response = get_session().get(f"{self.endpoint}/api/kernels", params={"author": org},
                                         headers=self.headers())
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
            response = get_session().post(url, json=body, headers=self.headers())
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
