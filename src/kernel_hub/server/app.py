"""The subset of the Hugging Face Hub HTTP API that huggingface_hub and HF `kernels` use, over a GitStore.

Reads: repo info, refs, tree listing, paths-info, file resolve (HEAD and GET, with ETag, X-Repo-Commit,
Content-Length and ranges), organisation overview. Writes (token required): repo creation and deletion,
preupload (always "regular": no LFS needed), the NDJSON commit API, branch and tag creation and deletion.
Routing is by raw path segments because the Hub quotes revisions with `safe=""` (`refs%2Fpr%2F1`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .gitstore import REPO_TYPES, Entry, GitRepo, GitStore, StoreError, check_ref_name

_TYPE_PLURALS = {f"{t}s": t for t in REPO_TYPES}
_URL_PREFIX = {"model": "", "kernel": "kernels/", "dataset": "datasets/"}
_WRITE_MESSAGE = "Invalid credentials in Authorization header"
_CONTROL = "_kernel_hub"


@dataclass
class Fault:
    """A test hook: make matching requests fail, stall or get cut off half-way."""

    match: str
    method: str | None = None
    status: int | None = None
    delay: float = 0.0
    truncate: bool = False
    times: int = 1

    def applies(self, method: str, path: str, body_stage: bool) -> bool:
        return (self.times > 0 and self.match in path and self.truncate == body_stage
                and (self.method is None or self.method == method))


@dataclass
class ServerState:
    store: GitStore
    token: str | None
    read_token_required: bool
    trusted_orgs: tuple[str, ...] | None
    test_hooks: bool
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, method: str, path: str, body_stage: bool = False) -> Fault | None:
        """The first live fault for this request (body_stage: faults that cut a response body)."""
        with self.lock:
            for fault in self.faults:
                if fault.applies(method, path, body_stage):
                    fault.times -= 1
                    return fault
        return None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def _error(status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None) -> Response:
    out = {"X-Error-Message": message.encode("ascii", "replace").decode()[:500], **(headers or {})}
    if code:
        out["X-Error-Code"] = code
    return JSONResponse({"error": message}, status_code=status, headers=out)


@dataclass
class Call:
    """One parsed request, handed to a synchronous handler in the thread pool."""

    request: Request
    method: str
    segments: list[str]
    query: dict[str, str]
    body: bytes
    form: dict[str, list[str]]

    def json(self) -> Any:
        if not self.body:
            return {}
        try:
            return json.loads(self.body)
        except ValueError:
            raise HubError(400, "request body is not valid JSON") from None

    @property
    def base_url(self) -> str:
        return str(self.request.base_url).rstrip("/")


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _entry_json(entry: Entry, last_commit: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": entry.kind, "oid": entry.oid, "size": entry.size, "path": entry.path}
    if last_commit is not None:
        out["lastCommit"] = last_commit
    return out


class HubApp:
    """Request handlers. Each returns a Response; store errors become Hub-style error responses."""

    def __init__(self, state: ServerState):
        self.state = state

    # -- auth -----------------------------------------------------------------------------------
    def _token(self, call: Call) -> str | None:
        auth = call.request.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def require_write(self, call: Call) -> None:
        if self.state.token is None:
            raise HubError(403, "this store is read-only: `kernel-hub serve` was started without --token")
        if self._token(call) != self.state.token:
            raise HubError(401, _WRITE_MESSAGE)

    def require_read(self, call: Call) -> None:
        if self.state.read_token_required and self._token(call) != self.state.token:
            raise HubError(401, _WRITE_MESSAGE)

    # -- dispatch -------------------------------------------------------------------------------
    def route(self, call: Call) -> Response:
        s, m = call.segments, call.method
        if s[:1] == [_CONTROL]:
            return self.control(call)
        if s[:1] == ["api"]:
            rest = s[1:]
            if rest == ["whoami-v2"] and m == "GET":
                return self.whoami(call)
            if rest == ["repos", "create"] and m == "POST":
                return self.create_repo(call)
            if rest == ["repos", "delete"] and m == "DELETE":
                return self.delete_repo(call)
            if rest == ["agent-harnesses"] and m == "GET":
                # huggingface_hub's user-agent telemetry fetches this once a day; an empty registry ends it.
                return JSONResponse({"standardEnvVars": [], "harnesses": {}})
            if rest == ["validate-yaml"] and m == "POST":
                self.require_read(call)
                return JSONResponse({"errors": [], "warnings": []})
            if len(rest) == 3 and rest[0] == "organizations" and rest[2] == "overview" and m == "GET":
                return self.org_overview(call, rest[1])
            if len(rest) >= 3 and rest[0] in _TYPE_PLURALS:
                return self.repo_api(call, _TYPE_PLURALS[rest[0]], f"{rest[1]}/{rest[2]}", rest[3:])
            raise HubError(404, f"no such API route: /{'/'.join(s)}")
        # File resolve: /{ns}/{name}/resolve/{rev}/{path} or /{types}/{ns}/{name}/resolve/{rev}/{path}
        if len(s) >= 5 and s[2] == "resolve" and s[0] not in _TYPE_PLURALS:
            return self.resolve_file(call, "model", f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
        if len(s) >= 6 and s[0] in _TYPE_PLURALS and s[3] == "resolve":
            return self.resolve_file(call, _TYPE_PLURALS[s[0]], f"{s[1]}/{s[2]}", s[4], "/".join(s[5:]))
        raise HubError(404, f"not found: /{'/'.join(s)}")

    def repo_api(self, call: Call, repo_type: str, repo_id: str, rest: list[str]) -> Response:
        m = call.method
        if m in ("GET", "HEAD") and not rest:
            return self.repo_info(call, repo_type, repo_id, None)
        if m == "GET" and len(rest) == 2 and rest[0] == "revision":
            return self.repo_info(call, repo_type, repo_id, rest[1])
        if m == "GET" and rest == ["refs"]:
            return self.refs(call, repo_type, repo_id)
        if m == "GET" and len(rest) >= 2 and rest[0] == "tree":
            return self.tree(call, repo_type, repo_id, rest[1], "/".join(rest[2:]))
        if m == "POST" and len(rest) == 2 and rest[0] == "paths-info":
            return self.paths_info(call, repo_type, repo_id, rest[1])
        if m == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return self.preupload(call, repo_type, repo_id, rest[1])
        if m == "POST" and len(rest) == 2 and rest[0] == "commit":
            return self.commit(call, repo_type, repo_id, rest[1])
        if m in ("POST", "DELETE") and len(rest) == 2 and rest[0] in ("branch", "tag"):
            return self.ref_write(call, repo_type, repo_id, rest[0], rest[1])
        raise HubError(404, f"no such repo API route: {m} {'/'.join(rest)}")

    # -- reads ----------------------------------------------------------------------------------
    def _repo(self, call: Call, repo_type: str, repo_id: str) -> GitRepo:
        self.require_read(call)
        return self.state.store.get(repo_type, repo_id)

    def repo_info(self, call: Call, repo_type: str, repo_id: str, revision: str | None) -> Response:
        repo = self._repo(call, repo_type, repo_id)
        commit = repo.resolve(revision or "main")
        meta = repo.commit_meta(commit)
        files = repo.all_files(commit)
        blobs = _flag(call.query.get("blobs"))
        siblings = [
            {"rfilename": e.path, **({"size": e.size, "blobId": e.oid} if blobs else {})} for e in files
        ]
        namespace = repo_id.split("/")[0]
        data = {
            "_id": repo_id, "id": repo_id, "modelId": repo_id, "author": namespace, "sha": commit,
            "lastModified": meta.date if meta else None, "createdAt": meta.date if meta else None,
            "private": False, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
            "tags": [], "siblings": siblings,
        }
        return JSONResponse(data)

    def refs(self, call: Call, repo_type: str, repo_id: str) -> Response:
        repo = self._repo(call, repo_type, repo_id)
        branches, tags = repo.refs()
        return JSONResponse({
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in branches],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in tags],
            "converts": [],
            "pullRequests": [],
        })

    def _with_last_commits(self, repo: GitRepo, commit: str, entries: list[Entry]) -> list[dict[str, Any]]:
        out = []
        for e in entries:
            meta = repo.commit_meta(commit, e.path)
            last = {"id": meta.oid, "title": meta.title, "date": meta.date} if meta else None
            out.append(_entry_json(e, last))
        return out

    def tree(self, call: Call, repo_type: str, repo_id: str, revision: str, path: str) -> Response:
        repo = self._repo(call, repo_type, repo_id)
        commit = repo.resolve(revision)
        entries = repo.list_tree(commit, path.strip("/"), recursive=_flag(call.query.get("recursive")))
        if _flag(call.query.get("expand")):
            return JSONResponse(self._with_last_commits(repo, commit, entries))
        return JSONResponse([_entry_json(e) for e in entries])

    def paths_info(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        repo = self._repo(call, repo_type, repo_id)
        commit = repo.resolve(revision)
        if call.form:
            paths, expand = call.form.get("paths", []), _flag((call.form.get("expand") or [""])[0])
        else:
            body = call.json()
            paths, expand = body.get("paths", []), bool(body.get("expand"))
        entries = repo.paths_info(commit, [paths] if isinstance(paths, str) else list(paths))
        if expand:
            return JSONResponse(self._with_last_commits(repo, commit, entries))
        return JSONResponse([_entry_json(e) for e in entries])

    def resolve_file(self, call: Call, repo_type: str, repo_id: str, revision: str, path: str) -> Response:
        repo = self._repo(call, repo_type, repo_id)
        commit = repo.resolve(revision)
        try:
            entry = repo.file_entry(commit, path)
        except StoreError as exc:
            raise HubError(404, exc.message, "EntryNotFound", {"X-Repo-Commit": commit}) from None
        headers = {
            "ETag": f'"{entry.oid}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{Path(path).name}"',
        }
        if call.method == "HEAD":
            headers["Content-Length"] = str(entry.size)
            return Response(b"", headers=headers)
        data = repo.read_blob(entry.oid)
        status = 200
        range_header = call.request.headers.get("range")
        if range_header:
            start, end = _parse_range(range_header, len(data))
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        headers["Content-Length"] = str(len(data))
        path_key = "/" + "/".join(call.segments)
        fault = self.state.take_fault("GET", path_key, body_stage=True) if self.state.test_hooks else None
        if fault is not None:
            return StreamingResponse(_cut_off(data), status_code=status, headers=headers)
        return Response(data, status_code=status, headers=headers)

    def org_overview(self, call: Call, org: str) -> Response:
        self.require_read(call)
        namespaces = self.state.store.namespaces()
        if org not in namespaces:
            raise HubError(404, f"organization {org} not found")
        trusted = self.state.trusted_orgs is None or org in self.state.trusted_orgs
        return JSONResponse({
            "name": org, "fullname": org, "avatarUrl": "", "isVerified": False, "type": "org",
            "trustedKernelPublisher": trusted,
        })

    def whoami(self, call: Call) -> Response:
        if self.state.token is None or self._token(call) != self.state.token:
            raise HubError(401, _WRITE_MESSAGE)
        orgs = [{"name": ns, "fullname": ns, "roleInOrg": "admin", "type": "org"}
                for ns in sorted(self.state.store.namespaces())]
        return JSONResponse({
            "type": "user", "name": "kernel-hub", "fullname": "kernel-hub serve", "orgs": orgs,
            "auth": {"type": "access_token", "accessToken": {"displayName": "serve --token", "role": "write"}},
        })

    # -- writes ---------------------------------------------------------------------------------
    def create_repo(self, call: Call) -> Response:
        self.require_write(call)
        body = call.json()
        name, org = body.get("name"), body.get("organization")
        repo_type = body.get("type") or "model"
        if not isinstance(name, str) or not isinstance(org, str):
            raise HubError(400, "repo creation needs a name and an organization (ORG/NAME)")
        repo_id = f"{org}/{name}"
        if repo_type not in _URL_PREFIX:
            raise HubError(400, f"unknown repo type {repo_type!r} (this store keeps {', '.join(_URL_PREFIX)})")
        url = f"{call.base_url}/{_URL_PREFIX[repo_type]}{repo_id}"
        try:
            self.state.store.create(repo_type, repo_id)
        except StoreError as exc:
            if exc.status != 409:
                raise
            # The Hub answers a conflict with the existing repo's url; create_repo(exist_ok=True) reads it.
            return JSONResponse({"error": exc.message, "url": url}, status_code=409,
                                headers={"X-Error-Message": exc.message})
        return JSONResponse({"url": url, "name": repo_id})

    def delete_repo(self, call: Call) -> Response:
        self.require_write(call)
        body = call.json()
        repo_id = f"{body.get('organization')}/{body.get('name')}"
        self.state.store.delete(body.get("type") or "model", repo_id)
        return JSONResponse({})

    def preupload(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        self.require_write(call)
        repo = self.state.store.get(repo_type, repo_id)
        files = call.json().get("files")
        if not isinstance(files, list):
            raise HubError(400, "preupload needs a list of files")
        commit = repo.resolve(revision)
        known = {e.path: e.oid for e in repo.paths_info(commit, [f.get("path", "") for f in files])}
        return JSONResponse({"files": [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": known.get(f["path"])}
            for f in files
        ]})

    def commit(self, call: Call, repo_type: str, repo_id: str, revision: str) -> Response:
        self.require_write(call)
        repo = self.state.store.get(repo_type, repo_id)
        if _flag(call.query.get("create_pr")):
            raise HubError(400, "pull requests are not supported by this store")
        header: dict[str, Any] = {}
        files: list[tuple[str, bytes]] = []
        deleted_files: list[str] = []
        deleted_folders: list[str] = []
        for line in call.body.splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                key, value = item["key"], item["value"]
            except (ValueError, KeyError, TypeError):
                raise HubError(400, "commit payload must be NDJSON lines of {key, value}") from None
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                files.append((value["path"], base64.b64decode(value["content"])))
            elif key == "deletedFile":
                deleted_files.append(value["path"])
            elif key == "deletedFolder":
                deleted_folders.append(value["path"])
            elif key == "lfsFile":
                raise HubError(400, "LFS uploads are not supported by this store (preupload answers 'regular')")
            else:
                raise HubError(400, f"unknown commit operation {key!r}")
        summary = header.get("summary") or ""
        if not summary:
            raise HubError(400, "a commit needs a summary")
        branch = check_ref_name(revision)
        with repo.write_lock:
            oid, _ = repo.commit_changes(branch, summary, header.get("description") or "", files,
                                         deleted_files, deleted_folders, header.get("parentCommit"))
        url = f"{call.base_url}/{_URL_PREFIX[repo_type]}{repo_id}/commit/{oid}"
        return JSONResponse({"commitUrl": url, "commitOid": oid, "pullRequestUrl": None, "success": True})

    def ref_write(self, call: Call, repo_type: str, repo_id: str, kind: str, name: str) -> Response:
        self.require_write(call)
        repo = self.state.store.get(repo_type, repo_id)
        with repo.write_lock:
            if call.method == "DELETE":
                repo.delete_ref(kind, name)
                return JSONResponse({})
            body = call.json()
            if kind == "branch":
                commit = repo.resolve(body.get("startingPoint") or "main")
                repo.create_ref("branch", name, commit)
            else:  # POST /tag/{revision} with {"tag": name}: the path names what gets tagged
                tag = body.get("tag")
                if not isinstance(tag, str):
                    raise HubError(400, "tag creation needs {'tag': name}")
                repo.create_ref("tag", tag, repo.resolve(name), body.get("message"))
        return JSONResponse({})

    # -- test hooks -----------------------------------------------------------------------------
    def control(self, call: Call) -> Response:
        rest = call.segments[1:]
        if rest == ["stats"] and call.method == "GET":
            with self.state.lock:
                rows = list(self.state.requests)
            return JSONResponse({"total": len(rows), "requests": [list(r) for r in rows]})
        if not self.state.test_hooks:
            raise HubError(404, "test hooks are off (serve --test-hooks)")
        self.require_write(call)
        if rest == ["stats", "reset"] and call.method == "POST":
            with self.state.lock:
                self.state.requests.clear()
            return JSONResponse({})
        if rest == ["faults"] and call.method == "POST":
            body = call.json()
            with self.state.lock:
                if body.get("clear"):
                    self.state.faults.clear()
                for spec in body.get("add", []):
                    self.state.faults.append(Fault(**spec))
            return JSONResponse({"faults": len(self.state.faults)})
        raise HubError(404, "unknown control route")


def _parse_range(value: str, size: int) -> tuple[int, int]:
    try:
        unit, _, spec = value.partition("=")
        first, _, last = spec.split(",")[0].strip().partition("-")
        if unit.strip() != "bytes":
            raise ValueError
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), int(last) if last else size - 1
    except ValueError:
        raise HubError(416, f"unsupported Range {value!r}") from None
    if start > end or start >= size:
        raise HubError(416, f"Range {value!r} not satisfiable for {size} bytes")
    return start, min(end, size - 1)


async def _cut_off(data: bytes):
    """Send half the body, then drop the connection: a download cut off half-way."""
    yield data[: len(data) // 2]
    await asyncio.sleep(0.05)
    raise ConnectionAbortedError("test hook: response cut off")


def build_app(store: Path | GitStore, token: str | None = None, read_token_required: bool = False,
              trusted_orgs: Sequence[str] | None = None, test_hooks: bool = False) -> Starlette:
    """The Starlette app over `store`.

    trusted_orgs: organisations reported as trusted kernel publishers (what HF `kernels` asks before
    loading). None trusts every namespace in the store: only the token holder can publish there.
    """
    if read_token_required and not token:
        raise ValueError("read_token_required needs a token")
    state = ServerState(
        store=store if isinstance(store, GitStore) else GitStore(Path(store)),
        token=token, read_token_required=read_token_required,
        trusted_orgs=tuple(trusted_orgs) if trusted_orgs is not None else None, test_hooks=test_hooks,
    )
    hub = HubApp(state)

    async def dispatch(request: Request) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        raw_path = raw.decode("latin-1").split("?", 1)[0]
        segments = [unquote(s) for s in raw_path.split("/") if s]
        method = request.method
        path = "/" + "/".join(segments)
        counted = segments[:1] != [_CONTROL]
        fault = state.take_fault(method, path) if state.test_hooks and counted else None
        response: Response
        if fault is not None and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault is not None and fault.status:
            response = _error(fault.status, f"test hook: injected {fault.status}")
        else:
            body = await request.body()
            form: dict[str, list[str]] = {}
            if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
                form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
            call = Call(request, method, segments, dict(request.query_params), body, form)
            response = await run_in_threadpool(_guarded, hub.route, call)
        if counted:
            with state.lock:
                state.requests.append((method, path, response.status_code))
        return response

    app = Starlette(routes=[Route("/{rest:path}", dispatch, methods=["GET", "HEAD", "POST", "DELETE", "PUT"])])
    app.state.hub = state
    return app


def _guarded(handler: Callable[[Call], Response], call: Call) -> Response:
    try:
        return handler(call)
    except HubError as exc:
        return _error(exc.status, exc.message, exc.code, exc.headers)
    except StoreError as exc:
        return _error(exc.status, exc.message, exc.code)
    except Exception as exc:  # a bug or a git failure: one line to the client, the trace to the log
        logging.getLogger("kernel_hub.server").exception("unhandled error for %s %s", call.method, call.segments)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def serve(store: Path, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          read_token_required: bool = False, trusted_orgs: Sequence[str] | None = None,
          test_hooks: bool = False, log_level: str = "warning") -> None:
    """Run the store's Hub API with uvicorn until interrupted (blocking)."""
    import uvicorn

    app = build_app(store, token=token, read_token_required=read_token_required,
                    trusted_orgs=trusted_orgs, test_hooks=test_hooks)
    started = time.strftime("%H:%M:%S")
    mode = "read-write with --token" if token else "read-only (no --token)"
    print(f"kernel-hub serve: {Path(store).resolve()} at http://{host}:{port} ({mode}; {started})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
