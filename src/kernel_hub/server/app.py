"""The subset of the Hugging Face Hub HTTP API that huggingface_hub and HF `kernels` use, over a GitStore.

Reads: repo info, refs, commits, tree listing, paths-info, file resolve (HEAD and GET, with ETag,
X-Repo-Commit, Content-Length and ranges), organisation overview. Writes (token required): repo creation and
deletion, preupload (always "regular": no LFS needed), the NDJSON commit API (additions and deletions),
branch and tag creation and deletion.

Every request is routed and its token checked from the request line and headers alone; only then is
its body read, under that route's size limit (transport.read_body). Routing is by raw path segments
because the Hub quotes revisions with `safe=""` (`refs%2Fheads%2Fv1`).
"""

from __future__ import annotations

import hmac
import html
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING
from urllib.parse import unquote, urlencode

import uvicorn
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import KernelHubError
from . import checks, payloads
from .errors import HubError, error_response, from_error
from .gitstore import Entry, GitRepo, GitStore
from .transport import FileResponse, Limits, bind, body_pending, guarded_h11, parse_range, read_body, url_of

if TYPE_CHECKING:
    from types import FrameType

    from starlette.datastructures import QueryParams

    from ..json_types import JsonDict, JsonValue

_TYPE_PLURALS = {f"{t}s": t for t in checks.REPO_TYPES}
_URL_PREFIX = {"model": "", "kernel": "kernels/", "dataset": "datasets/"}
_AUTH_MESSAGE = "Invalid credentials in Authorization header"
_COMMITS_PAGE = 50
log = logging.getLogger("kernel_hub.server")


@dataclass
class ServerState:
    store: GitStore
    token: str | None
    read_token_required: bool
    trusted_orgs: tuple[str, ...]
    limits: Limits = field(default_factory=Limits)
    stopping: threading.Event = field(default_factory=threading.Event)  # set on SIGTERM/SIGINT: long walks end


# -- one request ----------------------------------------------------------------------------------
@dataclass
class Call:
    """One routed, authorised request with its body read, handed to a synchronous handler."""

    request: Request
    method: str
    segments: list[str]
    raw_path: str
    body: bytes | IO[bytes] = b""

    @property
    def query(self) -> QueryParams:
        return self.request.query_params

    def json(self, what: str) -> JsonValue:
        assert isinstance(self.body, bytes)
        if self.request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return payloads.load_form(self.body)
        return payloads.load_json(self.body, what)

    def lines(self) -> Iterator[bytes]:
        return iter(self.body.splitlines() if isinstance(self.body, bytes) else self.body)

    @property
    def base_url(self) -> str:
        return str(self.request.base_url).rstrip("/")


@dataclass(frozen=True)
class Route:
    """What a request line maps to: the handler, who may call it, and what body it reads.

    access: "open" (anyone), "read" (the token when reads need one), "write" (the token), "token" (the
    token, even on a read-only server: whoami). body: "none", "json" (small) or "commit" (large, spooled).
    """

    handler: Callable[[Call], Response]
    access: str = "read"
    body: str = "none"


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _int_param(call: Call, name: str, default: int, lo: int, hi: int) -> int:
    raw = call.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise HubError(400, f"query parameter {name} must be an integer in {lo}..{hi}")
    return value


def _entry_json(entry: Entry, last_commit: dict[str, str] | None = None) -> JsonDict:
    out: JsonDict = {"type": entry.kind, "oid": entry.oid, "size": entry.size, "path": entry.path}
    if last_commit is not None:
        out["lastCommit"] = last_commit
    return out


