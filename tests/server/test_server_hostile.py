"""`kernel-hub serve` against hostile and malformed requests, in a real server process (uvicorn over a
socket, as an attacker would reach it): option-like and commit-like ref names, bodies sent before or
without the token, oversized and slow bodies, slow headers, newlines in error messages, the test hooks."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("starlette")
pytest.importorskip("dulwich")
hf = pytest.importorskip("huggingface_hub")

from dulwich.repo import Repo  # noqa: E402
from huggingface_hub import HfApi  # noqa: E402
from huggingface_hub.errors import HfHubHTTPError  # noqa: E402

from tests.hub_server import (  # noqa: E402
    memory_kib,
    post_unread_body,
    reset_peak_memory,
    running_server,
)

TOKEN = "hostile-token"
REPO = "acme/target"
MiB = 1 << 20
# Small limits and short timeouts, so that every refusal is quick to provoke.
LIMITS = ("--max-commit-size", "12M", "--max-json-size", "64K", "--header-timeout", "1", "--body-timeout", "1")


SERVER_ARGS = LIMITS


def seed_server(srv, root: Path) -> None:
    """The `server` fixture's store (tests/conftest.py): REPO holding one small file."""
    api = HfApi(endpoint=srv.url, token=TOKEN)
    api.create_repo(REPO, repo_type="kernel")
    api.upload_file(path_or_fileobj=b"one", path_in_repo="f.txt", repo_id=REPO, repo_type="kernel")


@pytest.fixture
def api(server) -> HfApi:
    return HfApi(endpoint=server.url, token=TOKEN)


def _refs(server, repo: str = REPO) -> dict[bytes, bytes]:
    """Every ref in the bare repo, read with dulwich straight from the store."""
    git = Repo(str(server.store / "kernels" / f"{repo}.git"))
    try:
        return git.refs.as_dict()
    finally:
        git.close()