class HubApp:
    """Routing, authorisation and the handlers. Handlers raise HubError for every refusal."""

    def __init__(self, state: ServerState):
        self.state = state

    # -- auth -----------------------------------------------------------------------------------
    def _has_token(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        if self.state.token is None or auth[:7].lower() != "bearer ":
            return False
        given = auth[7:].strip().encode("latin-1", "replace")
        return hmac.compare_digest(given, self.state.token.encode())

    def authorize(self, access: str, request: Request) -> None:
        """Refuse (401/403) from the headers alone, before any body is read."""
        if access == "open" or (access == "read" and not self.state.read_token_required):
            return
        if access == "write" and self.state.token is None:
            raise HubError(403, "this store is read-only: `kernel-hub serve` was started without --token")
        if not self._has_token(request):
            raise HubError(401, _AUTH_MESSAGE)

    # -- routing --------------------------------------------------------------------------------
    def route(self, m: str, s: list[str]) -> Route:
        if s[:1] == ["api"]:
            rest = s[1:]
            if rest == ["whoami-v2"] and m == "GET":
                return Route(self.whoami, "token")
            if rest == ["repos", "create"] and m == "POST":
                return Route(self.create_repo, "write", "json")
            if rest == ["repos", "delete"] and m == "DELETE":
                return Route(self.delete_repo, "write", "json")
            if rest == ["agent-harnesses"] and m == "GET":
                # huggingface_hub's user-agent telemetry fetches this once a day; an empty registry ends it.
                return Route(lambda _: JSONResponse({"standardEnvVars": [], "harnesses": {}}), "open")
            if rest == ["validate-yaml"] and m == "POST":
                return Route(lambda _: JSONResponse({"errors": [], "warnings": []}), "read", "json")
            if len(rest) == 3 and rest[0] == "organizations" and rest[2] == "overview" and m == "GET":
                return Route(partial(self.org_overview, org=checks.namespace(rest[1])))
            if rest in (["models"], ["kernels"]) and m == "GET":  # list_models(author=...), /api/kernels?author=
                return Route(partial(self.list_repos, kernels_only=rest == ["kernels"]))
            if len(rest) >= 3 and rest[0] in _TYPE_PLURALS:
                return self.repo_route(m, _TYPE_PLURALS[rest[0]], checks.repo_id(rest[1], rest[2]), rest[3:])
            raise HubError(404, f"no such API route: /{'/'.join(s)}")
        # File resolve: /{ns}/{name}/resolve/{rev}/{path} or /{types}/{ns}/{name}/resolve/{rev}/{path}
        if m in ("GET", "HEAD"):
            if len(s) >= 5 and s[2] == "resolve" and s[0] not in _TYPE_PLURALS:
                repo_id, rev, path = checks.repo_id(s[0], s[1]), s[3], "/".join(s[4:])
                return Route(partial(self.resolve_file, repo_type="model", repo_id=repo_id, revision=rev, path=path))
            if len(s) >= 6 and s[0] in _TYPE_PLURALS and s[3] == "resolve":
                repo_id, rev, path = checks.repo_id(s[1], s[2]), s[4], "/".join(s[5:])
                return Route(partial(self.resolve_file, repo_type=_TYPE_PLURALS[s[0]], repo_id=repo_id,
                                     revision=rev, path=path))
        raise HubError(404, f"not found: /{'/'.join(s)}")

    def repo_route(self, m: str, repo_type: str, repo_id: str, rest: list[str]) -> Route:
        on = partial(partial, repo_type=repo_type, repo_id=repo_id)
        if m in ("GET", "HEAD") and not rest:
            return Route(on(self.repo_info, revision=None))
        if m == "GET" and len(rest) == 2 and rest[0] == "revision":
            return Route(on(self.repo_info, revision=rest[1]))
        if m == "GET" and rest == ["refs"]:
            return Route(on(self.refs))
        if m == "GET" and rest[:1] == ["commits"] and len(rest) <= 2:
            return Route(on(self.commits, revision=rest[1] if len(rest) == 2 else "main"))
        if m == "GET" and len(rest) >= 2 and rest[0] == "tree":
            return Route(on(self.tree, revision=rest[1], path="/".join(rest[2:])))
        if m == "POST" and len(rest) == 2 and rest[0] == "paths-info":
            return Route(on(self.paths_info, revision=rest[1]), "read", "json")
        if m == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return Route(on(self.preupload, revision=rest[1]), "write", "json")
        if m == "POST" and len(rest) == 2 and rest[0] == "commit":
            return Route(on(self.commit, revision=rest[1]), "write", "commit")
        if m == "POST" and len(rest) == 2 and rest[0] == "branch":
            return Route(on(self.create_branch, name=rest[1]), "write", "json")
        if m == "POST" and len(rest) == 2 and rest[0] == "tag":
            return Route(on(self.create_tag, revision=rest[1]), "write", "json")
        if m == "DELETE" and len(rest) == 2 and rest[0] in ("branch", "tag"):
            return Route(on(self.delete_ref, kind=rest[0], name=rest[1]), "write")
        raise HubError(404, f"no such repo API route: {m} {'/'.join(rest)}")

    # -- reads ----------------------------------------------------------------------------------
    def _repo(self, repo_type: str, repo_id: str) -> GitRepo:
        return self.state.store.get(repo_type, repo_id)

    def repo_info(self, call: Call, repo_type: str, repo_id: str, revision: str | None) -> Response:
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve(revision or "main")
        meta = repo.commit_meta(commit)
        blobs = _flag(call.query.get("blobs"))
        siblings = [{"rfilename": e.path, **({"size": e.size, "blobId": e.oid} if blobs else {})}
                    for e in repo.all_files(commit, sizes=blobs)]
        return JSONResponse({
            "_id": repo_id, "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": commit,
            "lastModified": meta.date, "createdAt": meta.date, "private": False, "gated": False,
            "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
        })

    def refs(self, call: Call, repo_type: str, repo_id: str) -> Response:
        branches, tags = self._repo(repo_type, repo_id).refs()
        return JSONResponse({
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in branches],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in tags],
            "converts": [],
            "pullRequests": [],
        })

    def commits(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        """The Hub's commit list: newest first, paged with ?p= and a Link header, as HfApi.list_repo_commits
        reads it."""
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve(revision)
        page = _int_param(call, "p", 0, 0, 1_000_000)
        limit = _int_param(call, "limit", _COMMITS_PAGE, 1, 1000)
        formatted = "formatted" in call.query.getlist("expand[]")
        found, more = repo.commits(commit, page * limit, limit)
        items = []
        for meta in found:
            item: JsonDict = {"id": meta.oid, "title": meta.title, "message": meta.message,
                                    "authors": [{"user": meta.author}], "date": meta.date}
            if formatted:
                item["formatted"] = {"title": html.escape(meta.title), "message": html.escape(meta.message)}
            items.append(item)
        headers = {}
        if more:
            query = [("p", str(page + 1)), ("limit", str(limit))] + ([("expand[]", "formatted")] if formatted else [])
            headers["Link"] = f'<{call.base_url}{call.raw_path}?{urlencode(query)}>; rel="next"'
        return JSONResponse(items, headers=headers)

    def _with_last_commits(self, repo: GitRepo, commit: str, entries: list[Entry]) -> list[JsonDict]:
        last = repo.last_commits(commit, [e.path for e in entries], cancelled=self.state.stopping.is_set)
        return [_entry_json(e, {"id": last[e.path].oid, "title": last[e.path].title, "date": last[e.path].date}
                            if e.path in last else None) for e in entries]

    def tree(self, call: Call, repo_type: str, repo_id: str, revision: str, path: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve(revision)
        entries = repo.list_tree(commit, path.strip("/"), recursive=_flag(call.query.get("recursive")))
        if _flag(call.query.get("expand")):
            return JSONResponse(self._with_last_commits(repo, commit, entries))
        return JSONResponse([_entry_json(e) for e in entries])

    def paths_info(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        body = payloads.parse(payloads.PathsInfo, call.json("paths-info body"), "paths-info body")
        commit = repo.resolve(revision)
        entries = repo.paths_info(commit, [body.paths] if isinstance(body.paths, str) else body.paths)
        if body.expand:
            return JSONResponse(self._with_last_commits(repo, commit, entries))
        return JSONResponse([_entry_json(e) for e in entries])

    def resolve_file(self, call: Call, repo_type: str, repo_id: str, revision: str, path: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve(revision)
        try:
            entry = repo.file_entry(commit, path)
        except HubError as exc:
            exc.headers["X-Repo-Commit"] = commit
            raise
        headers = {
            "ETag": f'"{entry.oid}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{Path(path).name}"',
        }
        if call.method == "HEAD":
            return Response(b"", headers={**headers, "Content-Length": str(entry.size)})
        start, end, status = 0, entry.size - 1, 200
        range_header = call.request.headers.get("range")
        if range_header:
            start, end = parse_range(range_header, entry.size)
            headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
            status = 206
        return FileResponse(repo.blob_file(entry.oid), start, end - start + 1, status, headers,
                            self.state.limits.send_timeout)

    def org_overview(self, call: Call, org: str) -> Response:
        if org not in self.state.store.namespaces():
            raise HubError(404, f"organization {org} not found")
        trusted = org in self.state.trusted_orgs
        return JSONResponse({
            "name": org, "fullname": org, "avatarUrl": "", "isVerified": False, "type": "org",
            "trustedKernelPublisher": trusted,
        })

    def list_repos(self, call: Call, kernels_only: bool) -> Response:
        """The repos of `?author=ORG` (required: this store lists one organisation at a time): /api/kernels its
        kernel repos, /api/models (huggingface_hub's list_models) its model repos and kernel repos."""
        author = call.query.get("author")
        if not author:
            raise HubError(400, "name the organisation: ?author=ORG")
        author = checks.namespace(author)
        out = []
        for repo_type in ("kernel",) if kernels_only else ("model", "kernel"):
            for repo_id in self.state.store.repo_ids(repo_type, author):
                try:
                    commit = self._repo(repo_type, repo_id).resolve("main")
                    meta = self._repo(repo_type, repo_id).commit_meta(commit)
                except HubError:  # created, never committed to
                    continue
                out.append({"_id": repo_id, "id": repo_id, "modelId": repo_id, "author": author, "sha": commit,
                            "lastModified": meta.date, "createdAt": meta.date, "private": False, "downloads": 0,
                            "likes": 0, "tags": ["kernel"] if repo_type == "kernel" else []})
        return JSONResponse(sorted(out, key=lambda r: r["id"]))

    def whoami(self, call: Call) -> Response:
        orgs = [{"name": ns, "fullname": ns, "roleInOrg": "admin", "type": "org"}
                for ns in sorted(self.state.store.namespaces())]
        return JSONResponse({
            "type": "user", "name": "kernel-hub", "fullname": "kernel-hub serve", "orgs": orgs,
            "auth": {"type": "access_token", "accessToken": {"displayName": "serve --token", "role": "write"}},
        })

    # -- writes ---------------------------------------------------------------------------------
    def create_repo(self, call: Call) -> Response:
        body = payloads.parse(payloads.RepoRef, call.json("repo creation body"), "repo creation body")
        repo_type, repo_id = body.repo()
        url = f"{call.base_url}/{_URL_PREFIX[repo_type]}{repo_id}"
        try:
            self.state.store.create(repo_type, repo_id)
        except HubError as exc:
            if exc.status != 409:
                raise
            # The Hub answers a conflict with the existing repo's url; create_repo(exist_ok=True) reads it.
            return error_response(409, exc.message, body={"url": url})
        return JSONResponse({"url": url, "name": repo_id})

    def delete_repo(self, call: Call) -> Response:
        body = payloads.parse(payloads.RepoRef, call.json("repo deletion body"), "repo deletion body")
        self.state.store.delete(*body.repo())
        return JSONResponse({})

    def preupload(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        body = payloads.parse(payloads.Preupload, call.json("preupload body"), "preupload body")
        paths = [checks.repo_path(f.path) for f in body.files]
        known = {e.path: e.oid for e in repo.paths_info(repo.resolve(revision), paths)}
        return JSONResponse({"files": [
            {"path": p, "uploadMode": "regular", "shouldIgnore": False, "oid": known.get(p)} for p in paths
        ]})

    def commit(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        if _flag(call.query.get("create_pr")):
            raise HubError(400, "pull requests are not supported by this store")
        branch = checks.ref_name(revision, "branch")
        request = payloads.parse_commit(call.lines(), repo.add_blob)
        header = request.header
        with repo.write_lock:
            oid, _ = repo.commit_changes(branch, header.summary, header.description, request.files,
                                         request.deleted_files, request.deleted_folders, header.parentCommit)
        url = f"{call.base_url}/{_URL_PREFIX[repo_type]}{repo_id}/commit/{oid}"
        return JSONResponse({"commitUrl": url, "commitOid": oid, "pullRequestUrl": None, "success": True})

    def create_branch(self, call: Call, repo_type: str, repo_id: str, name: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        body = payloads.parse(payloads.BranchCreate, call.json("branch body"), "branch body")
        name = checks.ref_name(name, "branch")
        expected = checks.commit_id(body.expectedCommit) if body.expectedCommit is not None else None
        with repo.write_lock:
            target = repo.resolve(body.startingPoint or "main")
            if body.move:
                repo.move_branch(name, target, expected)
            else:
                repo.create_ref("branch", name, target)
        return JSONResponse({})

    def create_tag(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        """POST /tag/{revision} with {"tag": name}: the path names what gets tagged."""
        repo = self._repo(repo_type, repo_id)
        body = payloads.parse(payloads.TagCreate, call.json("tag body"), "tag body")
        name = checks.ref_name(body.tag, "tag")
        with repo.write_lock:
            repo.create_ref("tag", name, repo.resolve(revision), body.message)
        return JSONResponse({})

    def delete_ref(self, call: Call, repo_type: str, repo_id: str, kind: str, name: str) -> Response:
        repo = self._repo(repo_type, repo_id)
        with repo.write_lock:
            repo.delete_ref(kind, name)
        return JSONResponse({})


def _segments(request: Request) -> tuple[list[str], str]:
    raw = request.scope.get("raw_path") or request.url.path.encode()
    raw_path = raw.decode("latin-1").split("?", 1)[0]
    return [unquote(s) for s in raw_path.split("/") if s], raw_path


class HubASGI:
    """The ASGI app: every HTTP request goes to one dispatcher. No path pattern routes it first: a
    pattern's `.*` stops at a newline, and a path holding one would get a bare 404 instead of the Hub's."""

    def __init__(self, state: ServerState, dispatch: Callable[[Request], Awaitable[Response]]):
        self.state = SimpleNamespace(hub=state)
        self._dispatch = dispatch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        response = await self._dispatch(Request(scope, receive))
        await response(scope, receive, send)


def build_app(store: Path | GitStore, token: str | None = None, read_token_required: bool = False,
              trusted_orgs: Sequence[str] = (), limits: Limits | None = None) -> HubASGI:
    """The ASGI app over `store`.

    trusted_orgs: organisations reported as trusted kernel publishers (what HF `kernels` asks before
    loading); no other is. kernel-hub's client never asks (at a mirror it trusts what KERNEL_HUB_TRUSTED_ORGS or
    trust_remote_code names), so the same list on both sides gives both clients one answer.
    """
    if read_token_required and not token:
        raise ValueError("read_token_required needs a token")
    state = ServerState(
        store=store if isinstance(store, GitStore) else GitStore(Path(store)),
        token=token, read_token_required=read_token_required,
        trusted_orgs=tuple(trusted_orgs), limits=limits or Limits(),
    )
    hub = HubApp(state)

    async def dispatch(request: Request) -> Response:
        segments, raw_path = _segments(request)
        method = request.method
        unread = body_pending(request)
        try:
            route = hub.route(method, segments)
            hub.authorize(route.access, request)
            call = Call(request, method, segments, raw_path)
            if route.body != "none":
                limit = state.limits.max_commit_bytes if route.body == "commit" else state.limits.max_json_bytes
                call.body = await read_body(request, limit, state.limits, spool=route.body == "commit")
                unread = False
            try:
                response = await run_in_threadpool(_guarded, route.handler, call)
            finally:
                if not isinstance(call.body, bytes):
                    call.body.close()
        except HubError as exc:
            response = from_error(exc)
        except Exception as exc:  # a bug: one line to the client, the trace to the log
            log.exception("unhandled error for %s %s", method, raw_path)
            response = internal_error(exc)
        if unread:  # answered without reading the body: close rather than read or keep it
            response.headers["Connection"] = "close"
        return response

    return HubASGI(state, dispatch)


def _guarded(handler: Callable[[Call], Response], call: Call) -> Response:
    try:
        return handler(call)
    except HubError as exc:
        return from_error(exc)
    except Exception as exc:  # a bug or a broken store: one line to the client, the trace to the log
        log.exception("unhandled error for %s %s", call.method, call.raw_path)
        return internal_error(exc)


def internal_error(exc: BaseException) -> Response:
    """A 500 for a bug or a broken store: the exception's type only. Its text often holds the store's paths
    (dulwich's FileLocked, OSError), which are no client's business; the server's log has the whole trace."""
    return error_response(500, f"internal error ({type(exc).__name__}); the server's log has the details")


def serve(store: Path, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          read_token_required: bool = False, trusted_orgs: Sequence[str] = (),
          log_level: str = "warning", limits: Limits | None = None,
          wrap: Callable[[HubASGI], ASGIApp] | None = None) -> None:
    """Bind host:port (0: a free port), print the URL, and serve until interrupted (blocking).

    OSError when the address cannot be bound (port in use, permission denied), before anything is printed.
    wrap: an ASGI middleware put around the app (request logging, instrumentation); None serves it bare.
    """
    limits = limits or Limits()
    git_store = GitStore(Path(store))
    writer = git_store.lock_owner() if not token else git_store.lock_for_writes()
    if token and writer is not None:
        raise KernelHubError(f"{git_store.root} is served read-write by another process"
                             f"{f' (pid {writer})' if writer else ''}: stop it first, or serve the store read-only "
                             "(without --token)")
    if token:
        cleared = git_store.recover()  # locks and temporary files a killed server left: before anything is served
        if cleared:
            log.warning("cleared %d lock/temporary files a stopped server left in %s", len(cleared), git_store.root)
    hub = build_app(git_store, token=token, read_token_required=read_token_required,
                    trusted_orgs=trusted_orgs, limits=limits)
    app = wrap(hub) if wrap is not None else hub
    sock = bind(host, port)
    mode = ("read-write with --token" if token else "read-only (no --token"
            + (f"; {f'pid {writer}' if writer else 'another process'} serves this store read-write"
               if writer is not None else "") + ")")
    trust = f"trusted publishers: {', '.join(trusted_orgs)}" if trusted_orgs else "no org reported trusted"
    print(f"kernel-hub serve: {Path(store).resolve()} at {url_of(sock)} ({mode}; {trust}; "
          f"{time.strftime('%H:%M:%S')})", flush=True)
    # uvicorn's graceful shutdown would wait for in-flight requests without end: give them
    # SHUTDOWN_GRACE seconds, and tell handlers in worker threads (which no task cancel reaches) to stop.
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                            http=guarded_h11(limits.header_timeout), timeout_keep_alive=5,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE)
    _StoppingServer(config, hub.state.hub.stopping).run(sockets=[sock])


SHUTDOWN_GRACE = 2  # seconds in-flight requests get after SIGTERM before they are cancelled


class _StoppingServer(uvicorn.Server):
    """uvicorn's server that also sets `stopping` on the first exit signal (SIGTERM, SIGINT)."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event):
        super().__init__(config)
        self._stopping = stopping

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._stopping.set()
        super().handle_exit(sig, frame)