def _request(server, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
             headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request on a fresh connection -> (status, headers (case-insensitive), body)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=all_headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


# -- ref names ----------------------------------------------------------------------------------

BAD_REF_NAMES = ["--force", "-d", "--delete", "-", "a..b", "x.lock", "HEAD", "a/.b", "refs/pr/1", "a b", "é"]


@pytest.mark.parametrize("name", [*BAD_REF_NAMES, "HEX40"])
def test_option_like_and_commit_like_tag_names_are_refused(server, api: HfApi, name: str) -> None:
    head = api.repo_info(REPO, repo_type="kernel").sha
    if name == "HEX40":  # a tag named like a commit id would make clients resolve it to the wrong commit
        name = "".join(reversed(head))
    before = _refs(server)
    status, headers, body = _request(server, "POST", f"/api/kernels/{REPO}/tag/main",
                                     json.dumps({"tag": name}).encode())
    assert status == 400, body
    assert "X-Error-Message" in headers
    assert _refs(server) == before
    with pytest.raises(HfHubHTTPError) as exc:  # and through huggingface_hub
        api.create_tag(REPO, tag=name, repo_type="kernel")
    assert exc.value.response.status_code == 400
    assert _refs(server) == before


@pytest.mark.parametrize("name", [*BAD_REF_NAMES, "HEX40", "refs/tags/v9"])
def test_option_like_and_commit_like_branch_names_are_refused(server, api: HfApi, name: str) -> None:
    head = api.repo_info(REPO, repo_type="kernel").sha
    if name == "HEX40":
        name = head[::-1]
    before = _refs(server)
    status, _, body = _request(server, "POST", f"/api/kernels/{REPO}/branch/{quote(name, safe='')}", b"{}")
    assert status == 400, body
    assert _refs(server) == before
    status, _, body = _request(server, "DELETE", f"/api/kernels/{REPO}/branch/{quote(name, safe='')}")
    assert status == 400, body
    assert _refs(server) == before


def test_full_ref_names_are_read_and_written_as_the_hub_does(server, api: HfApi) -> None:
    repo = "acme/fullrefs"
    api.create_repo(repo, repo_type="kernel")
    commit = api.upload_file(path_or_fileobj=b"x", path_in_repo="build/torch-cpu/x.py", repo_id=repo,
                             repo_type="kernel").oid
    api.create_branch(repo, branch="refs/heads/v1", revision=commit, repo_type="kernel")
    api.create_tag(repo, tag="refs/tags/v1.0.0", revision="refs/heads/v1", tag_message="release", repo_type="kernel")
    refs = _refs(server, repo)
    assert refs[b"refs/heads/v1"] == commit.encode() and b"refs/heads/refs/heads/v1" not in refs
    assert refs[b"refs/tags/v1.0.0"] != commit.encode()  # an annotated tag object, peeled below
    listed = api.list_repo_refs(repo, repo_type="kernel")
    assert [(t.name, t.ref, t.target_commit) for t in listed.tags] == [("v1.0.0", "refs/tags/v1.0.0", commit)]
    assert api.repo_info(repo, repo_type="kernel", revision="refs/tags/v1.0.0").sha == commit
    tree = api.list_repo_tree(repo, path_in_repo="build", repo_type="kernel", revision="refs/heads/v1")
    assert [e.path for e in tree] == ["build/torch-cpu"]
    # a full name of the other kind is refused, not created under the wrong prefix
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_branch(repo, branch="refs/tags/v2", repo_type="kernel")
    assert exc.value.response.status_code == 400
    assert set(_refs(server, repo)) == set(refs)


# -- bodies ----------------------------------------------------------------------------------------

def test_unauthenticated_flood_is_refused_without_buffering(server) -> None:
    """4 x 50 MB POSTs without a token: each refused from its headers; the server's peak RSS stays flat."""
    pid = server.process.pid
    reset_peak_memory(pid)
    before = memory_kib(pid)["VmRSS"]
    results: list[tuple[int | None, int]] = []

    def attack() -> None:
        results.append(post_unread_body(server.url, f"/api/kernels/{REPO}/commit/main", 50 * MiB))

    threads = [threading.Thread(target=attack) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    peak = memory_kib(pid)["VmHWM"]
    assert [status for status, _ in results] == [401] * 4
    assert all(sent < 25 * MiB for _, sent in results), results  # the server stopped taking the bodies
    assert peak - before < 32 * 1024, (before, peak)  # KiB: the 200 MB never reached the server's memory
    assert _request(server, "GET", f"/api/kernels/{REPO}/refs")[0] == 200  # and it still answers


def test_oversized_bodies_get_413(server) -> None:
    refs = _refs(server)
    # Content-Length over the limit: refused before reading
    status, sent = post_unread_body(server.url, f"/api/kernels/{REPO}/commit/main", 13 * MiB,
                                    {"Authorization": f"Bearer {TOKEN}"})
    assert status == 413 and sent < 13 * MiB
    # a chunked body (no Content-Length) is cut off once it passes the limit while streaming
    status, sent = post_unread_body(server.url, f"/api/kernels/{REPO}/commit/main", 40 * MiB,
                                    {"Authorization": f"Bearer {TOKEN}"}, chunked=True)
    assert status == 413 and sent < 30 * MiB
    # a JSON endpoint has a small limit
    status, _, _ = _request(server, "POST", f"/api/kernels/{REPO}/preupload/main",
                            json.dumps({"files": [{"path": "a" * 100}] * 1000}).encode())
    assert status == 413
    assert _refs(server) == refs


def test_range_requests_on_a_large_file_return_the_right_bytes(server, api: HfApi, tmp_path: Path) -> None:
    data = random.Random(7).randbytes(8 * MiB + 123)
    repo = "acme/large"
    api.create_repo(repo, repo_type="kernel")
    commit = api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id=repo, repo_type="kernel").oid
    url = f"/kernels/{repo}/resolve/{commit}/w.bin"
    size = len(data)
    for spec, (start, end) in {"bytes=0-99": (0, 99), "bytes=4194304-": (4194304, size - 1),
                               "bytes=-1000": (size - 1000, size - 1),
                               f"bytes={size - 10}-{size + 50}": (size - 10, size - 1)}.items():
        status, headers, body = _request(server, "GET", url, token=None, headers={"Range": spec})
        assert status == 206, spec
        assert body == data[start:end + 1], spec
        assert headers["Content-Range"] == f"bytes {start}-{end}/{size}"
    status, headers, _ = _request(server, "GET", url, token=None, headers={"Range": f"bytes={size}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{size}"
    path = api.hf_hub_download(repo, "w.bin", repo_type="kernel", revision=commit, cache_dir=tmp_path)
    assert Path(path).read_bytes() == data


def test_invalid_base64_is_refused_not_committed_empty(server) -> None:
    refs = _refs(server)
    for content in ("!!!not base64!!!", "QUJD=", "QU JD", "QUJDRA"):  # junk, bad padding, space, no padding
        lines = [{"key": "header", "value": {"summary": "x"}},
                 {"key": "file", "value": {"path": "empty.txt", "content": content, "encoding": "base64"}}]
        body = "\n".join(json.dumps(line) for line in lines).encode()
        status, headers, _ = _request(server, "POST", f"/api/kernels/{REPO}/commit/main", body)
        assert status == 400 and "base64" in headers["X-Error-Message"], content
    assert _refs(server) == refs


# -- slow clients ---------------------------------------------------------------------------------

def _closed_by_server(sock: socket.socket, limit: float = 20.0) -> bytes:
    """Wait (at most `limit` s) until the server closes; what it sent before closing."""
    sock.settimeout(limit)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def test_a_silent_connection_is_closed(server) -> None:
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        assert _closed_by_server(sock) == b""


def test_headers_trickled_byte_by_byte_are_cut_off(server) -> None:
    """A slowloris: each byte arrives in time for uvicorn's own idle timer, but the headers never finish."""
    request = f"GET /api/kernels/{REPO}/refs HTTP/1.1\r\nHost: x\r\nX-Slow: {'a' * 400}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        sent = 0
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
        except OSError:  # closed under us: what this test wants
            pass
        assert sent < len(request)  # cut off before the request was complete
        assert b"200 OK" not in _closed_by_server(sock)


def test_a_stalled_body_gets_408_and_the_connection_closes(server) -> None:
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(f"POST /api/kernels/{REPO}/paths-info/main HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"paths\": [".encode())
        answer = _closed_by_server(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_keep_alive_connection_still_works_between_requests(server) -> None:
    """The header deadline restarts per request: a client that is not slow is never cut off."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        for _ in range(3):
            conn.request("GET", f"/api/kernels/{REPO}/refs")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["branches"]
            time.sleep(0.3)
    finally:
        conn.close()


# -- errors ---------------------------------------------------------------------------------------

def test_newline_and_nul_in_an_error_stay_one_header_line_and_the_connection_lives(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        # the path is quoted back into the error message: a raw LF, CR and NUL after unquoting
        conn.request("GET", "/nothing%0Ahere%0D%0AX-Injected:%20yes%00end")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        message = resp.getheader("X-Error-Message")
        assert resp.status == 404
        assert resp.getheader("X-Injected") is None
        assert message and not any(c in message for c in "\r\n\0")
        assert "here" in message and "end" in message
        assert "\n" in body["error"]  # the JSON body keeps the text, escaped
        conn.request("GET", f"/api/kernels/{REPO}/refs")  # same connection: it did not drop
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_malformed_requests_get_4xx(server) -> None:
    cases = [
        ("POST", "/api/repos/create", b"{not json"),
        ("POST", "/api/repos/create", b"[]"),
        ("POST", "/api/repos/create", b'{"name": 5, "organization": "acme"}'),
        ("POST", "/api/repos/create", b'{"name": "x", "organization": "acme", "type": "space"}'),
        ("POST", "/api/repos/create", b"\xff\xfe"),
        ("POST", "/api/repos/create", b"[" * 100_000),
        ("POST", f"/api/kernels/{REPO}/preupload/main", b'{"files": "x"}'),
        ("POST", f"/api/kernels/{REPO}/preupload/main", b'{"files": [{"path": "../x"}]}'),
        ("POST", f"/api/kernels/{REPO}/paths-info/main", b'{"paths": [1]}'),
        ("POST", f"/api/kernels/{REPO}/paths-info/main", b'{"paths": ["../etc/passwd"]}'),
        ("POST", f"/api/kernels/{REPO}/tag/main", b'{"tag": null}'),
        ("POST", f"/api/kernels/{REPO}/branch/v9", b'{"startingPoint": 5}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b'{"key": "file"}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b'{"key": "header", "value": []}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b'{"key": "header", "value": {"summary": "x\\u0000"}}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b'{"key": "header", "value": {"summary": "x"}}\n'
                                                      b'{"key": "deletedFile", "value": {"path": 7}}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b'{"key": "header", "value": {"summary": "x"}}\n'
                                                      b'{"key": "file", "value": {"path": ".git/config", '
                                                      b'"content": ""}}'),
        ("POST", f"/api/kernels/{REPO}/commit/main", b"\n\n"),
        ("GET", f"/api/kernels/{REPO}/commits/main?p=-1", None),
        ("GET", f"/api/kernels/{REPO}/tree/main/..%2F..", None),
        ("GET", f"/kernels/{REPO}/resolve/main/%2Fetc%2Fpasswd", None),
        ("GET", f"/kernels/{REPO}/resolve/main/f.txt", None),  # fine: 200, for contrast
    ]
    refs = _refs(server)
    for method, path, body in cases:
        status, headers, text = _request(server, method, path, body)
        if path.endswith("f.txt"):
            assert status == 200
            continue
        assert 400 <= status < 500, (method, path, body[:80] if body else None, status, text[:200])
        assert json.loads(text)["error"] and "\n" not in headers["X-Error-Message"]
    assert _refs(server) == refs


# -- deletions and commits --------------------------------------------------------------------------

def test_commits_that_delete_files_and_folders(server, api: HfApi, tmp_path: Path) -> None:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    repo = "acme/deletes"
    api.create_repo(repo, repo_type="kernel")
    for variant in ("torch-cpu", "torch-cuda", "jax-cpu"):
        (tmp_path / "build" / variant).mkdir(parents=True)
        (tmp_path / "build" / variant / "metadata.json").write_text(json.dumps({"variant": variant}))
        (tmp_path / "build" / variant / "ops.py").write_text(f"# {variant}\n")
    first = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=tmp_path, commit_message="1.0.0").oid
    # 1.0.1 publishes one variant fewer: a new file and a whole folder deleted, in one commit
    second = api.create_commit(repo, repo_type="kernel", commit_message="1.0.1", operations=[
        CommitOperationAdd(path_in_repo="build/torch-cpu/ops.py", path_or_fileobj=b"# 1.0.1\n"),
        CommitOperationDelete(path_in_repo="build/torch-cuda/", is_folder=True),
    ]).oid
    third = api.delete_file("build/jax-cpu/ops.py", repo, repo_type="kernel", commit_message="drop ops").oid
    assert sorted(api.list_repo_files(repo, repo_type="kernel")) == [
        ".gitattributes", "build/jax-cpu/metadata.json", "build/torch-cpu/metadata.json", "build/torch-cpu/ops.py"]
    # the older commit still has everything
    assert "build/torch-cuda/ops.py" in api.list_repo_files(repo, repo_type="kernel", revision=first)
    with pytest.raises(hf.errors.EntryNotFoundError):
        api.delete_file("build/torch-cuda/ops.py", repo, repo_type="kernel")
    with pytest.raises(hf.errors.EntryNotFoundError):
        api.delete_folder("nowhere", repo, repo_type="kernel")

    commits = api.list_repo_commits(repo, repo_type="kernel")
    assert [c.commit_id for c in commits[:3]] == [third, second, first]
    assert [c.title for c in commits] == ["drop ops", "1.0.1", "1.0.0", "initial commit"]
    assert commits[0].authors == ["kernel-hub"] and commits[0].created_at.tzinfo is not None
    formatted = api.list_repo_commits(repo, repo_type="kernel", revision=second, formatted=True)
    assert [c.commit_id for c in formatted] == [second, first, commits[-1].commit_id]
    assert formatted[0].formatted_title == "1.0.1"


def test_list_repo_commits_pages_through_a_long_history(server, api: HfApi) -> None:
    from kernel_hub.server import GitStore

    repo = "acme/history"
    api.create_repo(repo, repo_type="kernel")
    git = GitStore(server.store).get("kernel", repo)  # 55 commits straight into the store: fast
    oids = [git.commit_changes("main", f"c{i}", "", [("n.txt", git.add_blob(str(i).encode()))], [], [], None)[0]
            for i in range(55)]
    commits = api.list_repo_commits(repo, repo_type="kernel")  # 56 > one page of 50: follows the Link header
    assert [c.commit_id for c in commits[:55]] == oids[::-1]
    assert len(commits) == 56 and commits[-1].title == "initial commit"


# -- test hooks -----------------------------------------------------------------------------------

def test_test_hooks_need_the_read_token_when_reads_do(tmp_path: Path) -> None:
    with running_server(tmp_path / "store", token=TOKEN, read_token_required=True) as srv:
        for token, expected in ((None, 401), ("wrong", 401), (TOKEN, 200)):
            status, _, _ = _request(srv, "GET", "/_kernel_hub/stats", token=token)
            assert status == expected, token
        status, _, _ = _request(srv, "POST", "/_kernel_hub/faults", b'{"clear": true}', token=None)
        assert status == 401


def test_test_hooks_do_not_exist_without_the_flag(tmp_path: Path) -> None:
    with running_server(tmp_path / "store", token=TOKEN, test_hooks=False) as srv:
        for method, route in (("GET", "stats"), ("POST", "stats/reset"), ("POST", "faults")):
            status, _, _ = _request(srv, method, f"/_kernel_hub/{route}", b"{}" if method == "POST" else None)
            assert status == 404, route
        assert _request(srv, "GET", "/api/whoami-v2")[0] == 200  # the server itself answers


def test_the_request_log_is_bounded(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from tests.hub_server import hooked_app

    with TestClient(hooked_app(tmp_path / "store", token=TOKEN, request_log_size=5)) as client:
        for i in range(12):
            client.get(f"/api/kernels/acme/n{i}/refs")
        stats = client.get("/_kernel_hub/stats").json()
    assert stats["total"] == 12
    assert [path for _, path, _ in stats["requests"]] == [f"/api/kernels/acme/n{i}/refs" for i in range(7, 12)]


def test_tokens_are_compared_with_compare_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timing itself is noise on a shared machine: check every token goes through hmac.compare_digest,
    and that odd Authorization headers are a 401, never a 500."""
    import hmac

    from starlette.testclient import TestClient

    from kernel_hub.server import build_app

    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    with TestClient(build_app(tmp_path / "store", token=TOKEN)) as client:
        for auth, expected in ((f"Bearer {TOKEN}", 200), (f"bearer {TOKEN}", 200), (f"Bearer {TOKEN}x", 401),
                               (f"Bearer {TOKEN[:-1]}", 401), ("Bearer caf\xe9", 401), ("Basic abc", 401)):
            headers = {"Authorization": auth.encode("latin-1")}
            assert client.get("/api/whoami-v2", headers=headers).status_code == expected, auth
    assert (TOKEN.encode(), TOKEN.encode()) in seen and len(seen) == 5  # "Basic" never gets compared


def test_binary_files_round_trip(server, api: HfApi) -> None:
    data = bytes(range(256)) * 3
    oid = api.upload_file(path_or_fileobj=data, path_in_repo="bin/all.bin", repo_id=REPO, repo_type="kernel").oid
    status, _, body = _request(server, "GET", f"/kernels/{REPO}/resolve/{oid}/bin/all.bin", token=None)
    assert status == 200 and body == data


def test_concurrent_writers_lose_no_commit(server, api: HfApi) -> None:
    """Eight uploads at once, half of them the same content: every file lands, each in its own commit."""
    repo = "acme/concurrent"
    api.create_repo(repo, repo_type="kernel")
    errors: list[BaseException] = []

    def upload(i: int) -> None:
        try:
            api.upload_file(path_or_fileobj=f"same {i % 2}".encode(), path_in_repo=f"f{i}.txt", repo_id=repo,
                            repo_type="kernel", commit_message=f"f{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sorted(api.list_repo_files(repo, repo_type="kernel")) == [".gitattributes", *(f"f{i}.txt" for i in range(8))]
    assert len(api.list_repo_commits(repo, repo_type="kernel")) == 9
